"""Streaming age encryption through pyrage in bounded memory: the :class:`_Source` / :class:`_Sink`
adapters, ``encrypt_io`` / ``decrypt_io`` on file objects, and ``encrypt_file`` / ``decrypt_file``
with ``-`` for stdin/stdout and atomic output files.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import BinaryIO, Callable, Iterator, Sequence

import pyrage

from ..atomic import atomic_write
from ..errors import DecryptionError, FormatError, KeyMaterialError, LimitError, SnapopsError
from ._codec import (
    BEGIN, BLOCK_BYTES, MAX_WHITESPACE, TEXT_BLOCK, ArmorDecoder, ArmorEncoder, is_armored,
)
from ._header import (
    MAGIC, MAX_WORK_FACTOR, check_header_size, check_start, check_work_factors,
)
from ._keys import load_identities, parse_recipient

MAX_PASSPHRASE_BYTES = 256 * 1024 * 1024

Progress = Callable[[int], None]


class _Source:
    """What pyrage reads: big blocks pulled from ``raw`` (through an ArmorDecoder if given),
    served in pyrage's small reads. Keeps the first exception so it can be re-raised typed,
    since pyrage flattens it into a string."""

    def __init__(self, raw: BinaryIO, decoder: ArmorDecoder | None = None, *, head: bytes = b"",
                 progress: Progress | None = None) -> None:
        self._raw, self._decoder, self._head, self._progress = raw, decoder, head, progress
        self._data, self._off, self._eof = b"", 0, False
        self.error: BaseException | None = None

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (``-1``: what is buffered, at most one block); b"" at the end."""
        if self._off >= len(self._data):
            self._refill()
        end = len(self._data) if n is None or n < 0 else self._off + n
        chunk = self._data[self._off:end]
        self._off += len(chunk)
        return chunk

    def unread(self, data: bytes) -> None:
        """Serve ``data`` again before what is left (a header read ahead to check it)."""
        self._data, self._off = data + self._data[self._off:], 0

    def _refill(self) -> None:
        if self.error is not None:
            raise self.error
        try:
            while self._off >= len(self._data) and not self._eof:
                self._fill()
        except BaseException as exc:
            self.error = exc
            raise

    def _fill(self) -> None:
        raw, self._head = self._head or self._raw.read(TEXT_BLOCK), b""
        if raw and self._progress is not None:
            self._progress(len(raw))
        if not raw:
            self._eof = True
        decoder = self._decoder
        if decoder is None:
            self._data = bytes(raw)
        else:
            self._data = decoder.feed(raw) if raw else decoder.finish()
        self._off = 0


class _Sink:
    """What pyrage writes to: coalesces its small writes into blocks (through an ArmorEncoder
    if given) and keeps the first exception, like :class:`_Source`."""

    def __init__(self, raw: BinaryIO, encoder: ArmorEncoder | None = None) -> None:
        self._raw, self._encoder = raw, encoder
        self._parts: list[bytes] = []
        self._size = 0
        self.error: BaseException | None = None

    def write(self, data) -> int:
        if self.error is not None:
            raise self.error
        try:
            if self._encoder is not None:
                text = self._encoder.feed(data)
                if text:
                    self._raw.write(text)
            else:
                self._coalesce(data)
        except BaseException as exc:
            self.error = exc
            raise
        return len(data)

    def flush(self) -> None:
        """pyrage may call this mid-stream; blocks are written when full or at :meth:`finish`."""

    def _coalesce(self, data) -> None:
        self._parts.append(data if type(data) is bytes else bytes(data))
        self._size += len(data)
        if self._size >= BLOCK_BYTES:
            self._raw.write(b"".join(self._parts))
            self._parts.clear()
            self._size = 0

    def finish(self) -> None:
        if self._encoder is not None:
            self._raw.write(self._encoder.finish())
        else:
            self._raw.write(b"".join(self._parts))
            self._parts.clear()
        self._raw.flush()


def _run_pyrage(call, source: _Source, sink: _Sink, keys: list, describe) -> None:
    """Run a pyrage streaming call; re-raise our own IO errors typed, map pyrage's via describe."""
    try:
        call(source, sink, keys)
    except (pyrage.EncryptError, pyrage.DecryptError, OSError) as exc:
        for adapter in (source, sink):
            if adapter.error is not None:
                raise adapter.error from None
        raise describe(exc) from exc


