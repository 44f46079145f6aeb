"""snapops review setup (git's diff drivers for snapshot review) and snapops review pr (the
pull-request comment: verification, one review per changed generation, the heatmap)."""

from __future__ import annotations

import sys

from ._common import add_command, add_group, add_key_options, parse_size
from ._options import expansion_ratio, integer_in, number_in, worker_threads
from ._paths import check_output_folder

MAX_ROWS_PER_BLOCK = 1 << 30

# argparse types of the review options: a value out of range is a usage error (exit 2)
threads = worker_threads
rows_per_block = integer_in(1, MAX_ROWS_PER_BLOCK)
ratio_threshold = number_in(1, above=True)      # x and 1/x: at 1 every tensor is an anomaly
cosine_threshold = number_in(-1, 1)


def add_limit_options(parser) -> None:
    """Bounds on what a reviewed file may declare (textconv runs on untrusted content)."""
    from snapops.formats.limits import DEFAULT_LIMITS

    parser.add_argument("--max-array-bytes", type=parse_size, metavar="SIZE",
                        default=DEFAULT_LIMITS.max_bytes,
                        help="refuse arrays declaring more bytes (default 64GiB)")
    parser.add_argument("--max-expansion", type=expansion_ratio, metavar="RATIO",
                        default=DEFAULT_LIMITS.max_expansion,
                        help="refuse compressed members (.npz) over 64MiB expanding more than "
                             "RATIO times (default 100)")


def add_generation_options(parser) -> None:
    """Options of a generation review (snapops diff of generations, snapops review pr)."""
    g = parser.add_argument_group("generations")
    g.add_argument("--manifest-only", action="store_true",
                   help="compare the MANIFESTs' statistics only, read no weights (automatic "
                        "when the shards are absent: LFS pointers, not fetched, encrypted)")
    g.add_argument("--ratio-threshold", type=ratio_threshold, metavar="X",
                   help="anomaly when a tensor's norm grows beyond X times or shrinks below "
                        "1/X, X > 1 (default 10)")
    g.add_argument("--cosine-threshold", type=cosine_threshold, metavar="C",
                   help="anomaly when cosine(A, B) < C, C in -1..1, weights read "
                        "(default 0.9)")


def thresholds_from(args):
    from snapops.hooks.review.generation import Thresholds

    given = {k: v for k, v in (("ratio", args.ratio_threshold),
                               ("cosine", args.cosine_threshold)) if v is not None}
    return Thresholds(**given)


def limits_from(args):
    from snapops.formats.limits import DeclaredLimits

    return DeclaredLimits(max_bytes=args.max_array_bytes, max_expansion=args.max_expansion)


def run_setup(args) -> int:
    from snapops.hooks.review import setup_repo

    pairs = setup_repo(args.repo, command=args.command, attributes=args.attributes)
    for key, value in pairs:
        print(f"git config {key} {value!r}")
    if args.attributes:
        print("updated .gitattributes", file=sys.stderr)
    return 0


def run_pr(args) -> int:
    from snapops.hooks.gitio import Git
    from snapops.hooks.review.pr import review_pull_request

    from .verify import ci_config

    check_output_folder(args.out, what="comment.md and review.png")
    result = review_pull_request(
        args.repo, args.base, args.head, args.out, cfg=ci_config(Git(args.repo), args),
        thresholds=thresholds_from(args), manifest_only=args.manifest_only,
        image_url=args.image_url, details_url=args.details_url, threads=args.threads)
    runs = ", ".join(result.runs) or "no run changed"
    print(f"snapops review pr: wrote {result.comment}"
          + (f" and {result.image}" if result.image else "") + f" ({runs})", file=sys.stderr)
    for problem in result.problems:
        print(f"snapops review pr: {problem}", file=sys.stderr)
    return 0 if result.ok else 1


def register(sub) -> None:
    p = add_group(sub, "review", help="weight-diff review in git and pull requests",
                  description="Git integration of snapops diff/textconv, and the pull-request "
                              "comment.",
                  example="snapops review pr --base origin/main --head HEAD --out review/")
    rsub = p.add_subparsers(dest="review_command", metavar="ACTION")
    s = add_command(
        rsub, "setup", help="configure the textconv and WTXT diff drivers in a repository",
        description="Set diff.snapops.textconv (binary formats shown through snapops "
                    "textconv, cached), and diff.wtxt.xfuncname (hunk headers of WTXT diffs "
                    "name the array) in the repository's local git config. With --attributes, "
                    "also add the missing patterns to its .gitattributes.",
        example="snapops review setup ~/snapshot-repo --attributes", func=run_setup)
    s.add_argument("repo", nargs="?", default=".", help="repository (default: current folder)")
    s.add_argument("--attributes", action="store_true",
                   help="append missing snapshot patterns to REPO/.gitattributes")
    s.add_argument("--command", help="textconv command (default: snapops textconv)")
    r = add_command(
        rsub, "pr", help="verify a pull request's generations, write its comment and heatmap",
        description="For CI on a pull request: verify every commit of BASE..HEAD as the hooks "
                    "do (snapops verify --ci --range), review each run whose generation "
                    "changed (its generation at the merge base against HEAD: anomalies first, "
                    "tensors by relative norm change, block-level detail when the shards are "
                    "present), and write OUT/comment.md (one comment body, starting with the "
                    "marker <!-- snapops-review --> so the workflow updates one comment) and "
                    "OUT/review.png. Exit 1 when verification or a review failed (the body "
                    "says why); posting the comment is left to the workflow (deploy/ci/).",
        example="snapops review pr --base origin/main --head HEAD --out snapops-review "
                "--trusted-key keys/signing.pub --require-signature", func=run_pr)
    r.add_argument("--repo", default=".", help="repository (default: current folder)")
    r.add_argument("--base", required=True, help="the pull request's base revision")
    r.add_argument("--head", default="HEAD", help="the pull request's head (default HEAD)")
    r.add_argument("--out", required=True, metavar="DIR",
                   help="folder for comment.md and review.png (created if needed)")
    r.add_argument("--image-url", metavar="URL", help="embed the heatmap from this URL")
    r.add_argument("--details-url", metavar="URL",
                   help="link to the CI run (where review.png is an artifact)")
    r.add_argument("--threads", type=threads, default=2, metavar="N",
                   help="worker threads, 1..1024 (default 2)")
    add_key_options(r)
    add_generation_options(r)
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])
