"""snapops inspect: header and per-array summary of a snapshot file."""

from __future__ import annotations

import json
import sys

from snapops.formats.errors import FormatError
from snapops.formats.registry import detect

from ._common import add_command


def run(args) -> int:
    chosen = detect(args.file)
    if chosen.inspect is None:
        raise FormatError(f"snapops cannot inspect {chosen.name} files", path=args.file)
    info = chosen.inspect(args.file)
    if args.json:
        json.dump(info, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    print(f"{info.get('path', args.file)}: {info.get('format', chosen.name)}")
    for key, value in (info.get("header") or {}).items():
        print(f"  {key}: {value}")
    for array in info.get("arrays", []):
        extras = " ".join(f"{k}={v}" for k, v in array.items()
                          if k not in ("name", "dtype", "shape"))
        shape = "x".join(str(d) for d in array.get("shape", [])) or "scalar"
        print(f"  {array['name']}: {array.get('dtype')} [{shape}] {extras}")
    return 0


def register(sub) -> None:
    p = add_command(
        sub, "inspect", help="show a snapshot's header and arrays",
        description="Print the header values and, per array, dtype, shape, size, chunking and "
                    "authentication, without decoding the data.",
        example="snapops inspect state.wtxt --json", func=run)
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="JSON on stdout")
