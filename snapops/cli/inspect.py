"""snapops inspect: header and per-array summary of a snapshot file (any format)."""

from __future__ import annotations

import json
import sys
from typing import Any, Mapping

from snapops.formats.contract import render_inspect
from snapops.formats.errors import printable
from snapops.formats.registry import detect

from ._common import add_command


def run(args) -> int:
    info = detect(args.file).inspect(args.file)
    if args.json:
        # json escapes control characters itself (\u001b), so names stay exact there
        json.dump(info, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(render_inspect(escaped_info(info)))
    return 0


def escaped_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """``info`` with every text it shows escaped (:func:`printable`): array names, header
    values and the path come from the file or the command line, and a newline or a terminal
    escape in them would forge lines or take over the terminal."""
    shown = {key: _shown(value) for key, value in info.items()
             if key not in ("header", "arrays", "notes")}
    shown["header"] = {printable(k): _shown(v) for k, v in (info.get("header") or {}).items()}
    shown["arrays"] = [_escaped_row(row) for row in info.get("arrays", [])]
    shown["notes"] = [printable(note) for note in info.get("notes", [])]
    return shown


def _escaped_row(row: Mapping[str, Any]) -> dict[str, Any]:
    escaped = {printable(k): _shown(v) for k, v in row.items() if k != "shape"}
    if "shape" in row:
        escaped["shape"] = [_shown(d) for d in row["shape"]]
    return escaped


def _shown(value: Any) -> Any:
    """Numbers as they are (render_inspect formats them), anything else as escaped text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return printable(value)


def register(sub) -> None:
    p = add_command(
        sub, "inspect", help="show a snapshot's header and arrays",
        description="Print the header values and, per array, dtype (spelled one way for every "
                    "format: f32, bf16, i64, bool...), shape, size and the format's own "
                    "columns (chunking, authentication, offsets), without decoding the data.",
        example="snapops inspect state.wtxt --json", func=run)
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="JSON on stdout")