def encrypt_io(reader: BinaryIO, writer: BinaryIO, recipients: Sequence[str] = (), *,
               passphrase: str | None = None, progress: Progress | None = None,
               max_passphrase_bytes: int = MAX_PASSPHRASE_BYTES) -> None:
    """Encrypt ``reader`` to armored age on ``writer``, in bounded memory.

    ``recipients``: ``age1...`` strings and ``ssh-ed25519 ...`` lines; or ``passphrase`` alone
    (held in memory, see the module docstring). ``progress`` receives input byte counts.

    Example::

        with open("w.wtxt", "rb") as src, open("w.wtxt.age", "wb") as dst:
            encrypt_io(src, dst, ["age1..."])
    """
    if passphrase is not None:
        _check_passphrase(passphrase, recipients)
        plaintext = _read_bounded(_Source(reader, progress=progress), max_passphrase_bytes,
                                  "<input>")
        sink = _Sink(writer, ArmorEncoder())
        ciphertext = memoryview(pyrage.passphrase.encrypt(plaintext, passphrase))
        for start in range(0, len(ciphertext), BLOCK_BYTES):
            sink.write(ciphertext[start:start + BLOCK_BYTES])
        sink.finish()
        return
    keys = _recipient_keys(recipients)
    source, sink = _Source(reader, progress=progress), _Sink(writer, ArmorEncoder())
    _run_pyrage(pyrage.encrypt_io, source, sink, keys,
                lambda exc: SnapopsError(f"encryption failed: {exc}"))
    sink.finish()


def decrypt_io(reader: BinaryIO, writer: BinaryIO, identities: Sequence = (), *,
               passphrase: str | None = None, name: str = "<input>",
               progress: Progress | None = None,
               max_passphrase_bytes: int = MAX_PASSPHRASE_BYTES,
               max_work_factor: int = MAX_WORK_FACTOR) -> None:
    """Decrypt armored (or binary) age from ``reader`` to ``writer``, in bounded memory.

    ``identities`` come from :func:`load_identities`; or give ``passphrase`` alone. Raises
    FormatError/TruncatedError for bad armor or header, LimitError for a header over 64 KiB or
    an scrypt work factor over ``max_work_factor``, and DecryptionError for a wrong key or
    passphrase or a damaged payload; ``name`` labels the input in messages. ``writer`` may
    already hold part of the plaintext when an error is raised: :func:`decrypt_file` hides it
    atomically.

    Example::

        with open("w.wtxt.age", "rb") as src, open("w.wtxt", "wb") as dst:
            decrypt_io(src, dst, load_identities("age.key"))
    """
    if passphrase is not None:
        _check_passphrase(passphrase, identities)
        source = _ciphertext_source(reader, name, progress)
        _check_header(source, name, max_work_factor)
        slack = max_passphrase_bytes // 4096 + 4096  # per-chunk tags and header
        ciphertext = _read_bounded(source, max_passphrase_bytes + slack, name)
        try:
            plaintext = pyrage.passphrase.decrypt(ciphertext, passphrase)
        except (pyrage.DecryptError, OSError) as exc:
            raise _decryption_error(exc, name, _PASSPHRASE_FAILURES) from exc
        writer.write(plaintext)
        writer.flush()
        return
    if not identities:
        raise KeyMaterialError("no identities given")
    source, sink = _ciphertext_source(reader, name, progress), _Sink(writer)
    _check_header(source, name, max_work_factor)
    unmatched = (f"no identity matches a recipient of the file (tried {len(identities)}; "
                 "wrong key, or passphrase-encrypted?)")
    failures = dict.fromkeys(("No matching keys found", "Decryption failed"), unmatched)
    _run_pyrage(pyrage.decrypt_io, source, sink, list(identities),
                lambda exc: _decryption_error(exc, name, failures))
    if source.read(1):  # pyrage reads to the end today; keep END checked if that changes
        raise FormatError("trailing data after the age payload", path=name)
    sink.finish()


def _ciphertext_source(reader: BinaryIO, name: str, progress: Progress | None) -> _Source:
    """Sniff armored versus binary age (as ``age -d`` does) and build the matching source."""
    head = b""
    while len(head) < len(BEGIN) + MAX_WHITESPACE and len(head.lstrip()) < len(BEGIN):
        chunk = reader.read(TEXT_BLOCK)
        if not chunk:
            break
        head += chunk
    decoder = ArmorDecoder(name) if is_armored(head) else None
    return _Source(reader, decoder, head=head, progress=progress)


