"""A bounded line reader over a binary stream with push-back (for fast-path fallbacks)."""

from __future__ import annotations

import io
import mmap
import os
import stat
from typing import BinaryIO

from ..errors import LimitError, TruncatedError
from ..model import close_map

READ_SIZE = 1 << 20


class LineReader:
    """Reads LF-terminated lines (at most ``max_line`` bytes) and exact-size blocks.

    ``line_no`` is the 1-based number of the next line; ``offset`` the byte offset of the next
    byte. ``pushback`` returns bytes (in stream order) so that they are read again.
    """

    def __init__(self, stream: BinaryIO, *, max_line: int, line_no: int = 1, offset: int = 0):
        self.stream = stream
        self.max_line = max_line
        self.line_no = line_no
        self.offset = offset
        self._pending: list[bytes] = []   # pushed-back blocks, next one last
        self._buf = b""
        self._pos = 0
        self.eof = False

    def _fill(self) -> bool:
        if self._pending:
            rest = self._buf[self._pos:]
            self._buf = rest + self._pending.pop() if rest else self._pending.pop()
            self._pos = 0
            return True
        if self.eof:
            return False
        data = self.stream.read(READ_SIZE)
        if not data:
            self.eof = True
            return False
        self._buf = self._buf[self._pos:] + data
        self._pos = 0
        return True

    def readline(self) -> tuple[int, bytes]:
        """(line number, line without LF). Raises TruncatedError at EOF, LimitError if too long."""
        while True:
            end = self._buf.find(b"\n", self._pos, self._pos + self.max_line + 1)
            if end >= 0:
                line = self._buf[self._pos:end]
                self._pos = end + 1
                no = self.line_no
                self.line_no += 1
                self.offset += len(line) + 1
                return no, line
            if len(self._buf) - self._pos > self.max_line:
                raise LimitError(line=self.line_no, offset=self.offset,
                                 expected=f"a line of at most {self.max_line} bytes",
                                 got=_show(self._buf[self._pos:self._pos + 40]))
            if not self._fill():
                got = self._buf[self._pos:self._pos + 60]
                raise TruncatedError(line=self.line_no, offset=self.offset,
                                     expected="a line ending in LF" if got else "more lines",
                                     got=_show(got) if got else "end of file")

    def read_exact(self, size: int, lines: int | None = None) -> bytes:
        """Up to ``size`` bytes (fewer only at end of input). ``lines`` is the number of LFs
        the caller expects the block to hold; it is counted when not given or when short."""
        have = len(self._buf) - self._pos
        if have >= size:
            block = self._buf[self._pos:self._pos + size]
            self._pos += size
        else:
            parts = [self._buf[self._pos:]] if have else []
            self._buf, self._pos = b"", 0
            missing = size - have
            while missing > 0:
                if self._pending:
                    piece = self._pending.pop()
                    if len(piece) > missing:
                        self._pending.append(piece[missing:])
                        piece = piece[:missing]
                elif self.eof:
                    break
                else:
                    piece = self.stream.read(missing)
                    if not piece:
                        self.eof = True
                        break
                parts.append(piece)
                missing -= len(piece)
            block = parts[0] if len(parts) == 1 else b"".join(parts)
        self.line_no += lines if lines is not None and len(block) == size else block.count(b"\n")
        self.offset += len(block)
        return block

    def pushback(self, blocks: list[bytes], lines: int | None = None) -> None:
        """Return ``blocks`` (in stream order) to the input; ``lines`` must be what was credited
        for them when read (counted when None)."""
        for block in blocks:
            self.offset -= len(block)
        self.line_no -= lines if lines is not None else sum(b.count(b"\n") for b in blocks)
        rest = self._buf[self._pos:]
        if rest:
            self._pending.append(rest)
        self._pending.extend(reversed(blocks))
        self._buf, self._pos = b"", 0

    def at_eof(self) -> bool:
        return self._pos >= len(self._buf) and not self._pending and not self._fill()

    def close(self) -> None:
        self._buf, self._pending = b"", []


def _show(data: bytes) -> str:
    return data.decode("ascii", "backslashreplace")


class MappedLineReader:
    """LineReader over a memory-mapped regular file: blocks are zero-copy memoryviews and
    push-back is a seek. (A file shrinking while mapped would raise SIGBUS; snapshot files
    are written atomically and never truncated in place.)"""

    def __init__(self, stream: BinaryIO, *, max_line: int, line_no: int = 1, offset: int = 0):
        self.max_line = max_line
        self.line_no = line_no
        self.offset = offset
        size = os.fstat(stream.fileno()).st_size
        self._map = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._view = memoryview(self._map)
        self.size = size
        self._released = 0

    @property
    def buffer(self) -> memoryview:
        """The whole file, read-only."""
        return self._view

    def close(self) -> None:
        try:
            self._view.release()
        except BufferError:
            return  # arrays still view the map: it is unmapped when the last one goes
        if self.size:
            close_map(self._map)

    def readline(self) -> tuple[int, bytes]:
        pos = self.offset
        end = self._map.find(b"\n", pos, min(self.size, pos + self.max_line + 1))
        if end < 0:
            got = bytes(self._view[pos:pos + 60])
            if self.size - pos > self.max_line:
                raise LimitError(line=self.line_no, offset=pos,
                                 expected=f"a line of at most {self.max_line} bytes",
                                 got=_show(got[:40]))
            raise TruncatedError(line=self.line_no, offset=pos,
                                 expected="a line ending in LF" if got else "more lines",
                                 got=_show(got) if got else "end of file")
        no = self.line_no
        self.line_no += 1
        self.offset = end + 1
        return no, bytes(self._view[pos:end])

    def read_exact(self, size: int, lines: int | None = None) -> memoryview:
        block = self._view[self.offset:self.offset + size]
        self.offset += len(block)
        self._release_behind()
        self.line_no += lines if lines is not None and len(block) == size else \
            _count_lf(block)
        return block

    def _release_behind(self, lag: int = 16 << 20) -> None:
        """Drop mapped pages well behind the cursor from this process (they stay in the page
        cache), so resident memory stays bounded whatever the file size. Pages still in use by
        a decoder simply fault back in."""
        end = (self.offset - lag) & ~(mmap.PAGESIZE - 1)
        if end - self._released >= lag and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
            self._released = end

    def pushback(self, blocks: list, lines: int | None = None) -> None:
        for block in blocks:
            self.offset -= len(block)
        self.line_no -= lines if lines is not None else sum(_count_lf(b) for b in blocks)

    def at_eof(self) -> bool:
        return self.offset >= self.size


def _count_lf(block) -> int:
    return bytes(block).count(b"\n") if not isinstance(block, bytes) else block.count(b"\n")


def line_reader(stream: BinaryIO, **kwargs):
    """A mapped reader for regular files, a buffered one for anything else."""
    try:
        fileno = stream.fileno()
        regular = stat.S_ISREG(os.fstat(fileno).st_mode) and stream.tell() == 0
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        regular = False
    return MappedLineReader(stream, **kwargs) if regular else LineReader(stream, **kwargs)
