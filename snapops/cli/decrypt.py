"""``snapops decrypt``: decrypt an age file (armored or binary) with identities or a passphrase."""

from __future__ import annotations

from snapops.formats import armor
from snapops.formats.errors import KeyMaterialError

from ._common import EXIT_INPUT, EXIT_OK, add_command, file_progress, report_error
from ._paths import check_output
from .encrypt import passphrase_from_env


def register(sub) -> None:
    parser = add_command(
        sub, "decrypt",
        help="decrypt an age file",
        description="Decrypt IN (ASCII-armored or binary age) to OUT. OUT appears atomically "
                    "with mode 0600, and only if the whole file authenticates; `-` means "
                    "stdin/stdout (stdout may receive a prefix before an error is found).",
        example="snapops decrypt state.wtxt.age state.wtxt --identity ~/.config/snapops/age.key",
        func=run,
    )
    parser.add_argument("input", metavar="IN", help="age file (- for stdin)")
    parser.add_argument("output", metavar="OUT", help="plaintext output (- for stdout)")
    parser.add_argument("-i", "--identity", action="append", default=[], metavar="FILE",
                        help="age identity file (AGE-SECRET-KEY-1...) or OpenSSH private key; "
                             "repeatable")
    parser.add_argument("--passphrase-env", metavar="VAR",
                        help="decrypt with the passphrase in environment variable VAR instead")


def run(args) -> int:
    check_output(args.output, [args.input, *args.identity])
    passphrase = passphrase_from_env(args.passphrase_env)
    if passphrase is None and not args.identity:
        raise KeyMaterialError("give --identity or --passphrase-env")
    try:
        with file_progress(args.input, "decrypt") as progress:
            armor.decrypt_file(args.input, args.output, args.identity or None,
                               passphrase=passphrase, progress=progress)
    except BrokenPipeError:
        raise
    except OSError as exc:
        report_error(f"{exc.filename or args.input}: {exc.strerror or exc}")
        return EXIT_INPUT
    return EXIT_OK
