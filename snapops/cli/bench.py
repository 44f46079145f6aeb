"""snapops bench: measure throughput and memory on this machine.

Every suite takes --size, --workdir and --json; suite NAME is ``snapops.bench.NAME``'s
``run_NAME(size, workdir, **flags) -> dict`` and ``render_NAME(result) -> str`` (imported on
use, so ``snapops --help`` stays fast); the table below adds its help and extra flags.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

from snapops.formats.errors import UsageError

from ._common import add_command, add_group, parse_size, progress_bar, work_folder
from ._options import integer_in, number_in, size_at_least, worker_threads

# the smallest weights the suites build (model_state): one 1024-column float32 row (its bias
# vector and a step scalar come on top)
MIN_STATE = 4 << 10


@dataclass(frozen=True)
class Suite:
    name: str
    help: str
    description: str
    example: str
    default_size: str
    flags: tuple = field(default_factory=tuple)  # (args, kwargs) for add_argument; dest = kwarg
    min_size: tuple[int, str] = (MIN_STATE, "one 1024-column float32 row")


DAY = 86400.0               # longest wait a bench option may ask for, in seconds
_ROUNDS = (("--rounds",), {"type": integer_in(1), "default": 3,
                           "help": "timed rounds after one warm-up round (default 3)"})

SUITES = [
    Suite("wtxt", "WTXT plain and sealed encode / verify / load next to one SHA-256 pass",
          "Save (plain, and sealed with an HMAC key and a signing key), verify (without keys, "
          "and with the HMAC key and trusted key), load, and one hashlib SHA-256 pass over the "
          "same model-like state, interleaved round by round; prints MB/s of raw array bytes, "
          "the ratio to the SHA-256 pass, CPU seconds and peak extra memory.",
          "snapops bench wtxt --size 256MiB --rounds 3", "256MiB",
          ((("--threads",), {"type": worker_threads, "default": 2,
                              "help": "worker threads, 1..1024 (default 2)"}),
           (("--no-row-blocking",), {"action": "store_false", "dest": "row_blocking",
                                     "help": "32 KiB chunks instead of row blocks"}),
           _ROUNDS)),
    Suite("seal", "delta size, age armor throughput, signature cost",
          "DELTA v2 size against the full file for 1% and 10% of rows changed in a row-blocked "
          "4096x1024 f32 matrix; age armor encrypt/decrypt MB/s (of --size bytes); Ed25519 "
          "sign/verify time for small and large states.",
          "snapops bench seal --size 256MiB", "256MiB"),
    Suite("pipeline", "request() cost, loop slowdown, push latency, idle CPU, outage drain",
          "Runs a git daemon on 127.0.0.1 and a snapops daemon, then measures request() against "
          "one memcpy of the state, WAL append p99, a numpy training loop's slowdown when "
          "snapshotting every 10 steps and those snapshots' request-to-pushed time, the idle "
          "daemon's CPU share, the drain rate of the backlog an outage of the remote leaves "
          "against the push rate of one generation, and the daemon's peak memory. With --store "
          "lfs the daemon writes AERO shards as keyframes and residuals to a giftless on "
          "127.0.0.1 (as `snapops bench storage` does).",
          "snapops bench pipeline --size 64MiB --store lfs --idle 0 --outage 0", "64MiB",
          ((("--steps",), {"type": integer_in(10), "default": 60,
                           "help": "training steps per loop, a snapshot every 10 (at least "
                                   "10; default 60)"}),
           (("--nice",), {"type": integer_in(0, 19),
                          "help": "the daemon's niceness, 0..19 (default: config)"}),
           (("--idle",), {"type": number_in(0, DAY), "default": 60.0,
                          "help": "seconds to measure the idle daemon's CPU (0: skip)"}),
           (("--outage",), {"type": number_in(0, DAY), "default": 60.0,
                            "help": "seconds the remote is away (0: skip the drain test)"}),
           (("--interval",), {"type": number_in(0, DAY, above=True), "default": 5.0,
                              "help": "seconds between generations during the outage"}),
           (("--rounds",), {"type": integer_in(1), "default": 3,
                            "help": "plain and snapshotting training runs, alternated "
                                    "(default 3 each; more for a steadier median)"}),
           (("--store",), {"choices": ["git", "lfs"], "default": "git",
                           "help": "git (WTXT in the tree, the default) or lfs (AERO keyframes "
                                   "and residuals on a local giftless)"}))),
    Suite("multirank", "per-rank request() stall, request-to-pushed for N ranks vs 1",
          "Runs a git daemon on 127.0.0.1 and a snapops daemon for 1 rank, then for --ranks "
          "ranks (each its own process holding --size bytes of a row-split state): each rank's "
          "request() against a memcpy of its part, and request-to-pushed of N ranks x --size "
          "against 1 rank x --size, in the same run.",
          "snapops bench multirank --size 64MiB --ranks 4 --format aero", "64MiB",
          ((("--ranks",), {"type": integer_in(1, 256), "default": 4,
                            "help": "ranks of the job, each a process, 1..256 (default 4)"}),
           (("--format",), {"dest": "fmt", "default": "wtxt",
                            "choices": ["wtxt", "aero", "fold", "pycauset", "finf"],
                            "help": "the run's snapshot format (default wtxt)"}),
           (("--store",), {"choices": ["git", "lfs"], "default": "git",
                           "help": "git (shards in the tree, the default) or lfs (keyframes and "
                                   "residuals on a local giftless)"}))),
    Suite("formats", "AERO, FOLD, PyCauset and FINF write/open/verify throughput",
          "Each binary format on the same model-like state: write, open (mmap), read/verify "
          "throughput and metadata update time.",
          "snapops bench formats --size 1GiB --format aero --format fold", "1GiB",
          ((("--format",), {"action": "append", "dest": "names",
                            "choices": ["aero", "fold", "pycauset", "finf"],
                            "help": "only these formats (repeatable; default all)"}),)),
    Suite("review", "pre-commit hook and snapops diff throughput",
          "Time `snapops hook pre-commit` on a staged, signed and HMAC'd WTXT of --size (work "
          "tree and blob paths, next to `snapops verify` and CLI start-up), and `snapops diff` "
          "of two states of --size (1% of rows changed, every value changed, two .npz). "
          "With --manifest-only: the generation review of two MANIFESTs of --tensors tensors "
          "(no weights read) next to parsing one MANIFEST, the PNG, and the CLI process.",
          "snapops bench review --manifest-only --tensors 1000", "256MiB",
          ((("--threads",), {"type": worker_threads, "default": 2,
                             "help": "diff worker threads, 1..1024 (default 2)"}),
           (("--manifest-only",), {"action": "store_true",
                                   "help": "time the review of two generations from their "
                                           "MANIFESTs alone"}),
           (("--tensors",), {"type": integer_in(1, 10 ** 6), "default": 1000,
                             "help": "tensors per generation with --manifest-only "
                                     "(default 1000)"}),
           (("--rounds",), {"type": integer_in(1),
                            "help": "timed rounds, best kept (default 5 with "
                                    "--manifest-only, else 3 per hook process)"}))),
    Suite("restore", "restore of a sealed generation from a local remote",
          "One signed, HMAC'd generation of --size raw bytes in a bare remote, restored with "
          "snapops.load_generation (verified: seal, file set, every shard's arrays against their "
          "sealed BLAKE3 content digest, ledger; "
          "arrays with their dtypes) to memory and to .safetensors, and once from file:// "
          "(a bare repository on this machine: read in place); next to git cat-file of the "
          "shards, one SHA-256 pass and one memcpy of the same bytes in the same run.",
          "snapops bench restore --size 1GiB --format aero", "1GiB",
          ((("--format",), {"action": "append", "dest": "names", "choices": ["wtxt", "aero"],
                            "help": "only these formats (repeatable; default both)"}),
           (("--rounds",), {"type": integer_in(1), "default": 2,
                            "help": "timed rounds after one warm-up round (default 2)"}))),
    Suite("machine", "this machine's floors: hashing, new memory, page cache and disk",
          "SHA-256 (one core and two threads) and BLAKE3 (one core) of --size bytes; a copy "
          "into memory touched before against the first touch of new memory; a file written "
          "through the page cache and fsync'd against O_DIRECT, and read uncached and cached. "
          "Every other suite's targets stand on these numbers.",
          "snapops bench machine --size 256MiB", "256MiB", (_ROUNDS,),
          (1, "rounded up to one 4 MiB block")),
    Suite("storage", "git vs LFS store: bytes stored per generation, push, clone, restore",
          "A real daemon writes --gens generations of a --size state (dense f32, dense bf16, "
          "1%-rows sparse f32) into a bare remote, with store = git (WTXT) and store = lfs "
          "(AERO; keyframes + residuals to a giftless on 127.0.0.1) in the same run: bytes "
          "stored and their growth per generation against the raw bytes, request-to-pushed, "
          "fresh clone, and restore of the newest generation (MB/s of raw bytes). With "
          "--workdir the folders holding everything stored are kept.",
          "snapops bench storage --size 128MiB --gens 30 --json", "128MiB",
          ((("--gens",), {"type": integer_in(1), "default": 30,
                           "help": "generations (default 30)"}),
           (("--regime",), {"action": "append", "dest": "regimes",
                            "choices": ["dense_f32", "dense_bf16", "sparse_f32"],
                            "help": "only these regimes (repeatable; default all)"}),
           (("--store",), {"action": "append", "dest": "stores", "choices": ["git", "lfs"],
                           "help": "only these stores (repeatable; default both)"}),
           (("--keyframe-every",), {"type": integer_in(1), "default": 8, "metavar": "K",
                                    "help": "the LFS store's keyframe_every (default 8): a "
                                            "restore applies at most K-1 residuals"}))),
]


def _dest(flag_args: tuple, flag_kwargs: dict) -> str:
    return flag_kwargs.get("dest") or flag_args[0].lstrip("-").replace("-", "_")


def available_memory() -> int:
    """Bytes this machine can still give a process without swapping (MemAvailable), else
    its physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_room(size: int, copies: int, workdir: str | None) -> None:
    """UsageError when ``copies`` states of ``size`` bytes (each rank holds one) cannot fit
    in this machine's available memory, or one in the free space of the work folder: the
    suite would grow until the kernel kills it, or fill the disk, instead of measuring."""
    from snapops.bench._measure import fmt_bytes

    folder = workdir or tempfile.gettempdir()
    memory, disk = available_memory(), shutil.disk_usage(folder).free
    if size * copies > memory:
        held = f"{copies} ranks x --size" if copies > 1 else "--size"
        raise UsageError(f"--size {fmt_bytes(size)}: the bench holds {held} in memory, more "
                         f"than this machine has available ({fmt_bytes(memory)})")
    if size > disk:
        raise UsageError(f"--size {fmt_bytes(size)}: the bench writes its state to {folder}, "
                         f"more than its free space ({fmt_bytes(disk)}; --workdir picks "
                         "another folder)")


