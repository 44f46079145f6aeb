"""snapops textconv: readable, deterministic text of a snapshot (git's textconv driver)."""

from __future__ import annotations

import sys

from ._common import add_command
from .review import add_limit_options, limits_from, rows_per_block


def run(args) -> int:
    from snapops.hooks.review import textconv

    textconv(args.file, sys.stdout, rows_per_block=args.rows_per_block,
             limits=limits_from(args))
    sys.stdout.flush()
    return 0


def register(sub) -> None:
    p = add_command(
        sub, "textconv", help="print a snapshot as diffable text (git textconv)",
        description="Print the header or metadata, then per array its name, dtype and shape "
                    "and one line per row-block (sha256, min, max, mean), so that git diff of "
                    "binary snapshot formats shows which row-blocks changed. Configure with "
                    "`snapops review setup` (git config diff.snapops.textconv).",
        example="git config diff.snapops.textconv 'snapops textconv'  # or: snapops review setup",
        func=run)
    p.add_argument("file")
    p.add_argument("--rows-per-block", type=rows_per_block, metavar="N",
                   help="rows per block (default: the WTXT chunk layout, else ~32 KiB)")
    add_limit_options(p)
