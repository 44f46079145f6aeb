"""snapops bench: measure throughput and memory on this machine."""

from __future__ import annotations

import json
import sys

from ._common import add_command, parse_size


def run_wtxt(args) -> int:
    from snapops.bench.wtxt import render_wtxt, run_wtxt

    result = run_wtxt(args.size, args.workdir, row_blocking=not args.no_row_blocking,
                      threads=args.threads)
    print(json.dumps(result, indent=2) if args.json else render_wtxt(result))
    return 0


def run_seal(args) -> int:
    from snapops.bench.seal import render_seal, run_seal

    result = run_seal(args.size, args.workdir)
    print(json.dumps(result, indent=2) if args.json else render_seal(result))
    return 0


def run_pipeline(args) -> int:
    from snapops.bench.pipeline import render_pipeline, run_pipeline

    result = run_pipeline(args.size, args.steps, args.workdir)
    print(json.dumps(result, indent=2) if args.json else render_pipeline(result))
    return 0


def run_formats(args) -> int:
    from snapops.bench.formats import FORMAT_BENCHES, flatten, run_formats

    names = args.format or list(FORMAT_BENCHES)
    result = run_formats(args.size, names, args.workdir)
    print(json.dumps(result, indent=2, default=str) if args.json else "\n".join(flatten(result)))
    return 0


def run_review(args) -> int:
    from snapops.bench.formats import flatten, run_review

    result = run_review(args.size, args.workdir)
    print(json.dumps(result, indent=2, default=str) if args.json else "\n".join(flatten(result)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure throughput and memory",
                       description="Benchmarks (numbers for the README, never test assertions).")
    bsub = p.add_subparsers(dest="bench_command", metavar="SUITE")
    w = add_command(
        bsub, "wtxt", help="WTXT encode / verify / decode throughput",
        description="Encode, verify and decode one model-like state; prints MB/s of raw array "
                    "bytes and peak extra memory next to one hashlib SHA-256 pass.",
        example="snapops bench wtxt --size 256MiB", func=run_wtxt)
    w.add_argument("--size", type=parse_size, default=parse_size("256MiB"),
                   help="raw bytes of state (default 256MiB)")
    w.add_argument("--workdir", help="folder for the temporary file (default: $TMPDIR)")
    w.add_argument("--threads", type=int, default=2, help="worker threads (default 2)")
    w.add_argument("--no-row-blocking", action="store_true", help="32 KiB chunks instead")
    w.add_argument("--json", action="store_true")
    s = add_command(
        bsub, "seal", help="delta size, age armor throughput, signature cost",
        description="DELTA v2 size against the full file for 1% and 10% of rows changed in a "
                    "row-blocked 4096x1024 f32 matrix; age armor encrypt/decrypt MB/s; Ed25519 "
                    "sign/verify time for small and large states.",
        example="snapops bench seal --size 256MiB", func=run_seal)
    s.add_argument("--size", type=parse_size, default=parse_size("256MiB"),
                   help="bytes for the armor benchmark (default 256MiB)")
    s.add_argument("--workdir", help="folder for temporary files")
    s.add_argument("--json", action="store_true")
    pl = add_command(
        bsub, "pipeline", help="request() cost, WAL latency, loop slowdown, push latency",
        description="Runs a git daemon on 127.0.0.1 and a snapops daemon, then measures "
                    "request() against one memcpy of the state, WAL append p99, a numpy training "
                    "loop's slowdown when snapshotting every 10 steps, request-to-pushed latency "
                    "and the daemon's peak memory.",
        example="snapops bench pipeline --size 64MiB", func=run_pipeline)
    pl.add_argument("--size", type=parse_size, default=parse_size("64MiB"),
                    help="raw bytes of state (default 64MiB)")
    pl.add_argument("--steps", type=int, default=60, help="training steps per loop (default 60)")
    pl.add_argument("--workdir", help="folder for temporary files")
    pl.add_argument("--json", action="store_true")
    fm = add_command(
        bsub, "formats", help="AERO, FOLD, PyCauset and FINF write/open/verify throughput",
        description="Each binary format's own benchmark on one state: write, open (mmap), "
                    "read/verify throughput and metadata update time.",
        example="snapops bench formats --size 1GiB --format aero --format fold", func=run_formats)
    fm.add_argument("--size", type=parse_size, default=parse_size("1GiB"),
                    help="raw bytes of state (default 1GiB)")
    fm.add_argument("--format", action="append", choices=["aero", "fold", "pycauset", "finf"],
                    help="only these formats (repeatable; default all)")
    fm.add_argument("--workdir", help="folder for temporary files")
    fm.add_argument("--json", action="store_true")
    rv = add_command(
        bsub, "review", help="pre-commit hook and snapops diff throughput",
        description="Time `snapops hook pre-commit` on a staged WTXT of --size and `snapops diff` "
                    "of two states of --size.",
        example="snapops bench review --size 256MiB", func=run_review)
    rv.add_argument("--size", type=parse_size, default=parse_size("256MiB"),
                    help="raw bytes of state (default 256MiB)")
    rv.add_argument("--workdir", help="folder for temporary files")
    rv.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])