def _check_header(source: _Source, name: str, max_work_factor: int) -> None:
    """Read the age header ahead and refuse it if pyrage should not parse it (see _header)."""
    data, end = b"", None
    while end is None:
        chunk = source.read(TEXT_BLOCK)
        data += chunk
        if len(data) >= len(MAGIC) or not chunk:
            check_start(data, name)
            end = check_header_size(data, name, at_eof=not chunk)
    check_work_factors(data[:end], name, max_work_factor)
    source.unread(data)


_PASSPHRASE_FAILURES = {
    "Decryption failed": "wrong passphrase",
    "No matching keys found": "not passphrase-encrypted (decrypt it with an identity)",
}


def _decryption_error(exc: Exception, name: str, known: dict[str, str]) -> DecryptionError:
    """Name what went wrong from pyrage's message (its exceptions carry nothing else)."""
    text = _one_line(str(exc))
    if isinstance(exc, OSError) and not isinstance(exc, pyrage.DecryptError):
        text = "payload failed authentication: the file is corrupted or truncated"
    else:
        text = known.get(text) or f"not a valid age file: {text}"
    return DecryptionError(f"{name}: {text}")


def _one_line(text: str) -> str:
    """pyrage's message on one line, without the bidi isolation marks its translations add."""
    return " ".join(text.replace("\u2068", "").replace("\u2069", "").split())


def _recipient_keys(recipients: Sequence[str]) -> list:
    if isinstance(recipients, str):
        recipients = [recipients]
    keys = [parse_recipient(text) for text in recipients]
    if not keys:
        raise KeyMaterialError("no recipients given")
    return keys


def _check_passphrase(passphrase: str, keys: Sequence) -> None:
    if keys:
        raise KeyMaterialError("give a passphrase or keys, not both (age never mixes them)")
    if not passphrase:
        raise KeyMaterialError("the passphrase is empty")


def _read_bounded(source: _Source, limit: int, name: str) -> bytes:
    data = bytearray()
    while chunk := source.read(TEXT_BLOCK):
        data += chunk
        if len(data) > limit:
            raise LimitError("passphrase mode holds the input in memory; use recipients instead",
                             path=name, expected=f"at most {limit} bytes",
                             got=f"{len(data)}+ bytes")
    return bytes(data)


# --- files ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _reading(path) -> Iterator[BinaryIO]:
    if str(path) == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as handle:
        yield handle


@contextlib.contextmanager
def _writing(path, mode: int) -> Iterator[BinaryIO]:
    if str(path) == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    with atomic_write(path, mode=mode) as handle:
        yield handle


def encrypt_file(src, dst, recipients: Sequence[str] = (), *, passphrase: str | None = None,
                 progress: Progress | None = None) -> None:
    """Encrypt file ``src`` to armored ``dst`` (``-``: stdin/stdout); ``dst`` appears atomically.

    Example::

        encrypt_file("w.wtxt", "w.wtxt.age", ["age1...", "ssh-ed25519 AAAA... me@host"])
    """
    if passphrase is None:
        _recipient_keys(recipients)  # fail on a bad recipient before touching any file
    with _reading(src) as reader, _writing(dst, 0o644) as writer:
        encrypt_io(reader, writer, recipients, passphrase=passphrase, progress=progress)


def decrypt_file(src, dst, identity_path=None, *, passphrase: str | None = None,
                 progress: Progress | None = None) -> None:
    """Decrypt ``src`` to ``dst`` (``-``: stdin/stdout) with the identities in ``identity_path``
    (one path or several) or a passphrase. ``dst`` appears atomically with mode 0600, and only
    if the whole payload authenticates.

    Example::

        decrypt_file("w.wtxt.age", "w.wtxt", "age.key")
    """
    if isinstance(identity_path, (str, os.PathLike)):
        identity_path = [identity_path]
    identities = [key for path in identity_path or () for key in load_identities(path)]
    name = "<stdin>" if str(src) == "-" else str(src)
    with _reading(src) as reader, _writing(dst, 0o600) as writer:
        decrypt_io(reader, writer, identities, passphrase=passphrase, name=name,
                   progress=progress)
