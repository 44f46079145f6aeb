"""snapops inspect: header and per-array summary of a snapshot file (any format)."""

from __future__ import annotations

import json
import sys

from snapops.formats.contract import render_inspect
from snapops.formats.registry import detect

from ._common import add_command


def run(args) -> int:
    info = detect(args.file).inspect(args.file)
    if args.json:
        json.dump(info, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(render_inspect(info))
    return 0


def register(sub) -> None:
    p = add_command(
        sub, "inspect", help="show a snapshot's header and arrays",
        description="Print the header values and, per array, dtype (spelled one way for every "
                    "format: f32, bf16, i64, bool...), shape, size and the format's own "
                    "columns (chunking, authentication, offsets), without decoding the data.",
        example="snapops inspect state.wtxt --json", func=run)
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="JSON on stdout")
