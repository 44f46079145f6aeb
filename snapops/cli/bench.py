"""snapops bench: measure throughput and memory on this machine.

Every suite takes --size, --workdir and --json; the table below says what each one runs
(imported on use, so ``snapops --help`` stays fast) and which extra flags it has.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass, field

from ._common import add_command, parse_size


@dataclass(frozen=True)
class Suite:
    name: str
    help: str
    description: str
    example: str
    default_size: str
    runner: str                      # "module:function(args) -> result"
    renderer: str | None = None      # "module:function(result) -> str"; None: flat key: value
    flags: tuple = field(default_factory=tuple)  # (args, kwargs) for add_argument


def _wtxt(args):
    from snapops.bench.wtxt import run_wtxt

    return run_wtxt(args.size, args.workdir, row_blocking=not args.no_row_blocking,
                    threads=args.threads)


def _seal(args):
    from snapops.bench.seal import run_seal

    return run_seal(args.size, args.workdir)


def _pipeline(args):
    from snapops.bench.pipeline import run_pipeline

    return run_pipeline(args.size, args.steps, args.workdir, nice=args.nice, idle=args.idle,
                        outage=args.outage, interval=args.interval)


def _multirank(args):
    from snapops.bench.multirank import run_multirank

    return run_multirank(args.size, args.ranks, args.workdir)


def _formats(args):
    from snapops.bench.formats import FORMAT_BENCHES, run_formats

    return run_formats(args.size, args.format or list(FORMAT_BENCHES), args.workdir)


def _review(args):
    from snapops.bench.formats import run_review

    return run_review(args.size, args.workdir)


SUITES = [
    Suite("wtxt", "WTXT encode / verify / decode throughput",
          "Encode, verify and decode one model-like state; prints MB/s of raw array bytes and "
          "peak extra memory next to one hashlib SHA-256 pass.",
          "snapops bench wtxt --size 256MiB", "256MiB", "_wtxt",
          "snapops.bench.wtxt:render_wtxt",
          ((("--threads",), {"type": int, "default": 2, "help": "worker threads (default 2)"}),
           (("--no-row-blocking",), {"action": "store_true", "help": "32 KiB chunks instead"}))),
    Suite("seal", "delta size, age armor throughput, signature cost",
          "DELTA v2 size against the full file for 1% and 10% of rows changed in a row-blocked "
          "4096x1024 f32 matrix; age armor encrypt/decrypt MB/s (of --size bytes); Ed25519 "
          "sign/verify time for small and large states.",
          "snapops bench seal --size 256MiB", "256MiB", "_seal", "snapops.bench.seal:render_seal"),
    Suite("pipeline", "request() cost, loop slowdown, push latency, idle CPU, outage drain",
          "Runs a git daemon on 127.0.0.1 and a snapops daemon, then measures request() against "
          "one memcpy of the state, WAL append p99, a numpy training loop's slowdown when "
          "snapshotting every 10 steps and those snapshots' request-to-pushed time, the idle "
          "daemon's CPU share, the drain rate of the backlog an outage of the remote leaves "
          "against the push rate of one generation, and the daemon's peak memory.",
          "snapops bench pipeline --size 64MiB", "64MiB", "_pipeline",
          "snapops.bench.pipeline:render_pipeline",
          ((("--steps",), {"type": int, "default": 60,
                           "help": "training steps per loop (default 60)"}),
           (("--nice",), {"type": int, "help": "the daemon's niceness (default: config)"}),
           (("--idle",), {"type": float, "default": 60.0,
                          "help": "seconds to measure the idle daemon's CPU (0: skip)"}),
           (("--outage",), {"type": float, "default": 60.0,
                            "help": "seconds the remote is away (0: skip the drain test)"}),
           (("--interval",), {"type": float, "default": 5.0,
                              "help": "seconds between generations during the outage"}))),
    Suite("multirank", "per-rank request() stall, request-to-pushed for N ranks vs 1",
          "Runs a git daemon on 127.0.0.1 and a snapops daemon for 1 rank, then for --ranks "
          "ranks (each its own process holding --size bytes of a row-split state): each rank's "
          "request() against a memcpy of its part, and request-to-pushed of N ranks x --size "
          "against 1 rank x --size, in the same run.",
          "snapops bench multirank --size 64MiB --ranks 4", "64MiB", "_multirank",
          "snapops.bench.multirank:render_multirank",
          ((("--ranks",), {"type": int, "default": 4, "help": "ranks of the job (default 4)"}),)),
    Suite("formats", "AERO, FOLD, PyCauset and FINF write/open/verify throughput",
          "Each binary format's own benchmark on one state: write, open (mmap), read/verify "
          "throughput and metadata update time.",
          "snapops bench formats --size 1GiB --format aero --format fold", "1GiB", "_formats",
          None,
          ((("--format",), {"action": "append", "choices": ["aero", "fold", "pycauset", "finf"],
                            "help": "only these formats (repeatable; default all)"}),)),
    Suite("review", "pre-commit hook and snapops diff throughput",
          "Time `snapops hook pre-commit` on a staged WTXT of --size and `snapops diff` of two "
          "states of --size.",
          "snapops bench review --size 256MiB", "256MiB", "_review"),
]


def _run(suite: Suite, args) -> int:
    result = globals()[suite.runner](args)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    elif suite.renderer:
        module, function = suite.renderer.split(":")
        print(getattr(importlib.import_module(module), function)(result))
    else:
        from snapops.bench.formats import flatten

        print("\n".join(flatten(result)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure throughput and memory",
                       description="Benchmarks (numbers for the README, never test assertions).")
    bsub = p.add_subparsers(dest="bench_command", metavar="SUITE")
    for suite in SUITES:
        q = add_command(bsub, suite.name, help=suite.help, description=suite.description,
                        example=suite.example, func=lambda a, s=suite: _run(s, a))
        q.add_argument("--size", type=parse_size, default=parse_size(suite.default_size),
                       help=f"raw bytes of state (default {suite.default_size})")
        for flag_args, flag_kwargs in suite.flags:
            q.add_argument(*flag_args, **flag_kwargs)
        q.add_argument("--workdir", help="folder for temporary files (default: $TMPDIR)")
        q.add_argument("--json", action="store_true", help="the full result as JSON")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])
