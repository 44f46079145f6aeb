"""Chunk-level access to a WTXT file: the one public API for reading chunks without reading
the whole file (lazy arrays, DELTA v2, review, the daemon's change detection).

``open_index(path)`` maps the file and locates every array's lines and chunks from its arr
and idx lines alone (the chunk layout is a pure function of them), checking the lines it
reads (header, arr, idx, endarr, audit, endwtxt) but not the content. Then, per array:

- ``chunk_sha256(name)``: the ``sha256=`` hex of every ch line as a (chunks, 64) uint8
  array, read without decoding (after checking that every ch line is exactly the one the
  layout calls for, bar its hash values): two files' arrays compare chunk by chunk from it;
- ``decode(name, first, count, out=None, check=True)``: the raw bytes of chunks
  [first, first + count), decoded into ``out`` when given. With ``check`` every chunk-level
  check of ``verify`` runs (ch line grammar, parity, canonical base64, CRC32C, chunk
  SHA-256) and the first fault raises a FormatError naming its line; without, only text that
  cannot be decoded is refused (review, which does not verify).

Array-level checks (array SHA-256, HMAC, root hash, signature) are ``verify``'s.

Example::

    with open_index("state.wtxt") as index:
        shas = index.chunk_sha256("emb")            # (chunks, 64) hex digits
        raw = index.decode("emb", 0, 2)             # the first two chunks, fully checked
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError, TruncatedError
from ..iosafe import open_input
from ._chunks import BATCH_BYTES, ChunkReader, check_ch_line, decode_run
from ._grammar import AUDIT_RE, MAX_LINE, ArrLine, grammar_error, lines_for
from ._heads import RunHeads
from ._lines import HEX_VALUE, body_len, decode_bodies_unchecked
from ._parse import ArrayInfo, Header, read_array_head, read_header, read_sign
from ._plan import ENDCH, ChunkPlan, chunk_text_len
from ._reader import MappedLineReader

_ENDCH = np.frombuffer(ENDCH, np.uint8)


@dataclass(frozen=True)
class Run:
    """Chunks ``first`` .. ``first + count - 1`` of ``length`` raw bytes each, whose text
    starts at byte ``at`` and line ``line`` of the file, ``row`` bytes per chunk."""

    first: int
    count: int
    length: int
    at: int
    line: int

    @property
    def row(self) -> int:
        return chunk_text_len(self.first, self.length)

    @property
    def lines_per_chunk(self) -> int:
        return 2 + lines_for(self.length)


@dataclass
class IndexedArray:
    """Where one array's text is: its arr line, its chunks (as runs of equal chunks) and its
    endarr line."""

    info: ArrayInfo
    head_start: int          # offset of the arr line
    body_start: int          # offset of the first ch line
    body_line: int
    end_start: int           # offset of the endarr line
    runs: list[Run] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.info.line.name

    @property
    def line(self) -> ArrLine:
        return self.info.line

    @property
    def plan(self) -> ChunkPlan:
        return self.info.plan

    def chunks(self):
        """Yield (ix, text offset, text length, line number) of every chunk."""
        for run in self.runs:
            for k in range(run.count):
                yield run.first + k, run.at + k * run.row, run.row, \
                    run.line + k * run.lines_per_chunk

    def pieces(self, first: int, count: int, batch: int = BATCH_BYTES):
        """(run, first ix, chunks) covering chunks [first, first + count), at most about
        ``batch`` raw bytes each."""
        stop = first + count
        for run in self.runs:
            lo, hi = max(first, run.first), min(stop, run.first + run.count)
            per = max(1, batch // max(run.length, 1))
            for ix in range(lo, hi, per):
                yield run, ix, min(per, hi - ix)


def _runs(plan: ChunkPlan, at: int, line: int) -> list[Run]:
    runs = []
    for first, count, length in plan.runs(1 << 62):
        run = Run(first, count, length, at, line)
        runs.append(run)
        at += count * run.row
        line += count * run.lines_per_chunk
    return runs


class WtxtIndex:
    """An open, mapped WTXT file and where everything is in it (see the module docstring).
    ``buffer`` is a read-only memoryview of the whole file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._file = open_input(self.path)
        try:
            self._reader = MappedLineReader(self._file, max_line=MAX_LINE)
            self._scan(self._reader)
        except FormatError as exc:
            self.close()
            raise exc.located(self.path)
        except BaseException:
            self.close()
            raise
        self.buffer = self._reader.buffer
        self.size = self._reader.size

    def _scan(self, reader: MappedLineReader) -> None:
        self.header: Header = read_header(reader)
        self.header_end = reader.offset          # just after the root (or the sign) line
        no, line = read_sign(reader, self.header)
        if self.header.signature is not None:
            self.header_end = reader.offset - len(line) - 1
        self.arrays: list[IndexedArray] = []
        while line.startswith(b"arr "):
            self.arrays.append(_index_array(reader, no, line,
                                            self.arrays[-1].name if self.arrays else None))
            no, line = reader.readline()
        self.audit: bytes | None = None          # the audit line without LF
        if line.startswith(b"audit "):
            if not AUDIT_RE.fullmatch(bytes(line)):
                raise grammar_error(no, "an audit line of KEY=VALUE pairs (ASCII)", line)
            self.audit = bytes(line)
            no, line = reader.readline()
        if line != b"endwtxt":
            raise grammar_error(no, "arr, audit or endwtxt", line)
        self._by_name = {a.name: a for a in self.arrays}

    def by_name(self) -> dict[str, IndexedArray]:
        return dict(self._by_name)

    def array(self, name: str) -> IndexedArray:
        try:
            return self._by_name[name]
        except KeyError:
            raise FormatError(path=self.path, array=name, expected="an array of this file",
                              got=name) from None

    def _text(self, run: Run, first: int, count: int) -> np.ndarray:
        """The text of ``count`` chunks of ``run`` from chunk ``first`` as (count, row)."""
        at = run.at + (first - run.first) * run.row
        return np.frombuffer(self.buffer, np.uint8, count * run.row, at).reshape(count,
                                                                                 run.row)

    def chunk_sha256(self, name: str) -> np.ndarray:
        """(chunks, 64) uint8: the sha256= hex digits of every ch line of array ``name``."""
        item = self.array(name)
        out = np.empty((item.plan.count, 64), np.uint8)
        for run, first, count in item.pieces(0, item.plan.count, 16 << 20):
            text = self._text(run, first, count)
            heads = RunHeads(first, count, run.length, first * item.plan.chunk_len)
            sha = text[:, heads.sha_at:heads.sha_at + 64]
            crc = text[:, heads.crc_at:heads.crc_at + 8]
            if not (heads.match(text[:, :heads.width], sha, crc)
                    and (HEX_VALUE[sha] != 0xFF).all() and (HEX_VALUE[crc] != 0xFF).all()
                    and (text[:, -len(ENDCH):] == _ENDCH).all()):
                self._fault(item, run, first, count, check=False)
            out[first:first + count] = sha
        return out

    def decode(self, name: str, first: int = 0, count: int | None = None, out=None, *,
               check: bool = True) -> np.ndarray:
        """Raw bytes of chunks [first, first + count) of array ``name`` (all from ``first``
        when ``count`` is None) as a uint8 array, written into ``out`` when given."""
        item = self.array(name)
        plan = item.plan
        count = plan.count - first if count is None else count
        if first < 0 or count < 0 or first + count > plan.count:
            raise FormatError(path=self.path, array=name, expected=f"chunks within "
                              f"[0, {plan.count})", got=f"[{first}, {first + count})")
        start = first * plan.chunk_len
        nbytes = min(plan.nbytes, (first + count) * plan.chunk_len) - start if count else 0
        dest = np.empty(nbytes, np.uint8) if out is None else np.frombuffer(out, np.uint8,
                                                                           nbytes)
        for run, lo, n in item.pieces(first, count):
            at = lo * plan.chunk_len - start
            piece = dest[at:at + n * run.length]
            if check:
                self._decode_checked(item, run, lo, n, piece)
            else:
                self._decode_unchecked(item, run, lo, n, piece)
        return dest

    def _decode_checked(self, item, run: Run, first: int, count: int, piece) -> None:
        at = run.at + (first - run.first) * run.row
        block = self.buffer[at:at + count * run.row]
        if decode_run(block, first, count, run.length, first * item.plan.chunk_len,
                      piece) is None:
            self._fault(item, run, first, count, check=True, dest=piece)

    def _decode_unchecked(self, item, run: Run, first: int, count: int, piece) -> None:
        text = self._text(run, first, count)
        width = run.row - body_len(run.length) - len(ENDCH)
        try:
            decode_bodies_unchecked(text[:, width:width + body_len(run.length)], run.length,
                                    piece)
        except ValueError:
            self._fault(item, run, first, count, check=False)

    def _fault(self, item: IndexedArray, run: Run, first: int, count: int, *, check: bool,
               dest=None) -> None:
        """Raise the FormatError of the first bad chunk of [first, first + count): every
        check with ``check``, else the ch line's grammar and whether its body decodes."""
        reader = MappedLineReader(self._file, max_line=MAX_LINE)
        try:
            for ix in range(first, first + count):
                reader.offset = run.at + (ix - run.first) * run.row
                reader.line_no = run.line + (ix - run.first) * run.lines_per_chunk
                off, length = item.plan.span(ix)
                if check:
                    raw = ChunkReader(reader, item.name, item.plan, None).read_chunk(ix)
                    dest[(ix - first) * length:(ix - first + 1) * length] = np.frombuffer(
                        raw, np.uint8)
                    continue
                no, line = reader.readline()
                check_ch_line(line, no, ix, off, length, item.name)
                try:
                    decode_bodies_unchecked(self._text(run, ix, 1)[:, len(line) + 1:][
                        :, :body_len(length)], length)
                except ValueError as exc:
                    raise FormatError(line=no + 1, array=item.name, chunk=ix, check="base64",
                                      expected="base64 chunk body lines", got=str(exc)) from None
        except FormatError as exc:
            raise exc.located(self.path)
        finally:
            reader.close()
        if not check:
            raise FormatError(path=self.path, array=item.name, chunk=first, check="grammar",
                              expected="the chunk text of the declared layout",
                              got="other text")

    def close(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            self.buffer = None
            reader.close()
            self._reader = None
        self._file.close()

    def __enter__(self) -> "WtxtIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _index_array(reader: MappedLineReader, no: int, line: bytes, prev: str | None
                 ) -> IndexedArray:
    head_start = reader.offset - len(line) - 1
    info = read_array_head(reader, no, line, prev)
    body_start, body_line = reader.offset, reader.line_no
    runs = _runs(info.plan, body_start, body_line)
    end = runs[-1].at + runs[-1].count * runs[-1].row
    end_line = runs[-1].line + runs[-1].count * runs[-1].lines_per_chunk
    if end > reader.size:
        raise TruncatedError(line=no, array=info.line.name,
                             expected=f"{end - body_start} bytes of chunks", got="a shorter file")
    reader.offset, reader.line_no = end, end_line
    end_no, text = reader.readline()
    if text != b"endarr":
        raise grammar_error(end_no, "endarr", text[:40], array=info.line.name)
    info.body_offset, info.body_line = body_start, body_line
    return IndexedArray(info, head_start, body_start, body_line, end, runs)


def open_index(path: str | os.PathLike) -> WtxtIndex:
    """Open and index a WTXT file (see the module docstring); close it, or use ``with``."""
    return WtxtIndex(path)