def _run(suite: Suite, args) -> int:
    check_room(args.size, getattr(args, "ranks", 1), args.workdir)
    options = {dest: getattr(args, dest)
               for dest in (_dest(*flag) for flag in suite.flags)}
    from snapops.bench._measure import reporting_to

    module = importlib.import_module(f"snapops.bench.{suite.name}")
    with progress_bar(f"bench {suite.name}", unit="op", enabled=not args.json) as update, \
            reporting_to(update):
        result = getattr(module, f"run_{suite.name}")(size=args.size, workdir=args.workdir,
                                                      **options)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(getattr(module, f"render_{suite.name}")(result))
    return 0


def register(sub) -> None:
    p = add_group(sub, "bench", help="measure throughput and memory",
                  description="Benchmarks (numbers for the README, never test assertions).",
                  example="snapops bench wtxt --size 64MiB --json")
    bsub = p.add_subparsers(dest="bench_command", metavar="SUITE")
    for suite in SUITES:
        q = add_command(bsub, suite.name, help=suite.help, description=suite.description,
                        example=suite.example, func=lambda a, s=suite: _run(s, a))
        q.add_argument("--size", type=size_at_least(*suite.min_size),
                       default=parse_size(suite.default_size),
                       help=f"raw bytes of state, at least {suite.min_size[0]} "
                            f"(default {suite.default_size})")
        for flag_args, flag_kwargs in suite.flags:
            q.add_argument(*flag_args, **flag_kwargs)
        q.add_argument("--workdir", type=work_folder,
                       help="folder for temporary files, created if missing (default: $TMPDIR)")
        q.add_argument("--json", action="store_true", help="the full result as JSON")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])
