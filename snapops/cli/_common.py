"""Helpers shared by the CLI commands: exit codes, error printing, parsers for sizes."""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_VERIFY_FAILED = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130


class CommandFailed(Exception):
    """Raised by a command that already printed its diagnostics; carries the exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def report_error(exc: BaseException | str) -> None:
    print(f"snapops: error: {exc}", file=sys.stderr)


def add_command(sub, name: str, *, help: str, description: str, example: str, func):
    """Add a subcommand whose ``--help`` ends with an example."""
    parser = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=func)
    return parser


def parse_size(text: str) -> int:
    """argparse type for sizes: '256MiB' -> 268435456, '32M' -> 32000000 (the config's
    parser, :func:`snapops.config.sizes.parse_size`)."""
    from snapops.config.sizes import parse_size as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
