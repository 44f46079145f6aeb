"""Helpers shared by the CLI commands: exit codes, error printing, parsers for sizes."""

from __future__ import annotations

import argparse
import re
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


def report_error(exc: BaseException) -> None:
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


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_size(text: str) -> int:
    """'256MiB' -> 268435456, '1.5GB' -> 1500000000, '4096' -> 4096."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 256MiB or 1GB)")
    unit = (match.group(2) or "").lower().rstrip("b")
    return int(float(match.group(1)) * _UNITS[unit])
