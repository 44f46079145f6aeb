"""snapops diff: per-array changes between two snapshots (files or git revisions)."""

from __future__ import annotations

import sys

from ._common import EXIT_INPUT, EXIT_VERIFY_FAILED, add_command, progress_bar
from .review import add_limit_options, limits_from


def run(args) -> int:
    from snapops.hooks.review import (
        diff_git, diff_paths, plot_report, render_json, render_markdown, render_text,
    )

    if (args.git is None) == (len(args.files) != 2) or (args.git and args.files):
        print("snapops diff: give two files A B, or --git REV1 REV2 PATH", file=sys.stderr)
        return EXIT_INPUT
    with progress_bar("diff", enabled=args.format != "json") as progress:
        options = dict(threads=args.threads, rows_per_block=args.rows_per_block,
                       progress=progress, limits=limits_from(args))
        report = diff_git(*args.git, **options) if args.git else diff_paths(*args.files,
                                                                           **options)
    if args.format == "md":
        text = render_markdown(report, title=args.title)
    elif args.format == "json":
        text = render_json(report)
    else:
        text = render_text(report)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    if args.plot:
        info = plot_report(report, args.plot, title=args.title)
        print(f"snapops diff: wrote {info['path']} ({info['arrays']} arrays)", file=sys.stderr)
    return EXIT_VERIFY_FAILED if args.exit_code and report.changed else 0


def register(sub) -> None:
    p = add_command(
        sub, "diff", help="per-array changes between two snapshots",
        description="Compare two snapshots of any supported formats (or one path at two git "
                    "revisions): added/removed arrays, dtype and shape changes, changed "
                    "row-blocks, max |delta|, relative L2 change ||B-A||/||A|| and cosine "
                    "similarity per array. WTXT chunks with equal SHA-256 are not decoded. "
                    "Does not verify the files (use snapops verify).",
        example="snapops diff --git main HEAD snapshots/run1/shard-0000.wtxt --format md "
                "--plot diff.png", func=run)
    p.add_argument("files", nargs="*", metavar="A B", help="the two snapshot files")
    p.add_argument("--git", nargs=3, metavar=("REV1", "REV2", "PATH"),
                   help="compare PATH (relative to the current folder) at two revisions")
    p.add_argument("--format", choices=("text", "md", "json"), default="text",
                   help="text (default), md (a pull-request comment) or json")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the row-block heatmap")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report here, not stdout")
    p.add_argument("--title", help="title of the Markdown report and the plot")
    p.add_argument("--rows-per-block", type=int, metavar="N",
                   help="rows per block (default: the WTXT chunk layout, else ~32 KiB)")
    p.add_argument("--threads", type=int, default=2, help="worker threads (default 2)")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when the snapshots differ (like git diff --exit-code)")
    add_limit_options(p)
