"""Sans-IO ASCII armor for age: :class:`ArmorEncoder` / :class:`ArmorDecoder` (bytes in, bytes
out, typed errors naming the line) and :func:`is_armored`.

PEM type ``AGE ENCRYPTED FILE``, base64 in lines of exactly 64 columns, the last one up to 64,
strict canonical base64, as the reference reader (filippo.io/age) accepts.
"""

from __future__ import annotations

import numpy as np
import pybase64

from ..errors import FormatError, LimitError, TruncatedError

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

# A full armor line viewed as one record, so numpy moves 64-byte lines without a Python loop.
_LF_LINE = np.dtype([("text", "V64"), ("eol", "u1")])
_CRLF_LINE = np.dtype([("text", "V64"), ("eol", ">u2")])
_EOL = {_LF_LINE: 0x0A, _CRLF_LINE: 0x0D0A}


def is_armored(head: bytes) -> bool:
    """True if ``head`` (the first KiB or so of a file) starts an armored age file.

    >>> is_armored(b"-----BEGIN AGE ENCRYPTED FILE-----\\nYWdl...")
    True
    """
    return bytes(head).lstrip(b" \t\r\n\v\f").startswith(BEGIN)


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
