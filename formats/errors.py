"""The snapops error hierarchy.

Every parser raises only these (never KeyError, struct.error, UnicodeDecodeError...).
`FormatError` carries where the problem is and prints as ``file:line: expected X, got Y``.
"""

from __future__ import annotations

import re


class SnapopsError(Exception):
    """Root of every error snapops raises on purpose."""


class FormatError(SnapopsError, ValueError):
    """A file does not follow its format.

    ``check`` names the failed check (``grammar``, ``parity``, ``crc32c``, ``chunk_sha256``,
    ``array_sha256``, ``hmac``, ``sha256_all``, ``merkle``, ``fastxor``, ``signature``, ...).
    """

    check = "grammar"

    def __init__(
        self,
        message: str | None = None,
        *,
        path: str | None = None,
        line: int | None = None,
        offset: int | None = None,
        expected: str | None = None,
        got: object = None,
        array: str | None = None,
        chunk: int | None = None,
        check: str | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.offset = offset
        self.expected = expected
        self.got = got
        self.array = array
        self.chunk = chunk
        if check is not None:
            self.check = check
        super().__init__(str(self))

    def located(self, path: str) -> "FormatError":
        """Return self with ``path`` filled in (parsers often do not know the file name)."""
        if self.path is None:
            self.path = path
            self.args = (str(self),)
        return self

    def where(self) -> str:
        parts = [self.path or "<input>"]
        if self.line is not None:
            parts.append(str(self.line))
        elif self.offset is not None:
            parts.append(f"@{self.offset}")
        return ":".join(parts)

    def __str__(self) -> str:
        context = []
        if self.array is not None:
            context.append(f"array {self.array}")
        if self.chunk is not None:
            context.append(f"chunk {self.chunk}")
        prefix = f"{self.where()}: [{self.check}]"
        if context:
            prefix += " " + ", ".join(context) + ":"
        body = []
        if self.message:
            body.append(self.message)
        if self.expected is not None:
            got = self.got if isinstance(self.got, str) else repr(self.got)
            if len(got) > 120:
                got = got[:117] + "..."
            body.append(f"expected {self.expected}, got {got}")
        # path, message, got and array come from files and arguments an attacker may write
        return printable(f"{prefix} {'; '.join(body) or 'invalid'}")

    def to_dict(self) -> dict:
        return {
            "check": self.check,
            "path": self.path,
            "line": self.line,
            "offset": self.offset,
            "array": self.array,
            "chunk": self.chunk,
            "expected": self.expected,
            "got": None if self.got is None else str(self.got),
            "message": str(self),
        }


class TruncatedError(FormatError):
    """The input ended before the format said it would."""

    check = "truncated"


class LimitError(FormatError):
    """A declared size, count or depth exceeds what the format (or snapops) allows."""

    check = "limit"


class ChecksumError(FormatError):
    """Content does not match its stored hash, CRC, parity or MAC."""

    check = "checksum"


class SignatureError(FormatError):
    """A signature is missing, malformed, untrusted or does not verify."""

    check = "signature"


class UnsupportedVersionError(FormatError):
    """The file is of a version or variant snapops does not read."""

    check = "version"


class LedgerError(FormatError):
    """A ledger entry breaks the chain (order, gap, edit, merkle link) or an append is refused."""

    check = "ledger"


class DataError(SnapopsError, ValueError):
    """Input data cannot be written in the requested format (dtype, name, shape...)."""


class KeyMaterialError(SnapopsError, ValueError):
    """A key file is missing, malformed or of the wrong kind."""


class DecryptionError(SnapopsError, ValueError):
    """Ciphertext cannot be decrypted: no identity matches, wrong passphrase, failed
    authentication."""


class ConfigError(SnapopsError, ValueError):
    """Invalid configuration; the message names the key path."""


class UsageError(SnapopsError, ValueError):
    """A command cannot be carried out as given (an output that is one of its inputs, a folder
    that does not exist); raised before anything is read or written."""


class GitError(SnapopsError):
    """A Git operation failed."""


class PushError(GitError):
    """Pushing to a remote failed (the resend queue retries these)."""


class LfsError(GitError):
    """A Git LFS request failed or was refused (a server outage is retried like a git one)."""


def short_repr(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a message that quotes a bad argument.

    >>> short_repr("x" * 100)[-6:]
    'xxx...'
    """
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def printable(text: object) -> str:
    """``text`` safe to show on one terminal line: every character ``str.isprintable``
    refuses (C0 and C1 controls, DEL, line and paragraph separators, format characters such
    as bidi overrides, unassigned code points, lone surrogates) is written as ``repr`` writes
    it (``\\x1b``, ``\\n``, ``\\u202e``). Printable text, backslashes included, is left as
    it is, so a normal message prints unchanged and escaping twice changes nothing.

    >>> printable("evil\\x1b[2J\\nfake line")
    'evil\\\\x1b[2J\\\\nfake line'
    >>> printable(printable("a\\tb")) == printable("a\\tb") == "a\\\\tb"
    True
    >>> printable(b"x\\xff.wtxt".decode("utf-8", "surrogateescape"))
    'x\\\\xff.wtxt'
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def _escaped(char: str) -> str:
    """How :func:`printable` writes one character: a byte that was not UTF-8 (kept by
    ``surrogateescape`` as U+DC80..U+DCFF, as git paths and file names are) as that byte."""
    if "\udc80" <= char <= "\udcff":
        return f"\\x{ord(char) - 0xDC00:02x}"
    return repr(char)[1:-1]


_KEY_MARKERS = re.compile(r"(?i:SECRET[-_ ]KEY|PRIVATE KEY|-----BEGIN)|eyJ[A-Za-z0-9_-]{16,}\.")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]{32}")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
_SEPARATORS = re.compile(r"[+/=_-]")


def looks_like_key_material(text: str) -> bool:
    """True when ``text`` could hold a secret (an age identity, even cut, a PEM block, 32+ hex
    digits, a base64 or base32 run as keys and tokens are, a JWT): a message must then name
    where it came from, never repeat it. An odd path can look like this too, so callers only
    ask about text that is not an existing path.

    >>> looks_like_key_material("13b04f0db43fc1e779f4c8e5c1ae2e3612f3dae8c1f3d1cd00127f207c7d3574")
    True
    >>> looks_like_key_material("/tmp/pytest-of-root/pytest-537/test_identity_format0/hmac.key")
    False
    """
    if _KEY_MARKERS.search(text) or _HEX_RUN.search(text):
        return True
    return any(_encoded(run) for run in _BASE64_RUN.findall(text))


def _encoded(run: str) -> bool:
    """A run of the base64 alphabet that reads as encoded bytes, not as a path: letters and
    digits mixed, in long stretches (a path splits into short words at / _ -)."""
    if not (any(c.isdigit() for c in run) and any(c.isalpha() for c in run)):
        return False
    stretches = len(_SEPARATORS.findall(run.rstrip("="))) + 1
    return len(run) / stretches >= 8
