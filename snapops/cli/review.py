"""snapops review setup: configure git's diff drivers for snapshot review."""

from __future__ import annotations

import sys

from ._common import add_command, add_group, parse_size


def add_limit_options(parser) -> None:
    """Bounds on what a reviewed file may declare (textconv runs on untrusted content)."""
    from snapops.formats.limits import DEFAULT_LIMITS

    parser.add_argument("--max-array-bytes", type=parse_size, metavar="SIZE",
                        default=DEFAULT_LIMITS.max_bytes,
                        help="refuse arrays declaring more bytes (default 64GiB)")
    parser.add_argument("--max-expansion", type=float, metavar="RATIO",
                        default=DEFAULT_LIMITS.max_expansion,
                        help="refuse compressed members (.npz) over 64MiB expanding more than "
                             "RATIO times (default 100)")


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


def register(sub) -> None:
    p = add_group(sub, "review", help="set up git for weight-diff review",
                  description="Git integration of snapops diff/textconv.",
                  example="snapops review setup .")
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
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])
