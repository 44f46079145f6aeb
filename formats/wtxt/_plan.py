"""Chunk layout of one array: a pure function of its arr/idx lines (plan, then sink).

Both the writer and the reader use it, so a reader knows exactly which ch lines must follow
an arr line and how many bytes of text each chunk occupies before reading it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._grammar import CHUNK_BYTES, RAW_PER_LINE, ArrLine, lines_for
from ._lines import body_len

CH_LINE_FIXED = len("ch ix= off= len= sha256= crc32c= b64=on width=76 lines=\n") + 64 + 8
ENDCH = b"endch\n"


@dataclass(frozen=True)
class ChunkPlan:
    nbytes: int
    chunk_len: int          # raw bytes per chunk (the last one may be shorter)
    rows_per_chunk: int | None
    row_size: int | None

    @property
    def count(self) -> int:
        if self.nbytes == 0:
            return 1
        return -(-self.nbytes // self.chunk_len)

    def span(self, ix: int) -> tuple[int, int]:
        """(offset, length) of chunk ``ix``."""
        off = ix * self.chunk_len
        return off, min(self.chunk_len, self.nbytes - off)

    def runs(self, max_batch_bytes: int):
        """Yield (first_ix, count, length): runs of equal-length chunks, at most
        ``max_batch_bytes`` of raw data per run (at least one chunk)."""
        total = self.count
        if self.nbytes == 0:
            yield 0, 1, 0
            return
        full = self.nbytes // self.chunk_len
        per = max(1, max_batch_bytes // max(self.chunk_len, 1))
        ix = 0
        while ix < full:
            # ix width grows past 999999: keep every run's ch lines the same width
            limit = max(10 ** 6, 10 ** len(str(ix)))
            n = min(per, full - ix, limit - ix)
            yield ix, n, self.chunk_len
            ix += n
        if ix < total:
            yield ix, 1, self.nbytes - ix * self.chunk_len


def plan_for(arr: ArrLine, rows_per_chunk: int | None, row_size: int | None) -> ChunkPlan:
    if rows_per_chunk is None:
        return ChunkPlan(arr.nbytes, CHUNK_BYTES, None, None)
    chunk = rows_per_chunk * row_size if row_size else rows_per_chunk
    return ChunkPlan(arr.nbytes, max(chunk, 1), rows_per_chunk, row_size)


def ch_line_len(ix: int, length: int) -> int:
    return (CH_LINE_FIXED + max(6, len(str(ix))) + 12 + len(str(length))
            + len(str(lines_for(length))))


def chunk_text_len(ix: int, length: int) -> int:
    return ch_line_len(ix, length) + body_len(length) + len(ENDCH)


assert lines_for(RAW_PER_LINE) == 1
