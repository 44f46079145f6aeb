"""Helpers shared by the CLI commands: exit codes, error printing, parsers for sizes,
progress bars."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Callable, Iterator

from snapops.formats.errors import printable

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
    """One line on stderr; control characters from files or names are escaped, so a message
    cannot move the cursor, recolour the terminal or forge a line."""
    print(f"snapops: error: {printable(exc)}", file=sys.stderr)


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


def add_group(sub, name: str, *, help: str, description: str, example: str):
    """Add a command that only holds actions (``snapops daemon run``...); its ``--help`` lists
    them and ends with an example too."""
    return sub.add_parser(name, help=help, description=description,
                          epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_key_options(parser) -> None:
    """The verification keys flags shared by ``verify`` and ``restore``."""
    parser.add_argument("--hmac-key", help="HMAC key file: check every HMAC")
    parser.add_argument("--trusted-key", action="append", default=[],
                        help="trusted Ed25519 public key (PEM file, or a folder of *.pub); "
                             "repeatable")
    parser.add_argument("--require-signature", action="store_true",
                        help="fail unless signed by a trusted key")
    parser.add_argument("--require-hmac", action="store_true",
                        help="fail unless authenticated with --hmac-key")


def check_key_files(args) -> None:
    """Read every key file the flags name (``add_key_options``, and ``--identity`` where a
    command has it) before verifying anything, so a missing or malformed key is a usage error
    (exit 2) and not a failed check of each file."""
    from snapops.formats.keys import load_hmac_key, load_trusted_keys

    if args.hmac_key:
        load_hmac_key(args.hmac_key)
    if args.trusted_key:
        load_trusted_keys(args.trusted_key)
    if getattr(args, "identity", None):
        from snapops.formats.armor import load_identities

        load_identities(args.identity)


def parse_size(text: str) -> int:
    """argparse type for sizes: '256MiB' -> 268435456, '32M' -> 32000000 (the config's
    parser, :func:`snapops.config.sizes.parse_size`)."""
    from snapops.config.sizes import parse_size as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def work_folder(text: str) -> str:
    """argparse type for ``--workdir``: the folder, created (with its parents) when missing;
    a path that is not a folder, or cannot be made one, is a usage error."""
    try:
        os.makedirs(text, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{text}: cannot create the folder ({exc.strerror or exc})") from None
    return text


@contextlib.contextmanager
def progress_bar(label: str, total: int | None = None, *, unit: str = "B",
                 enabled: bool = True) -> Iterator[Callable[[int], object] | None]:
    """A tqdm counter on stderr, only when stderr is a terminal and ``enabled`` (commands
    pass ``not args.json``); yields its ``update``, or None when nothing is drawn."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, unit_scale=unit == "B", desc=label, file=sys.stderr,
              leave=False) as bar:
        yield bar.update


def file_progress(path: str, label: str) -> contextlib.AbstractContextManager:
    """A byte counter over the regular file ``path`` (none for ``-`` or a pipe)."""
    if path == "-" or not os.path.isfile(path):
        return contextlib.nullcontext()
    return progress_bar(label, os.path.getsize(path))


def step(update: Callable[[int], object] | None, amount: int = 1) -> None:
    """Advance a bar from :func:`progress_bar` (no-op when none is drawn)."""
    if update is not None:
        update(amount)
