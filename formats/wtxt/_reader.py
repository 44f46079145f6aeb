"""A bounded line reader over a binary stream with push-back (for fast-path fallbacks)."""

from __future__ import annotations

from typing import BinaryIO

from ..errors import LimitError, TruncatedError

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
                                 got=self._buf[self._pos:self._pos + 40])
            if not self._fill():
                got = self._buf[self._pos:self._pos + 60]
                raise TruncatedError(line=self.line_no, offset=self.offset,
                                     expected="a line ending in LF" if got else "more lines",
                                     got=got if got else "end of file")

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
