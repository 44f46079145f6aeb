"""snapops diff: per-array changes between two snapshots (files or git revisions)."""

from __future__ import annotations

import os
import re
import sys

from snapops.formats.errors import ConfigError

from ._common import EXIT_INPUT, EXIT_VERIFY_FAILED, add_command, progress_bar
from ._paths import STDIO, check_output
from .review import (
    add_generation_options, add_limit_options, limits_from, rows_per_block, thresholds_from,
    threads,
)


def run(args) -> int:
    from snapops.hooks.review import (
        diff_git, diff_paths, plot_report, render_json, render_markdown, render_text,
    )

    if (args.git is None) == (len(args.files) != 2) or (args.git and args.files):
        print("snapops diff: give two files A B, or --git REV1 REV2 PATH", file=sys.stderr)
        return EXIT_INPUT
    check_outputs(args)
    target = generation_target(args)
    if target is not None:
        return run_generation(args, target)
    if args.manifest_only:
        print("snapops diff: --manifest-only compares generations (snapshots/<run>, two "
              "MANIFESTs, or two <run>/gen-N tags)", file=sys.stderr)
        return EXIT_INPUT
    with progress_bar("diff", enabled=args.format != "json") as progress:
        options = dict(threads=args.threads, rows_per_block=args.rows_per_block,
                       progress=progress, limits=limits_from(args))
        report = diff_git(*args.git, **options) if args.git else diff_paths(*args.files,
                                                                           **options)
    return _emit(args, report, (render_text, render_markdown, render_json),
                 lambda path: f"{plot_report(report, path, title=args.title)['arrays']} arrays",
                 report.changed)


def check_outputs(args) -> None:
    """UsageError, before anything is read, when --output or --plot would replace an input
    (a compared file, the work-tree file of --git's PATH, a compared generation's MANIFEST),
    each other, or cannot be written (a folder, a missing folder)."""
    inputs = list(args.git[2:] if args.git else args.files)
    inputs += [os.path.join(p, "MANIFEST") for p in inputs if os.path.isdir(p)]
    if args.output:
        check_output(args.output, inputs, what="report")
    if args.plot:
        check_output(args.plot, [*inputs, args.output], what="plot")


def _emit(args, report, renderers, plot, changed: bool) -> int:
    """Write the report as --format says (text, md, json renderers), draw --plot, and return
    the exit status (--exit-code: 1 when something changed)."""
    render_text, render_md, render_json = renderers
    if args.format == "md":
        text = render_md(report, title=args.title)
    else:
        text = (render_json if args.format == "json" else render_text)(report)
    if args.output and args.output != STDIO:
        from snapops.formats.atomic import atomic_write_bytes

        atomic_write_bytes(args.output, text.encode("utf-8"))
    else:
        sys.stdout.write(text)
    if args.plot:
        print(f"snapops diff: wrote {args.plot} ({plot(args.plot)})", file=sys.stderr)
    return EXIT_VERIFY_FAILED if args.exit_code and changed else 0


GEN_TAG = re.compile(r"(?P<run>[A-Za-z0-9][A-Za-z0-9_.-]{0,127})/gen-[0-9]{6,18}")


def generation_target(args):
    """What to review as generations: ("git", rev1, rev2, run), ("paths", a, b), or None
    for a file diff."""
    from snapops.hooks.review import generation_run

    if args.git:
        run = generation_run(args.git[2])
        return None if run is None else ("git", args.git[0], args.git[1], run)
    a, b = args.files
    if all(os.path.isdir(p) or os.path.basename(p) == "MANIFEST" for p in (a, b)):
        return ("paths", a, b)
    tags = [GEN_TAG.fullmatch(p) for p in (a, b)]
    if all(tags) and not any(os.path.exists(p) for p in (a, b)):
        runs = {m["run"] for m in tags}
        if len(runs) != 1:
            raise ConfigError(f"{a} and {b} are generations of different runs")
        return ("git", a, b, runs.pop())
    return None


def run_generation(args, target) -> int:
    from snapops.hooks.review import (
        plot_generation, render_generation_json, render_generation_markdown,
        render_generation_text, review_git, review_paths,
    )
    options = dict(thresholds=thresholds_from(args),
                   manifest_only=args.manifest_only, threads=args.threads)
    if target[0] == "git":
        review = review_git(*target[1:], **options)
    else:
        review = review_paths(*target[1:], **options)
    return _emit(args, review,
                 (render_generation_text, render_generation_markdown, render_generation_json),
                 lambda path: f"{plot_generation([review], path, title=args.title)['rows']} "
                              "tensors",
                 review.changed)


def register(sub) -> None:
    p = add_command(
        sub, "diff", help="per-array changes between two snapshots",
        description="Compare two snapshots of any supported formats (or one path at two git "
                    "revisions): added/removed arrays, dtype and shape changes, changed "
                    "row-blocks, max |delta|, relative L2 change ||B-A||/||A|| and cosine "
                    "similarity per array. WTXT chunks with equal SHA-256 are not decoded. "
                    "Generations (--git REV1 REV2 snapshots/<run>, two <run>/gen-N tags, two "
                    "snapshots/<run> folders or two MANIFESTs): one report for the whole "
                    "generation, original names, Anomalies first (NaN/Inf counts, norm ratio, "
                    "cosine, dtype/shape changes, added/removed), tensors by relative norm "
                    "change from the MANIFESTs' statistics, and block-level detail when the "
                    "shards are present. Does not verify (use snapops verify).",
        example="snapops diff --git main HEAD snapshots/run1 --format md --plot review.png",
        func=run)
    p.add_argument("files", nargs="*", metavar="A B", help="the two snapshot files")
    p.add_argument("--git", nargs=3, metavar=("REV1", "REV2", "PATH"),
                   help="compare PATH (relative to the current folder) at two revisions")
    p.add_argument("--format", choices=("text", "md", "json"), default="text",
                   help="text (default), md (a pull-request comment) or json")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the row-block heatmap")
    p.add_argument("--output", "-o", metavar="FILE",
                   help="write the report here (- or none: stdout); never over an input")
    p.add_argument("--title", help="title of the Markdown report and the plot")
    p.add_argument("--rows-per-block", type=rows_per_block, metavar="N",
                   help="rows per block (default: the WTXT chunk layout, else ~32 KiB)")
    p.add_argument("--threads", type=threads, default=2, metavar="N",
                   help="worker threads, 1..1024 (default 2)")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when the snapshots differ (like git diff --exit-code)")
    add_generation_options(p)
    add_limit_options(p)
