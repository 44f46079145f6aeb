"""Long fuzzing runs: ``python -m tests.fuzz --minutes N [--seed S] [--out DIR]``.

Prints the progress every batch round and, at the end, cases, cases/s and findings per
target; each finding's input is saved under DIR/TARGET/ with a JSON report (traceback and
the ``--replay`` command that runs the case again in-process).

Example::

    nice python -m tests.fuzz --minutes 30 --seed 1 --out /tmp/fuzz
    python -m tests.fuzz --replay cli-convert 4711 --seed 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .engine import replay, run_campaign
from .targets import ALL_TARGETS, TARGETS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0],
                                epilog="example: nice python -m tests.fuzz --minutes 30 --seed 1")
    p.add_argument("--minutes", type=float, default=1.0, help="how long to run (default 1)")
    p.add_argument("--cases", type=int, help="stop after this many cases per target instead")
    p.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    p.add_argument("--out", default="fuzz-findings", help="where findings' inputs go")
    p.add_argument("--target", action="append", choices=sorted(ALL_TARGETS),
                   help="only these targets (repeatable; default: all but the canaries)")
    p.add_argument("--timeout", type=int, default=10, help="seconds per case (default 10)")
    p.add_argument("--memory", type=int, default=1024, help="MiB per case above the imports")
    p.add_argument("--replay", nargs=2, metavar=("TARGET", "INDEX"),
                   help="run one case in this process and show its traceback")
    args = p.parse_args(argv)
    if args.replay:
        replay(args.replay[0], int(args.replay[1]), args.seed)
        return 0
    last = [0.0]

    def progress(campaign, elapsed: float) -> None:
        if elapsed - last[0] >= 30:
            last[0] = elapsed
            print(f"[{time.strftime('%H:%M:%S')}] {campaign.cases} cases, "
                  f"{campaign.cases / elapsed:.1f}/s, {len(campaign.findings())} findings",
                  file=sys.stderr, flush=True)

    campaign = run_campaign(seed=args.seed, out=Path(args.out), targets=args.target or
                            list(TARGETS), cases_per_target=args.cases,
                            minutes=None if args.cases else args.minutes,
                            timeout=args.timeout, memory=args.memory << 20, progress=progress)
    print(campaign.summary())
    return 1 if campaign.findings() else 0


if __name__ == "__main__":
    sys.exit(main())
