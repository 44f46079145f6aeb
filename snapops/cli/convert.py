"""snapops convert: any supported format to any other, with the target's typed options."""

from __future__ import annotations

from snapops.formats.contract import parse_option_texts
from snapops.formats.errors import FormatError
from snapops.formats.registry import detect, handler, handler_for_suffix, verify_any

from ._common import EXIT_VERIFY_FAILED, add_command, progress_bar, report_error, step
from ._paths import check_output
from .review import add_limit_options, limits_from

# flag dest -> writer option; only flags given on the command line are passed, so a flag the
# target format does not take is refused by its options class (naming the allowed ones)
WRITER_FLAGS = ("gen", "ts", "build", "schema", "host", "cuda", "merkle_prev", "row_blocking",
                "rows_per_chunk", "hmac_key", "sign_key", "streaming", "audit")


def add_writer_options(parser) -> None:
    g = parser.add_argument_group("writer options (--gen, --ts, --build: every format; the "
                                  "others: WTXT)")
    g.add_argument("--gen", type=int, help="generation number (default 0)")
    g.add_argument("--ts", help="UTC time YYYY-MM-DDTHH:MM:SSZ (default: $SOURCE_DATE_EPOCH or "
                   "now; give it for byte-identical output)")
    g.add_argument("--build", help="build/commit token (default unknown)")
    g.add_argument("--schema", help="schema token (default weights/v1)")
    g.add_argument("--host", help="host token (default cpu)")
    g.add_argument("--cuda", help="cuda token (default off)")
    g.add_argument("--merkle-prev", help="previous generation's merkle_this (64 hex)")
    g.add_argument("--row-blocking", action="store_true", default=None,
                   help="chunk on row boundaries (small, local git diffs)")
    g.add_argument("--rows-per-chunk", type=int, help="rows per chunk (implies --row-blocking)")
    g.add_argument("--hmac-key", help="HMAC key file (64 hex): authenticate every array")
    g.add_argument("--sign-key", help="Ed25519 private key (PKCS#8 PEM): add a sign line")
    g.add_argument("--streaming", action="store_true", default=None,
                   help="write root_pending and finalize in PATH.wsum")
    g.add_argument("--audit", help="audit line content, e.g. 'note=\"run 7\" loss=0.31'")


def writer_fields(args, target) -> dict:
    """The writer options given as flags and as ``--option KEY=VALUE`` (typed by field)."""
    fields = {k: getattr(args, k) for k in WRITER_FLAGS if getattr(args, k) is not None}
    fields.update(parse_option_texts(target.options_type, args.option or [],
                                     f"{target.name} writer"))
    return fields


def run(args) -> int:
    check_output(args.dst, [args.src, args.hmac_key, args.sign_key])
    source = detect(args.src)
    target = handler(args.to) if args.to else handler_for_suffix(args.dst)
    options = target.options(**writer_fields(args, target))
    limits = limits_from(args)
    # a reader that checks everything as it reads (WTXT, FOLD, npz) verifies in the same pass
    # that loads, so nothing can change between the check and the read
    checked_by_reader = source.load_verifies and not args.no_verify
    with progress_bar("convert", total=3, unit="step") as progress:
        if not args.no_verify and not checked_by_reader:
            report = verify_any(args.src, limits=limits)
            if report.failure is not None:
                report_error(report.failure)
                return EXIT_VERIFY_FAILED
        step(progress)
        try:
            snapshot = source.load(args.src, verify=checked_by_reader, limits=limits)
        except FormatError as exc:       # the input fails a check of its content: exit 1
            report_error(exc)
            return EXIT_VERIFY_FAILED
        step(progress)
        result = target.save(snapshot, args.dst, options)
        step(progress)
    extra = f" merkle_this={result.merkle_this}" if result.merkle_this else ""
    print(f"wrote {result.path} ({target.name}, {result.arrays} arrays, "
          f"{result.raw_bytes} raw bytes, sha256={result.sha256}){extra}")
    return 0


def register(sub) -> None:
    p = add_command(
        sub, "convert", help="convert between snapshot formats",
        description="Convert a snapshot (.npz, .safetensors, .pt, .wtxt, .aero, .fold, "
                    ".pycauset, .finf) to another format. The output is written atomically; "
                    "arrays keep their dtype, bits and names (a dtype the target does not "
                    "define is stored as the same-width unsigned integer and recorded in the "
                    "file's metadata) or the conversion is refused. The input is verified "
                    "first (every check of snapops verify: checksums, hashes, structure); a "
                    "corrupt input is refused (exit 1) and nothing is written.",
        example="snapops convert state.pt state.wtxt --gen 12 --ts 2026-01-02T03:04:05Z "
                "--row-blocking --hmac-key keys/hmac.key --sign-key keys/signing.key",
        func=run)
    p.add_argument("src", help="input file")
    p.add_argument("dst", help="output file (format from its suffix unless --to)")
    p.add_argument("--to", help="output format name (wtxt, aero, fold, pt, safetensors, ...)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="writer option of the target format, typed by its options class, e.g. "
                        "checksum=true (FINF), compression=none, ecc=rs(32) (FOLD), "
                        "shard_max=1073741824 (AERO)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip verifying the input (e.g. to salvage a damaged file whose "
                        "damage you know); the format's own read checks still apply")
    add_limit_options(p)
    add_writer_options(p)
