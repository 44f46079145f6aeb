"""Byte index of a WTXT file: where each array's lines and chunks are, without decoding.

The chunk layout is a pure function of the arr/idx lines, so the index jumps from one arr line
to the next. Used by lazy access and by DELTA v2 (which copies chunk text verbatim). It does
not verify content: callers verify first, or check what they read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import FormatError, TruncatedError
from ._grammar import MAX_LINE, grammar_error, lines_for
from ._parse import ArrayInfo, Header, read_array_head, read_header, read_sign
from ._plan import chunk_text_len
from ._reader import MappedLineReader


@dataclass
class IndexedArray:
    info: ArrayInfo
    head_start: int          # offset of the arr line
    body_start: int          # offset of the first ch line
    body_line: int
    end_start: int           # offset of the endarr line

    @property
    def name(self) -> str:
        return self.info.line.name

    def chunks(self):
        """Yield (ix, text offset, text length, line number) of every chunk."""
        at, line = self.body_start, self.body_line
        for first, count, length in self.info.plan.runs(1 << 62):
            size = chunk_text_len(first, length)
            for ix in range(first, first + count):
                yield ix, at, size, line
                at += size
                line += 2 + lines_for(length)


@dataclass
class FileIndex:
    path: str
    header: Header
    header_end: int                       # offset just after the root (or sign) line
    arrays: list[IndexedArray] = field(default_factory=list)
    audit: bytes | None = None            # the audit line without LF
    size: int = 0

    def by_name(self) -> dict[str, IndexedArray]:
        return {a.name: a for a in self.arrays}


def index_file(stream, path: str) -> FileIndex:
    """Index an open regular file (see module docstring)."""
    reader = MappedLineReader(stream, max_line=MAX_LINE)
    try:
        return _index(reader, path)
    except FormatError as exc:
        raise exc.located(path)
    finally:
        reader.close()


def _index(reader: MappedLineReader, path: str) -> FileIndex:
    header = read_header(reader)
    header_end = reader.offset
    no, line = read_sign(reader, header)
    if header.signature is not None:
        header_end = reader.offset - len(line) - 1
    index = FileIndex(path, header, header_end, size=reader.size)
    prev = None
    while line.startswith(b"arr "):
        head_start = reader.offset - len(line) - 1
        info = read_array_head(reader, no, line, prev)
        body_start, body_line = reader.offset, reader.line_no
        item = IndexedArray(info, head_start, body_start, body_line, 0)
        runs = list(info.plan.runs(1 << 62))
        end = body_start + sum(count * chunk_text_len(first, length)
                               for first, count, length in runs)
        end_line = body_line + sum(count * (2 + lines_for(length)) for _, count, length in runs)
        if end > reader.size:
            raise TruncatedError(line=no, array=info.line.name,
                                 expected=f"{end - body_start} bytes of chunks",
                                 got="a shorter file")
        reader.offset, reader.line_no = end, end_line
        no, text = reader.readline()
        if text != b"endarr":
            raise grammar_error(no, "endarr", text[:40], array=info.line.name)
        item.end_start = end
        info.body_offset, info.body_line = body_start, body_line
        index.arrays.append(item)
        prev = info.line.name
        no, line = reader.readline()
    if line.startswith(b"audit "):
        index.audit = line
        no, line = reader.readline()
    if line != b"endwtxt":
        raise grammar_error(no, "arr, audit or endwtxt", line)
    return index


def open_index(path: str | os.PathLike) -> FileIndex:
    name = os.fspath(path)
    try:
        with open(name, "rb") as stream:
            return index_file(stream, name)
    except OSError as exc:
        raise FormatError(path=name, expected="a readable file", got=exc.strerror) from exc
