"""The ``snapops`` command line: ``main(argv=None) -> int``.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module list
below is the only place that knows them all. Exit codes: 0 ok, 1 verification failed,
2 usage/input/config error, 130 interrupted. Every failure is one line on stderr, never a
traceback (``SNAPOPS_DEBUG=1`` re-raises an unexpected one, as the fuzzer does).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import signal
import sys
import threading
import time

from snapops import interrupted_at_start, runs_as_the_program
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
        if signal.getsignal(signal.SIGINT) is interrupted_at_start:
            signal.signal(signal.SIGINT, signal.default_int_handler)   # the command cleans up
        return int(args.func(args) or 0)
    except CommandFailed as exc:
        return exc.code
    except SnapopsError as exc:
        report_error(exc)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return interrupted()
    except BrokenPipeError:
        return 0
    except OSError as exc:           # a missing folder, a full disk, a permission
        where = f"{exc.filename}: " if exc.filename else ""
        report_error(f"{where}{exc.strerror or exc}")
        return EXIT_INPUT
    except Exception as exc:         # a bug, but still one line; SNAPOPS_DEBUG=1 shows where
        if isinstance(exc.__context__, KeyboardInterrupt):
            # raised by what the Ctrl-C interrupted (concurrent.futures' Condition.wait:
            # "cannot release un-acquired lock"): the interrupt is what happened
            return interrupted()
        if os.environ.get("SNAPOPS_DEBUG") == "1":
            raise
        report_error(f"internal error ({type(exc).__name__}: {exc}); please report it, "
                     "with SNAPOPS_DEBUG=1 for the traceback")
        return EXIT_INPUT
    finally:        # the command is over: a late Ctrl-C has nothing left to stop
        if runs_as_the_program(sys.argv, getattr(sys, "orig_argv", [])):
            signal.signal(signal.SIGINT, signal.SIG_IGN)


WEDGED_AFTER = 5.0     # seconds worker threads get to end after an interrupt


def interrupted() -> int:
    print("interrupted", file=sys.stderr)
    leave_if_wedged(EXIT_INTERRUPTED)
    return EXIT_INTERRUPTED


def leave_if_wedged(code: int, grace: float | None = None) -> None:
    """After an interrupt, end this program with ``code`` even when a worker thread cannot
    end: Python joins every non-daemon thread on its way out, and a Ctrl-C can leave a
    thread pool's lock taken (CPython raises KeyboardInterrupt just after a ``with lock:``
    took its lock, gh-74174), so the program would wait forever. Worker threads get
    ``grace`` seconds (default ``WEDGED_AFTER``; a second Ctrl-C ends the wait); any still
    running then, the exit hooks run (temporary folders go), the output is flushed and the
    process ends at once. Only where this process is the ``snapops`` program (a script
    calling ``main`` keeps its own threads)."""
    if not runs_as_the_program(sys.argv, getattr(sys, "orig_argv", [])):
        return
    grace = WEDGED_AFTER if grace is None else grace
    deadline = time.monotonic() + grace
    workers = [t for t in threading.enumerate()
               if t is not threading.current_thread() and not t.daemon]
    try:
        for thread in workers:
            thread.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:       # pressed again: wait no longer
        pass
    if not any(t.is_alive() for t in workers):
        return
    print(f"a worker thread did not end within {grace:g} s of the interrupt: leaving "
          "without it", file=sys.stderr)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
