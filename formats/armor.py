"""age encryption with ASCII armor, streaming in bounded memory, interoperable with the age CLI.

pyrage does the cryptography on the *binary* age stream; this module does the armor itself
(PEM type ``AGE ENCRYPTED FILE``, base64 in lines of exactly 64 columns, the last one up to 64,
strict canonical base64) because pyrage's own armoring measured at about half the speed
(256 MiB, best of 3, 2 busy cores: 232 vs 441 MB/s encrypt, 246 vs 414 MB/s decrypt).

>>> encrypt_file("state.wtxt", "state.wtxt.age", ["age1..."])
>>> decrypt_file("state.wtxt.age", "state.wtxt", "age.key")

Layers, each usable alone: :class:`ArmorEncoder` / :class:`ArmorDecoder` are sans-IO (bytes in,
bytes out, typed errors naming the line); ``encrypt_io`` / ``decrypt_io`` stream file objects;
``encrypt_file`` / ``decrypt_file`` add ``-`` for stdin/stdout and atomic output files.

Passphrase mode (``passphrase=``) holds the whole input in memory, because pyrage offers no
streaming passphrase API; it is bounded by ``max_passphrase_bytes`` and raises LimitError past it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Sequence

import numpy as np
import pybase64
import pyrage

from .atomic import atomic_write
from .errors import (
    DecryptionError, FormatError, KeyMaterialError, LimitError, SnapopsError, TruncatedError,
)
from .keys import _read_small

BEGIN = b"-----BEGIN AGE ENCRYPTED FILE-----"
END = b"-----END AGE ENCRYPTED FILE-----"
COLUMNS = 64
BYTES_PER_LINE = 48
# One block (96 KiB binary, 130 KiB text) is the unit of all buffering. Small on purpose: with
# 1 MiB blocks both directions measured 2x slower (224 vs 560 MB/s CPU-bound encrypt), as freed
# big buffers go back to the OS and each new one page-faults again; 1024-4096 lines measured alike.
LINES_PER_BLOCK = 2048
BLOCK_BYTES = BYTES_PER_LINE * LINES_PER_BLOCK
TEXT_BLOCK = (COLUMNS + 1) * LINES_PER_BLOCK
MAX_WHITESPACE = 1024  # before BEGIN and after END, as the reference Go reader allows
MAX_PASSPHRASE_BYTES = 256 * 1024 * 1024

# A full armor line viewed as one record, so numpy moves 64-byte lines without a Python loop.
_LF_LINE = np.dtype([("text", "V64"), ("eol", "u1")])
_CRLF_LINE = np.dtype([("text", "V64"), ("eol", ">u2")])
_EOL = {_LF_LINE: 0x0A, _CRLF_LINE: 0x0D0A}

Progress = Callable[[int], None]


def is_armored(head: bytes) -> bool:
    """True if ``head`` (the first KiB or so of a file) starts an armored age file.

    >>> is_armored(b"-----BEGIN AGE ENCRYPTED FILE-----\\nYWdl...")
    True
    """
    return bytes(head).lstrip(b" \t\r\n\v\f").startswith(BEGIN)


# --- sans-IO armor -------------------------------------------------------------------------------


def _wrap_lines(data) -> bytes:
    """Base64 of ``data`` (a multiple of 48 bytes) in LF-terminated 64-column lines."""
    if not len(data):
        return b""
    text = pybase64.b64encode(data)
    lines = np.empty(len(text) // COLUMNS, dtype=_LF_LINE)
    lines["text"] = np.frombuffer(text, dtype="V64")
    lines["eol"] = 0x0A
    return lines.tobytes()


class ArmorEncoder:
    """Binary age stream in, armored text out; buffers less than one block.

    >>> enc = ArmorEncoder()
    >>> text = enc.feed(b"age-encryption.org/v1\\n...") + enc.finish()
    """

    def __init__(self) -> None:
        self._pending = bytearray()
        self._started = False

    def feed(self, data) -> bytes:
        self._pending += data
        if len(self._pending) < BLOCK_BYTES:
            return b""
        return self._emit(len(self._pending) // BYTES_PER_LINE * BYTES_PER_LINE)

    def finish(self) -> bytes:
        text = self._emit(len(self._pending) // BYTES_PER_LINE * BYTES_PER_LINE)
        tail = pybase64.b64encode(bytes(self._pending))
        self._pending.clear()
        return text + (tail + b"\n" if tail else b"") + END + b"\n"

    def _emit(self, n: int) -> bytes:
        head = b"" if self._started else BEGIN + b"\n"
        self._started = True
        with memoryview(self._pending) as view:
            text = _wrap_lines(view[:n])
        del self._pending[:n]
        return head + text


_BEFORE, _BODY, _END_NEXT, _AFTER = "before BEGIN", "body", "END next", "after END"


class ArmorDecoder:
    """Armored text in, binary age stream out, as strict as the reference reader (filippo.io/age).

    Leading and trailing whitespace (up to 1 KiB each) and CRLF are accepted; anything else off
    the grammar raises FormatError naming the line. Feed any split of the input: the result is
    the same as feeding it whole. Call :meth:`finish` at end of input.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._buf = bytearray()
        self._pos = 0
        self._line = 0
        self._state = _BEFORE
        self._leading = 0  # whitespace bytes before BEGIN
        self._trailing = 0  # and after END
        self._slow_lines = 0  # lines to take one by one after a failed bulk decode

    def feed(self, data) -> bytes:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data
        out: list[bytes] = []
        while self._step(out):
            pass
        return b"".join(out)

    def finish(self) -> bytes:
        """Take a last line without newline, then require that END was seen."""
        out: list[bytes] = []
        rest = bytes(self._buf[self._pos:])
        self._pos = len(self._buf)
        if rest and self._state is not _AFTER:
            self._line += 1
            line = rest.removesuffix(b"\r")
            if self._state is _BEFORE or line == END:
                self._take_line(line, out)
            # else a body line cut short: whatever it holds, END is missing after it
        if self._state is not _AFTER:
            marker = BEGIN if self._state is _BEFORE else END
            raise TruncatedError("armor ends early", path=self.name, line=self._line,
                                 expected=marker.decode(), got="end of input")
        self._check_trailing()
        return b"".join(out)

    def _step(self, out: list[bytes]) -> bool:
        """Consume one line (or a run of full lines); False when more input is needed."""
        if self._state is _AFTER:
            self._check_trailing()
            return False
        if self._state is _BODY and self._bulk_lines(out):
            return True
        end = self._buf.find(b"\n", self._pos)
        if end < 0:
            self._check_pending_line()
            return False
        line = bytes(self._buf[self._pos:end]).removesuffix(b"\r")
        self._pos = end + 1
        self._line += 1
        self._take_line(line, out)
        return True

    def _take_line(self, line: bytes, out: list[bytes]) -> None:
        if self._state is _BEFORE:
            self._take_preamble(line)
        elif line == END:
            self._state = _AFTER
        elif self._state is _END_NEXT:
            raise self._error("a short base64 line must be the last", expected=END.decode(),
                              got=line)
        else:
            data = self._decode_line(line)
            out.append(data)
            if len(data) < BYTES_PER_LINE:
                self._state = _END_NEXT
            self._slow_lines = max(0, self._slow_lines - 1)

    def _take_preamble(self, line: bytes) -> None:
        if line == BEGIN:
            self._state = _BODY
            return
        if line.strip():
            raise self._error("not an armored age file", expected=BEGIN.decode(), got=line[:80])
        self._leading += len(line) + 1
        if self._leading > MAX_WHITESPACE:
            raise LimitError("too much leading whitespace", path=self.name, line=self._line,
                             expected=f"at most {MAX_WHITESPACE} bytes", got=self._leading)

    def _decode_line(self, line: bytes) -> bytes:
        if len(line) > COLUMNS:
            raise self._error(expected=f"at most {COLUMNS} base64 columns", got=len(line))
        try:
            data = pybase64.b64decode(line, validate=True)
        except ValueError as exc:
            raise self._error("invalid base64", expected="base64 text", got=line) from exc
        if pybase64.b64encode(data) != line:
            raise self._error("non-canonical base64", expected="canonical padding", got=line)
        return data

    def _bulk_lines(self, out: list[bytes]) -> bool:
        """Decode the run of full 64-column lines at the cursor in one go (the hot path)."""
        if self._slow_lines:
            return False
        buf, pos = self._buf, self._pos
        if buf[pos + COLUMNS: pos + COLUMNS + 1] == b"\n":
            dtype = _LF_LINE
        elif buf[pos + COLUMNS: pos + COLUMNS + 2] == b"\r\n":
            dtype = _CRLF_LINE
        else:
            return False
        count = (len(buf) - pos) // dtype.itemsize
        if not count:
            return False
        lines = np.frombuffer(buf, dtype=dtype, count=count, offset=pos)
        irregular = np.flatnonzero(lines["eol"] != _EOL[dtype])
        count = int(irregular[0]) if irregular.size else count
        text = lines["text"][:count].tobytes()
        del lines  # release the export of buf before it is resized
        padded = text.find(b"=")  # padding only on the last line: let _take_line judge it
        if padded >= 0:
            count = padded // COLUMNS
            text = text[: count * COLUMNS]
        if not count:
            return False
        try:
            out.append(pybase64.b64decode(text, validate=True))
        except ValueError:
            self._slow_lines = count  # find and name the bad line
            return False
        self._pos += count * dtype.itemsize
        self._line += count
        return True

    def _check_pending_line(self) -> None:
        pending = len(self._buf) - self._pos
        limit = len(BEGIN) + MAX_WHITESPACE if self._state is _BEFORE else COLUMNS + 1
        if pending > limit:
            raise self._error("line too long", expected=f"at most {COLUMNS} columns and a newline",
                              got=f"{pending} bytes without newline", line=self._line + 1)

    def _check_trailing(self) -> None:
        rest = self._buf[self._pos:]
        self._pos = len(self._buf)
        if rest.strip():
            raise self._error("trailing data after armor", expected="only whitespace after END",
                              got=bytes(rest[:80]), line=self._line + 1)
        self._trailing += len(rest)
        if self._trailing >= MAX_WHITESPACE:
            raise LimitError("too much trailing whitespace", path=self.name, line=self._line,
                             expected=f"less than {MAX_WHITESPACE} bytes", got=self._trailing)

    def _error(self, message=None, *, expected, got, line=None) -> FormatError:
        if isinstance(got, bytes):
            got = got.decode("ascii", "backslashreplace")
        return FormatError(message, path=self.name, line=line or self._line,
                           expected=expected, got=got)


