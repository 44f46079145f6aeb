"""``snapops encrypt``: encrypt a file to age recipients or a passphrase, ASCII armored."""

from __future__ import annotations

import os

from snapops.formats import armor
from snapops.formats.errors import KeyMaterialError

from ._common import EXIT_INPUT, EXIT_OK, add_command, file_progress, report_error
from ._paths import check_output


def register(sub) -> None:
    parser = add_command(
        sub, "encrypt",
        help="encrypt a file with age (ASCII armored)",
        description="Encrypt IN to OUT as an ASCII-armored age file that `age -d` can read. "
                    "OUT appears atomically; `-` means stdin/stdout.",
        example="snapops encrypt state.wtxt state.wtxt.age --recipient age1ql3z7hjy54pw3hyww5a"
                "yyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p",
        func=run,
    )
    parser.add_argument("input", metavar="IN", help="file to encrypt (- for stdin)")
    parser.add_argument("output", metavar="OUT", help="armored output (- for stdout)")
    parser.add_argument("-r", "--recipient", action="append", default=[], metavar="R",
                        help="age1... key or 'ssh-ed25519 AAAA...' line; repeatable")
    parser.add_argument("-R", "--recipients-file", action="append", default=[], metavar="FILE",
                        help="file of recipients, one per line, # comments; repeatable")
    parser.add_argument("--passphrase-env", metavar="VAR",
                        help="encrypt with the passphrase in environment variable VAR instead "
                             "(whole input held in memory)")


def passphrase_from_env(var: str | None) -> str | None:
    """The passphrase in environment variable ``var`` (None when no variable is named)."""
    if var is None:
        return None
    value = os.environ.get(var)
    if not value:
        raise KeyMaterialError(f"environment variable {var} is not set or empty")
    return value


def run(args) -> int:
    check_output(args.output, [args.input, *args.recipients_file])
    passphrase = passphrase_from_env(args.passphrase_env)
    recipients = list(args.recipient)
    for path in args.recipients_file:
        recipients += armor.load_recipients(path)
    if passphrase is None and not recipients:
        raise KeyMaterialError("give --recipient, --recipients-file or --passphrase-env")
    try:
        with file_progress(args.input, "encrypt") as progress:
            armor.encrypt_file(args.input, args.output, recipients, passphrase=passphrase,
                               progress=progress)
    except BrokenPipeError:
        raise
    except OSError as exc:
        report_error(f"{exc.filename or args.input}: {exc.strerror or exc}")
        return EXIT_INPUT
    return EXIT_OK
