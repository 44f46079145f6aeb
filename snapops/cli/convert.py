"""snapops convert: any supported format to any other (WTXT options included)."""

from __future__ import annotations


from snapops.formats.errors import FormatError
from snapops.formats.registry import detect, handler, handler_for_suffix

from ._common import add_command


def add_wtxt_options(parser) -> None:
    g = parser.add_argument_group("WTXT options")
    g.add_argument("--gen", type=int, default=0, help="generation number (default 0)")
    g.add_argument("--ts", help="UTC time YYYY-MM-DDTHH:MM:SSZ (default: $SOURCE_DATE_EPOCH or now; "
                   "give it for byte-identical output)")
    g.add_argument("--build", default="unknown", help="build/commit token (default unknown)")
    g.add_argument("--schema", default="weights/v1", help="schema token (default weights/v1)")
    g.add_argument("--host", default="cpu", help="host token (default cpu)")
    g.add_argument("--cuda", default="off", help="cuda token (default off)")
    g.add_argument("--merkle-prev", help="previous generation's merkle_this (64 hex)")
    g.add_argument("--row-blocking", action="store_true",
                   help="chunk on row boundaries (small, local git diffs)")
    g.add_argument("--rows-per-chunk", type=int, help="rows per chunk (implies --row-blocking)")
    g.add_argument("--hmac-key", help="HMAC key file (64 hex): authenticate every array")
    g.add_argument("--sign-key", help="Ed25519 private key (PKCS#8 PEM): add a sign line")
    g.add_argument("--streaming", action="store_true",
                   help="write root_pending and finalize in PATH.wsum")
    g.add_argument("--audit", help="audit line content, e.g. 'note=\"run 7\" loss=0.31'")
    g.add_argument("--map-names", action="store_true",
                   help="map '.' in array names to '__' (reversed on load with --map-names)")


def wtxt_options(args) -> dict:
    return {
        "gen": args.gen, "ts": args.ts, "build": args.build, "schema": args.schema,
        "host": args.host, "cuda": args.cuda, "merkle_prev": args.merkle_prev,
        "row_blocking": args.row_blocking, "rows_per_chunk": args.rows_per_chunk,
        "hmac_key": args.hmac_key, "sign_key": args.sign_key, "streaming": args.streaming,
        "audit": args.audit, "map_names": args.map_names,
    }


def parse_options(items: list[str]) -> dict:
    """``KEY=VALUE`` pairs for the target format's writer (true/false/none/ints/floats parsed)."""
    from snapops.formats.errors import DataError

    options = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise DataError(f"--option {item!r}: expected KEY=VALUE, e.g. checksum=true")
        lowered = value.lower()
        if lowered in ("true", "false"):
            options[key] = lowered == "true"
        elif lowered == "none":
            options[key] = None
        else:
            for cast in (int, float):
                try:
                    options[key] = cast(value)
                    break
                except ValueError:
                    continue
            else:
                options[key] = value
    return options


def run(args) -> int:
    source = detect(args.src)
    target = handler(args.to) if args.to else handler_for_suffix(args.dst)
    if target.save is None:
        raise FormatError(f"snapops cannot write {target.name}", path=args.dst)
    load_opts = {"unmap_names": True} if source.name == "wtxt" and args.map_names else {}
    snapshot = source.load(args.src, **load_opts)
    options = wtxt_options(args) if target.name == "wtxt" else {}
    options.update(parse_options(args.option))
    try:
        result = target.save(snapshot, args.dst, **options)
    except TypeError as exc:  # an option this format's writer does not take
        from snapops.formats.errors import DataError

        raise DataError(f"{target.name} writer: {exc}".replace("save() ", "")) from None
    root = getattr(result, "merkle_this", None)
    extra = f" merkle_this={root}" if root else ""
    print(f"wrote {args.dst} ({target.name}, {len(snapshot)} arrays, "
          f"{snapshot.nbytes} raw bytes){extra}")
    return 0


def register(sub) -> None:
    p = add_command(
        sub, "convert", help="convert between snapshot formats",
        description="Convert a snapshot (.npz, .safetensors, .wtxt, ...) to another format. "
                    "The output is written atomically; arrays are kept bit-exact or the "
                    "conversion is refused (e.g. a dtype the target cannot hold).",
        example="snapops convert state.npz state.wtxt --gen 12 --ts 2026-01-02T03:04:05Z "
                "--row-blocking --hmac-key keys/hmac.key --sign-key keys/signing.key",
        func=run)
    p.add_argument("src", help="input file")
    p.add_argument("dst", help="output file (format from its suffix unless --to)")
    p.add_argument("--to", help="output format name (wtxt, npz, safetensors, ...)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="writer option of the target format, e.g. checksum=true (FINF), "
                        "compression=zstd, ecc=rs(32) (FOLD), shard_max=1073741824 (AERO)")
    add_wtxt_options(p)