# --- keys ----------------------------------------------------------------------------------------


def _show(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


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
        raise KeyMaterialError(f"unsupported recipient {_show(text)}: expected an age1... X25519 "
                               "key or an ssh-ed25519/ssh-rsa public key line")
    try:
        return kind.from_str(text)
    except pyrage.RecipientError as exc:
        raise KeyMaterialError(f"invalid recipient {_show(text)}: {exc}") from exc


def _key_lines(path, what: str, data: bytes | None = None) -> Iterator[tuple[int, str]]:
    """Numbered lines of a small key file, without blanks and ``#`` comments."""
    data = _read_small(path, what) if data is None else data
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

    >>> load_identities("age.key")
    [<pyrage.x25519.Identity ...>]
    """
    data = _read_small(path, "identity")
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


# --- streaming through pyrage --------------------------------------------------------------------


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

    >>> with open("w.wtxt", "rb") as src, open("w.wtxt.age", "wb") as dst:
    ...     encrypt_io(src, dst, ["age1..."])
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
               max_passphrase_bytes: int = MAX_PASSPHRASE_BYTES) -> None:
    """Decrypt armored (or binary) age from ``reader`` to ``writer``, in bounded memory.

    ``identities`` come from :func:`load_identities`; or give ``passphrase`` alone. Raises
    FormatError/TruncatedError for bad armor and DecryptionError for a wrong key or passphrase
    or a damaged payload; ``name`` labels the input in messages. ``writer`` may already hold
    part of the plaintext when an error is raised: :func:`decrypt_file` hides it atomically.

    >>> with open("w.wtxt.age", "rb") as src, open("w.wtxt", "wb") as dst:
    ...     decrypt_io(src, dst, load_identities("age.key"))
    """
    if passphrase is not None:
        _check_passphrase(passphrase, identities)
        source = _ciphertext_source(reader, name, progress)
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


_PASSPHRASE_FAILURES = {
    "Decryption failed": "wrong passphrase",
    "No matching keys found": "not passphrase-encrypted (decrypt it with an identity)",
}


def _decryption_error(exc: Exception, name: str, known: dict[str, str]) -> DecryptionError:
    """Name what went wrong from pyrage's message (its exceptions carry nothing else)."""
    text = str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, pyrage.DecryptError):
        text = "payload failed authentication: the file is corrupted or truncated"
    else:
        text = known.get(text) or f"not a valid age file: {text}"
    return DecryptionError(f"{name}: {text}")


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

    >>> encrypt_file("w.wtxt", "w.wtxt.age", ["age1...", "ssh-ed25519 AAAA... me@host"])
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

    >>> decrypt_file("w.wtxt.age", "w.wtxt", "age.key")
    """
    if isinstance(identity_path, (str, os.PathLike)):
        identity_path = [identity_path]
    identities = [key for path in identity_path or () for key in load_identities(path)]
    name = "<stdin>" if str(src) == "-" else str(src)
    with _reading(src) as reader, _writing(dst, 0o600) as writer:
        decrypt_io(reader, writer, identities, passphrase=passphrase, name=name,
                   progress=progress)


# --- benchmark -----------------------------------------------------------------------------------


class _PatternReader:
    """``size`` bytes without holding them: one random MiB, repeated."""

    def __init__(self, size: int) -> None:
        self._left = size
        self._block = os.urandom(1 << 20)

    def read(self, n: int = -1) -> bytes:
        n = min(self._left, len(self._block) if n is None or n < 0 else n, len(self._block))
        self._left -= n
        return self._block[:n]


class _NullWriter:
    def write(self, data) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def _peak_rss_meter() -> tuple[str, Callable[[], int]]:
    """Start measuring peak resident memory; return (method, growth-in-bytes reader).

    Linux lets a process reset its peak-RSS mark (``clear_refs`` 5), which makes the peak of one
    operation measurable even after an earlier, bigger one; elsewhere getrusage may under-report.
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")

        def peak() -> int:
            status = Path("/proc/self/status").read_text()
            return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024

        method = "VmHWM"
    except OSError:
        import resource

        def peak() -> int:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

        method = "ru_maxrss"
    base = peak()
    return method, lambda: peak() - base


