"""The ``snapops`` command line: ``main(argv=None) -> int``.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module list
below is the only place that knows them all. Exit codes: 0 ok, 1 verification failed,
2 usage/input/config error, 130 interrupted. Every failure is one line on stderr, never a
traceback (``SNAPOPS_DEBUG=1`` re-raises an unexpected one, as the fuzzer does).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from snapops.formats.errors import SnapopsError

from ._common import EXIT_INPUT, EXIT_INTERRUPTED, CommandFailed, report_error

COMMAND_MODULES = [
    "convert",
    "verify",
    "inspect",
    "keys",
    "bench",
    "encrypt",
    "decrypt",
    "demo",
    "delta",
    "daemon",
    "ledger",
    "finf",
    "hooks",
    "hook",
    "diff",
    "textconv",
    "review",
    "restore",
    "lfs",
]
# commands registered by a module of another name
OTHER_COMMANDS = {"request": "daemon"}


def command_module(command: str | None) -> str | None:
    """The module that registers ``command`` (None: not a command)."""
    return command if command in COMMAND_MODULES else OTHER_COMMANDS.get(command or "")


def build_parser(command: str | None = None, *, commands: bool = True) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone (its module is the only one
    imported: a hook or a daemon starts 0.2 s sooner than with all of them), or of none
    (``commands=False``: the top-level options only, for ``snapops --version``)."""
    parser = argparse.ArgumentParser(
        prog="snapops",
        description="Safe, verifiable, Git-reviewable weight snapshots for ML training runs.",
        epilog="example: snapops convert state.npz state.wtxt --gen 1 --row-blocking",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from snapops import __version__

    parser.add_argument("--version", action="version", version=f"snapops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    module = command_module(command)
    for name in ([module] if module else COMMAND_MODULES) if commands else []:
        importlib.import_module(f"snapops.cli.{name}").register(sub)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The command ``argv`` names (the first word not an option: the top level takes no
    option with a value), or None (``--help``, ``--version``, nothing, a typo)."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if command_module(first) else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(named_command(argv), commands=argv[:1] != ["--version"])
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    try:
        return int(args.func(args) or 0)
    except CommandFailed as exc:
        return exc.code
    except SnapopsError as exc:
        report_error(exc)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except OSError as exc:           # a missing folder, a full disk, a permission
        where = f"{exc.filename}: " if exc.filename else ""
        report_error(f"{where}{exc.strerror or exc}")
        return EXIT_INPUT
    except Exception as exc:         # a bug, but still one line; SNAPOPS_DEBUG=1 shows where
        if os.environ.get("SNAPOPS_DEBUG") == "1":
            raise
        report_error(f"internal error ({type(exc).__name__}: {exc}); please report it, "
                     "with SNAPOPS_DEBUG=1 for the traceback")
        return EXIT_INPUT
