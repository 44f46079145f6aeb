"""age recipients and identities: parse a recipient, load recipients and identity files."""

from __future__ import annotations

import os
import re
from typing import Iterator

import pyrage

from ..errors import KeyMaterialError, looks_like_key_material, printable
from ..keys import read_key_file
from ._codec import is_armored


_KEY_TYPE = re.compile(r"(?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]{1,40}(?= )")


def _public_prefix(text: str) -> str:
    """The start of a public key line (age1..., ssh-...) for a message: enough to tell which
    key was meant, bounded and escaped (``repr`` escapes what ``printable`` does)."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _unsupported(text: str) -> str:
    """A line that is no recipient, as a message may show it: its key type when it names one
    (``'ssh-dss'``), nothing of it when it could be a secret (a recipients file is where an
    HMAC key or an identity ends up by mistake), else the line itself, bounded and escaped."""
    kind = _KEY_TYPE.match(text)
    if kind:
        return f"of key type {kind.group(0)!r}"
    if looks_like_key_material(text):
        return f"(looks like key material: {len(text)} characters, not shown)"
    return _public_prefix(text)


def parse_recipient(text: str):
    """A pyrage recipient from ``age1...`` or an ``ssh-ed25519``/``ssh-rsa`` public key line."""
    text = text.strip()
    if text.upper().startswith("AGE-SECRET-KEY-") or "PRIVATE KEY" in text:
        # Never echo it: this is a secret where a public key belongs.
        raise KeyMaterialError("a secret key was given as recipient; pass its public key "
                               "(age-keygen -y KEYFILE)")
    if text.startswith("age1"):
        kind = pyrage.x25519.Recipient
    elif text.startswith(("ssh-ed25519 ", "ssh-rsa ")):
        kind = pyrage.ssh.Recipient
    else:
        raise KeyMaterialError(f"unsupported recipient {_unsupported(text)}: expected an "
                               "age1... X25519 key or an ssh-ed25519/ssh-rsa public key line")
    try:
        return kind.from_str(text)
    except pyrage.RecipientError as exc:
        raise KeyMaterialError(f"invalid recipient {_public_prefix(text)}: "
                               f"{printable(exc)}") from exc


def _key_lines(path, what: str, data: bytes | None = None) -> Iterator[tuple[int, str]]:
    """Numbered lines of a small key file, without blanks and ``#`` comments."""
    data = read_key_file(path, what) if data is None else data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KeyMaterialError(f"{path}: {what} file is not UTF-8 text") from exc
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            yield number, line


def load_recipients(path: str | os.PathLike) -> list[str]:
    """Recipients from a file in the age recipients-file format (one per line, ``#`` comments)."""
    recipients = []
    for number, line in _key_lines(path, "recipients"):
        try:
            parse_recipient(line)
        except KeyMaterialError as exc:
            raise KeyMaterialError(f"{path}:{number}: {exc}") from exc
        recipients.append(line)
    if not recipients:
        raise KeyMaterialError(f"{path}: no recipients in file")
    return recipients


def load_identities(path: str | os.PathLike) -> list:
    """Identities from an age identity file (``AGE-SECRET-KEY-1...`` lines, ``#`` comments) or
    an unencrypted OpenSSH private key (ed25519 or rsa). Errors name the line, never the key.

    Example::

        load_identities("age.key")
        # -> [<pyrage.x25519.Identity ...>]
    """
    data = read_key_file(path, "identity")
    if is_armored(data):
        raise KeyMaterialError(f"{path}: passphrase-protected identity files are not supported")
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            return [pyrage.ssh.Identity.from_buffer(data)]
        except pyrage.IdentityError as exc:
            raise KeyMaterialError(f"{path}: unusable SSH private key: {exc}") from exc
    identities = []
    for number, line in _key_lines(path, "identity", data):
        if not line.startswith("AGE-SECRET-KEY-1"):
            raise KeyMaterialError(f"{path}:{number}: expected an age secret key "
                                   "(AGE-SECRET-KEY-1...); plugin identities are not supported")
        try:
            identities.append(pyrage.x25519.Identity.from_str(line))
        except pyrage.IdentityError as exc:
            raise KeyMaterialError(f"{path}:{number}: malformed age secret key") from exc
    if not identities:
        raise KeyMaterialError(f"{path}: no identities in file")
    return identities