def _timed(call) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_armor(size_bytes: int, *, repeat: int = 1,
                folder: str | os.PathLike | None = None) -> dict:
    """Armored encrypt and decrypt of ``size_bytes``: best MB/s (10**6 bytes of plaintext per
    second) over ``repeat`` runs, by wall clock and by CPU time (steadier on a busy machine),
    and the peak extra resident memory.

    The ciphertext goes through a temporary file in ``folder``; the plaintext is generated and
    discarded on the fly, so the memory figure is what the pipeline itself holds.

    >>> bench_armor(256 * 2**20)["encrypt_mb_s"]
    402.3
    """
    identity = pyrage.x25519.Identity.generate()
    recipient = str(identity.to_public())
    best = {"encrypt": (float("inf"),) * 2, "decrypt": (float("inf"),) * 2}
    with tempfile.TemporaryDirectory(dir=folder, prefix="snapops-bench-") as tmp:
        path = Path(tmp) / "bench.age"
        method, peak = _peak_rss_meter()
        for _ in range(repeat):
            path.unlink(missing_ok=True)
            with open(path, "wb") as out:
                took = _timed(lambda: encrypt_io(_PatternReader(size_bytes), out, [recipient]))
            best["encrypt"] = tuple(map(min, best["encrypt"], took))
            with open(path, "rb") as src:
                took = _timed(lambda: decrypt_io(src, _NullWriter(), [identity]))
            best["decrypt"] = tuple(map(min, best["decrypt"], took))
        result = {"size_bytes": size_bytes, "armored_bytes": path.stat().st_size}
    for op, (wall, cpu) in best.items():
        result[f"{op}_mb_s"] = round(size_bytes / wall / 1e6, 1)
        result[f"{op}_cpu_mb_s"] = round(size_bytes / max(cpu, 1e-9) / 1e6, 1)
    result.update(peak_extra_bytes=peak(), memory_method=method)
    return result
