"""snapops delta make / apply: DELTA v2 distribution of changed chunks."""

from __future__ import annotations

import os

from snapops.formats.errors import FormatError
from snapops.formats.wtxt.delta import apply_delta, make_delta

from ._common import EXIT_VERIFY_FAILED, add_command, add_group, file_progress, report_error, step
from ._paths import check_output


def _keys(args) -> dict:
    return {"hmac_key": args.hmac_key, "trusted_keys": args.trusted_key}


def _check_out(args, *inputs: str) -> None:
    check_output(args.out, [*inputs, args.hmac_key, *args.trusted_key])


# checks meaning a file or a key could not be used at all (missing, a folder, not a key):
# input errors (exit 2), as in verify
UNUSABLE_CHECKS = frozenset({"io", "keys"})


def _verification_failed(exc: FormatError) -> int:
    """Exit 1 for an input, delta or result that was read and failed a check of its content
    (checksum, grammar, signature, limit, the delta's base_sha256_all), as convert and verify
    do; a file or key that could not be used is re-raised (exit 2), and files that cannot be
    paired (DeltaMismatch, not a FormatError) stay usage errors too."""
    if exc.check in UNUSABLE_CHECKS:
        raise exc
    report_error(exc)
    return EXIT_VERIFY_FAILED


def run_make(args) -> int:
    _check_out(args, args.base, args.target)
    try:
        with file_progress(args.target, "delta make") as progress:
            stats = make_delta(args.base, args.target, args.out, **_keys(args))
            step(progress, os.path.getsize(args.target))
    except FormatError as exc:
        return _verification_failed(exc)
    share = stats.delta_bytes / stats.target_bytes * 100 if stats.target_bytes else 0.0
    print(f"wrote {args.out}: {stats.chunks_changed}/{stats.chunks_total} chunks changed in "
          f"{stats.arrays_carried} arrays, {stats.delta_bytes} bytes "
          f"({share:.2f}% of the target's {stats.target_bytes})")
    return 0


def run_apply(args) -> int:
    _check_out(args, args.base, args.delta)
    try:
        with file_progress(args.base, "delta apply") as progress:
            apply_delta(args.base, args.delta, args.out, **_keys(args))
            step(progress, os.path.getsize(args.base))
    except FormatError as exc:
        return _verification_failed(exc)
    print(f"wrote {args.out} (verified)")
    return 0


def _key_flags(parser) -> None:
    parser.add_argument("--hmac-key", help="HMAC key file used when verifying inputs and result")
    parser.add_argument("--trusted-key", action="append", default=[],
                        help="trusted Ed25519 public key (file or folder); repeatable")


def register(sub) -> None:
    p = add_group(sub, "delta", help="make or apply DELTA v2 files (changed chunks only)",
                  description="DELTA v2 carries only the chunks that changed between two "
                  "finalized WTXT snapshots with the same arrays and row "
                  "blocking.",
                  example="snapops delta make gen-000011.wtxt gen-000012.wtxt 11-to-12.wtxtdelta")
    dsub = p.add_subparsers(dest="delta_command", metavar="ACTION")
    make = add_command(
        dsub, "make", help="write the delta from BASE to TARGET",
        description="Verify BASE and TARGET, then write the changed chunks of TARGET into OUT. "
                    "Refused (write a full snapshot instead) when names, dtypes, shapes or row "
                    "blocking differ.",
        example="snapops delta make gen-000011.wtxt gen-000012.wtxt 11-to-12.wtxtdelta",
        func=run_make)
    make.add_argument("base", help="the older finalized WTXT snapshot")
    make.add_argument("target", help="the newer finalized WTXT snapshot")
    make.add_argument("out", help="the delta file to write (not one of the inputs)")
    _key_flags(make)
    apply = add_command(
        dsub, "apply", help="rebuild TARGET from BASE and a delta",
        description="Check that BASE is the delta's base (its sha256_all), splice the changed "
                    "chunks, and verify the result fully before it appears at OUT: the output "
                    "is byte-identical to the original target.",
        example="snapops delta apply gen-000011.wtxt 11-to-12.wtxtdelta gen-000012.wtxt",
        func=run_apply)
    apply.add_argument("base", help="the WTXT snapshot the delta was made from")
    apply.add_argument("delta", help="the delta file")
    apply.add_argument("out", help="the rebuilt WTXT snapshot to write (not one of the inputs)")
    _key_flags(apply)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
