"""snapops restore: one sealed generation from a repository or URL, verified, to one file."""

from __future__ import annotations

import contextlib
import signal
import sys
import time

from ._common import (EXIT_OK, EXIT_VERIFY_FAILED, add_command, add_key_options,
                      check_key_files, progress_bar)
from ._options import generation
from ._paths import check_output


def verify_fields(args) -> dict:
    return {"trusted_keys": args.trusted_key or None, "hmac_key": args.hmac_key,
            "require_signature": args.require_signature, "require_hmac": args.require_hmac,
            "identity": args.identity, "deep": args.deep, "lfs_url": args.lfs_url,
            "lfs_token_file": args.lfs_token_file, "lfs_cache": args.lfs_cache}


@contextlib.contextmanager
def terminated_as_interrupted():
    """SIGTERM ends the restore as Ctrl-C does, so the private repository (a whole fetched
    generation), the scratch copies and a half-written output are removed on the way out
    instead of left behind; the previous handler is back afterwards."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:          # not the main thread: the caller handles its signals
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run(args) -> int:
    with terminated_as_interrupted():
        return restore(args)


def restore(args) -> int:
    from snapops.formats.registry import handler_for_suffix
    from snapops.restore import RestoreFailed, latest_verified, load_generation

    # a suffix no writer takes or an unusable output path fails before minutes of fetching
    # and checking
    writer = handler_for_suffix(args.output)
    check_output(args.output, [args.repo, args.identity, args.hmac_key, args.lfs_token_file,
                               *args.trusted_key])
    check_key_files(args)
    start = time.perf_counter()
    fields = verify_fields(args)
    skipped: list[tuple[int, str]] = []
    try:
        # two bars: LFS objects as they download (a generation's chains come first, in one
        # go), then the generation's files as they are rebuilt and checked
        with progress_bar("lfs objects") as lfs_progress, progress_bar("restore") as progress:
            if args.latest_verified:
                snap, skipped = latest_verified(args.repo, args.run, verify=not args.no_verify,
                                                progress=progress, lfs_progress=lfs_progress,
                                                **fields)
            else:
                snap = load_generation(args.repo, args.run, gen=args.gen, rev=args.rev,
                                       verify=not args.no_verify, progress=progress,
                                       lfs_progress=lfs_progress, **fields)
    except RestoreFailed as exc:
        for gen, reason in exc.skipped:
            print(f"snapops restore: skipped gen {gen}: {reason}", file=sys.stderr)
        print(f"snapops restore: failed: {exc}", file=sys.stderr)
        return EXIT_VERIFY_FAILED
    for gen, reason in skipped:
        print(f"snapops restore: skipped gen {gen}: {reason}", file=sys.stderr)
    meta = snap.meta
    result = writer.save(snap, args.output, gen=meta["gen"], ts=meta["ts"], build=meta["build"])
    seconds = time.perf_counter() - start
    rate = snap.nbytes / seconds / 1e6 if seconds > 0 else 0.0
    checked = "not verified" if args.no_verify else "verified"
    fetched = f", {meta['lfs_fetched']} LFS object(s) fetched" if meta["lfs_fetched"] else ""
    print(f"restored run {meta['run']} gen {meta['gen']} ({checked}; {meta['source']}): "
          f"{len(snap.arrays)} arrays, {snap.nbytes} raw bytes{fetched} in {seconds:.2f} s "
          f"({rate:.1f} MB/s) -> {result.path} ({result.format}, {result.size} bytes)")
    return EXIT_OK


DESCRIPTION = (
    "Read generation N of run R (its tag R/gen-NNNNNN), the one at --rev, the newest on the "
    "default branch, or with --latest-verified the newest tag that verifies (each newer one "
    "skipped is named with its reason). REPO_OR_URL is a work tree, a bare repository or a URL "
    "(file://, git://, http(s)://, ssh://): from a URL only that commit is fetched (depth 1) "
    "into a private temporary repository (a file:// URL naming a repository on this machine, "
    "bare or a clone's top folder, is read in place, like its path). The generation is verified "
    "as a whole (seal, file set, every shard's SHA-256, ledger; --deep adds each format's own "
    "verification) before anything is written. OUT's suffix picks the writer (.safetensors, .pt,"
    " .npz, .wtxt, .aero, .fold, .pycauset, .finf); names and dtypes (bf16, f16...) are the "
    "original ones; the file is written atomically. A run in the Git LFS store (store=lfs) "
    "restores the same way: each shard is rebuilt from its keyframe and residual chain, and "
    "exactly those LFS objects are downloaded from --lfs-url (default: the tree's .lfsconfig, "
    "else <remote>[.git]/info/lfs) with the token in --lfs-token-file into --lfs-cache; from a "
    "URL the tags of the generations the chains start from and the default branch (its retention"
    " record) are fetched too, each at depth 1. A generation pruned by retention is refused with"
    " that reason (--latest-verified skips it). Exit 1 when the generation does not verify, 2 "
    "for bad input or an unreachable remote or LFS endpoint.")


def add_arguments(p) -> None:
    """The options of ``snapops restore`` (also those of its alias ``snapops lfs restore``)."""
    p.add_argument("repo", metavar="REPO_OR_URL", help="repository (work tree or bare) or URL")
    p.add_argument("--run", required=True, help="the run name")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--gen", type=generation, help="generation number (its tag RUN/gen-NNNNNN)")
    which.add_argument("--rev", help="a commit-ish (from a URL: a tag, a branch or a full id)")
    which.add_argument("--latest-verified", action="store_true",
                       help="the newest generation tag that verifies (of the newest 100)")
    p.add_argument("-o", "--output", "--out", dest="output", required=True, metavar="OUT",
                   help="output file; its suffix picks the format")
    add_key_options(p)
    p.add_argument("--identity", help="age identity file for encrypted shards")
    p.add_argument("--deep", action="store_true",
                   help="also run each shard format's own full verification")
    p.add_argument("--no-verify", action="store_true",
                   help="skip verification (reads the MANIFEST and shards as they are)")
    p.add_argument("--lfs-url", help="LFS endpoint for a store=lfs run (default: the tree's "
                                     ".lfsconfig, else derived from the remote URL)")
    p.add_argument("--lfs-token-file", help="bearer token file (one line) for the LFS endpoint")
    p.add_argument("--lfs-cache", help="LFS object cache folder, kept (default: a temporary "
                                       "folder removed afterwards)")


def register(sub) -> None:
    p = add_command(
        sub, "restore", help="restore a generation from a repository or URL into one file",
        description=DESCRIPTION,
        example="snapops restore git://host/snapshots.git --run exp-42 --gen 40 -o gen40.pt "
                "--trusted-key keys/ --hmac-key keys/hmac.key --require-signature "
                "--lfs-token-file keys/lfs-read.token",
        func=run)
    add_arguments(p)
