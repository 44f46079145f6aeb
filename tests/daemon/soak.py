"""SIGKILL soak: many kill/restart cycles of a real daemon, then a full check of the remote.

    .venv/bin/python -m tests.daemon.soak --cycles 200 [--seed 7] [--workdir DIR]

Each cycle starts the daemon, requests 1-3 generations (coalescing allowed), kills the daemon
with SIGKILL after a random delay, and goes on. At the end the daemon runs to completion and
every requested generation must be pushed exactly once or recorded as coalesced; every tag in
the remote verifies (shards, MANIFEST, ledger chain, signatures, HMACs, arrays bit for bit).
The suite runs 20 such cycles (test_service.py); this script runs as many as you like.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from snapops.daemon.lifecycle import DROPPED, PUSHED

from .daemon_env import DaemonEnv, state_for
from .gitserve import init_bare
from .test_service import pushed_counts, verify_remote


def soak(root: Path, cycles: int, seed: int, out=print) -> int:
    rng = random.Random(seed)
    bare = init_bare(root / "remote.git")
    env = DaemonEnv(root, {"origin": str(bare)})
    expected, gen = {}, 0
    start = time.monotonic()
    try:
        for cycle in range(cycles):
            env.start()
            with env.client(max_in_flight=2) as client:
                for _ in range(rng.randint(1, 3)):
                    gen += 1
                    expected[gen] = state_for(gen)
                    client.request(expected[gen], gen)
            time.sleep(rng.uniform(0.0, 1.5))
            env.kill()
            if (cycle + 1) % 10 == 0:
                out(f"cycle {cycle + 1}/{cycles}: {gen} generations requested, "
                    f"{time.monotonic() - start:.0f}s")
        env.start()
        env.wait(env.all_pushed, timeout=600, what="recovery")
        env.terminate()
    finally:
        env.kill()
    state = env.state()
    bad = [g for g in expected if not (state.gens[g].state == PUSHED or (
        state.gens[g].state == DROPPED and state.gens[g].fields.get("reason") == "coalesced"))]
    duplicates = {k: v for k, v in pushed_counts(env).items() if v != 1}
    tags = verify_remote(env, str(bare), root, expected)
    out(f"{cycles} SIGKILL cycles, {gen} generations: {len(tags)} pushed and verified, "
        f"{sum(s.state == DROPPED for s in state.gens.values())} coalesced, {len(bad)} lost, "
        f"{len(duplicates)} pushed more than once")
    return 0 if not bad and not duplicates else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", help="keep everything here (default: a temp folder)")
    args = parser.parse_args(argv)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        return soak(Path(args.workdir), args.cycles, args.seed)
    with tempfile.TemporaryDirectory(prefix="snapops-soak-") as tmp:
        return soak(Path(tmp), args.cycles, args.seed)


if __name__ == "__main__":
    sys.exit(main())
