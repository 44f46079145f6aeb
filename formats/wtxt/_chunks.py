"""Reading the chunks of one array: a vectorised fast path over runs of equal chunks, and a
line-by-line path that names the exact line and check of the first fault."""

from __future__ import annotations

import collections
import hashlib
from concurrent.futures import Executor

import numpy as np
import pybase64

from ..errors import ChecksumError, FormatError
from ..integrity import crc32c
from ._grammar import CH_RE, WIDTH, grammar_error, lines_for
from ._lines import (
    B64_VALUE, HEX_VALUE, b64_len, decode_bodies, decode_bodies_unchecked, line_parity,
)
from ._heads import RunHeads, chunk_crcs, chunk_digests
from ._plan import ENDCH, ChunkPlan, body_len, chunk_text_len
from ._reader import LineReader

BATCH_BYTES = 2 << 20         # raw bytes per decode task (1 MiB costs ~10% more CPU in handoffs)
GROUP_LINES = 16384           # lines per piece when a single chunk is larger than BATCH_BYTES
MAX_IN_FLIGHT = 4
_ENDCH = np.frombuffer(ENDCH, np.uint8)
_B64_LINE = np.zeros(256, bool)
_B64_LINE[B64_VALUE != 0xFF] = True
_B64_LINE[ord("=")] = True


def expected_head(ix: int, off: int, length: int) -> tuple[bytes, bytes]:
    return (b"ch ix=%06d off=%012d len=%d sha256=" % (ix, off, length),
            b" b64=on width=76 lines=%d" % lines_for(length))


def decode_run(block, first: int, count: int, length: int, start: int, out=None,
               hashed: bool = True):
    """Raw bytes of ``count`` chunks (the first at raw offset ``start``) whose text is
    ``block``, decoded into ``out`` (a writable buffer of their size) when given; None if
    anything is off (then ``read_chunk`` names the fault). ``hashed=False``, for a file whose
    own digest was verified: the ch lines, base64 and CRC32C are checked, not the chunks'
    SHA-256; line separators and parity nibbles only by that reread, which a CRC32C
    mismatch triggers (a changed character always causes one)."""
    row = chunk_text_len(first, length)
    if len(block) != row * count:
        return None
    text = np.frombuffer(block, np.uint8).reshape(count, row)
    heads = RunHeads(first, count, length, start)
    blen = body_len(length)
    if not (text[:, heads.width + blen:] == _ENDCH).all():
        return None
    if not hashed:  # CRC32C catches any changed character: parity would add nothing
        try:
            raw = decode_bodies_unchecked(text[:, heads.width:heads.width + blen], length, out)
        except ValueError:
            return None
        return raw if heads.match_unhashed(text[:, :heads.width],
                                           chunk_crcs(raw, count, length)) else None
    raw = decode_bodies(text[:, heads.width:heads.width + blen], length, out)
    if raw is None:
        return None
    sha, crc = chunk_digests(raw, count, length)
    return raw if heads.match(text[:, :heads.width], sha, crc) else None


def check_ch_line(line: bytes, no: int, ix: int, off: int, length: int, array: str
                  ) -> tuple[str, int]:
    """The (sha256 hex, crc32c) of the ch line of chunk ``ix``, or a grammar error naming
    line ``no``."""
    prefix, suffix = expected_head(ix, off, length)
    m = CH_RE.fullmatch(line)
    if not m or not line.startswith(prefix) or not line.endswith(suffix):
        raise grammar_error(no, (prefix + b"<sha256> crc32c=<hex8>" + suffix).decode(), line,
                            array=array, chunk=ix)
    return m.group(4).decode(), int(m.group(5), 16)


class ChunkReader:
    """Yields the raw bytes of an array's chunks in order, checking everything chunk-level."""

    def __init__(self, reader: LineReader, array: str, plan: ChunkPlan, pool: Executor | None,
                 dest: memoryview | None = None, hashed: bool = True):
        self.reader = reader
        self.array = array
        self.plan = plan
        self.pool = pool
        self.dest = dest
        self.hashed = hashed   # False: chunk SHA-256s not computed (see decode_run)

    def __iter__(self):
        plan = self.plan
        runs = list(plan.runs(BATCH_BYTES)) if plan.count < 100000 else plan.runs(BATCH_BYTES)
        window: collections.deque = collections.deque()
        slow_from = None
        for first, count, length in runs:
            if slow_from is not None or length > BATCH_BYTES:
                yield from self._drain(window)
                if slow_from is None:
                    slow_from = first if length > BATCH_BYTES else None
                for ix in range(first, first + count):
                    yield self.read_chunk(ix)
                continue
            start = first * plan.chunk_len
            before = self.reader.line_no
            block = self.reader.read_exact(count * chunk_text_len(first, length),
                                           count * (2 + lines_for(length)))
            credited = self.reader.line_no - before
            out = self.dest[start:start + count * length] if self.dest is not None else None
            args = (block, first, count, length, start, out, self.hashed)
            job = self.pool.submit(decode_run, *args) if self.pool else _done(decode_run(*args))
            window.append((job, block, first, count, credited))
            while len(window) > MAX_IN_FLIGHT or (window and window[0][0].done()):
                raw, fallback = self._take(window)
                if fallback is not None:
                    slow_from = fallback
                    for ix in range(fallback[0], fallback[0] + fallback[1]):
                        yield self.read_chunk(ix)
                    break
                yield raw
            if slow_from is not None:
                continue
        yield from self._drain(window)

    def _take(self, window):
        job, block, first, count, _ = window[0]
        raw = job.result()
        if raw is not None:
            window.popleft()
            return raw, None
        # Give back this block and everything read after it; re-read them line by line.
        blocks = [entry[1] for entry in window]
        for entry in window:
            entry[0].cancel()
        span = (first, sum(entry[3] for entry in window))
        credited = sum(entry[4] for entry in window)
        window.clear()
        self.reader.pushback(blocks, credited)
        return None, span

    def _drain(self, window):
        while window:
            raw, fallback = self._take(window)
            if fallback is not None:
                for ix in range(fallback[0], fallback[0] + fallback[1]):
                    yield self.read_chunk(ix)
                return
            yield raw

    def read_chunk(self, ix: int) -> bytes:
        """One chunk, line by line, with precise errors (used for faults and huge chunks)."""
        off, length = self.plan.span(ix)
        no, line = self.reader.readline()
        sha_want, crc_want = check_ch_line(line, no, ix, off, length, self.array)
        sha, crc, parts = hashlib.sha256(), 0, []
        total_chars = b64_len(length)
        n_lines = lines_for(length)
        pending = bytearray()
        for k in range(n_lines):
            width = WIDTH if k < n_lines - 1 else total_chars - WIDTH * (n_lines - 1)
            pending += self._body_line(width, ix)
            if len(pending) >= GROUP_LINES * WIDTH or k == n_lines - 1:
                raw = self._decode(bytes(pending), no, ix, final=k == n_lines - 1, length=length)
                sha.update(raw)
                crc = crc32c(raw, crc)
                parts.append(raw)
                pending.clear()
        end_no, end = self.reader.readline()
        if end != b"endch":
            raise grammar_error(end_no, "endch", end, array=self.array, chunk=ix)
        raw = b"".join(parts)
        if self.dest is not None:
            self.dest[off:off + length] = raw
        if crc != crc_want:
            raise ChecksumError(line=no, array=self.array, chunk=ix, check="crc32c",
                                expected=f"crc32c={crc_want:08x}", got=f"{crc:08x}")
        if sha.hexdigest() != sha_want:
            raise ChecksumError(line=no, array=self.array, chunk=ix, check="chunk_sha256",
                                expected=f"sha256={sha_want}", got=sha.hexdigest())
        return raw

    def _body_line(self, width: int, ix: int) -> bytes:
        no, line = self.reader.readline()
        chars = np.frombuffer(line, np.uint8)
        if (len(line) != width + 2 or line[width] != 0x20 or not _B64_LINE[chars[:width]].all()
                or HEX_VALUE[line[-1]] == 0xFF):
            raise grammar_error(no, f"{width} base64 chars, a space and a hex digit", line,
                                array=self.array, chunk=ix)
        if line_parity(line[:width]) != HEX_VALUE[line[-1]]:
            raise ChecksumError(line=no, array=self.array, chunk=ix, check="parity",
                                expected=f"parity {line_parity(line[:width]):x}",
                                got=chr(line[-1]))
        return line[:width]

    def _decode(self, chars: bytes, no: int, ix: int, *, final: bool, length: int) -> bytes:
        pad = (3 - length % 3) % 3 if final else 0
        data = chars[:len(chars) - pad] if pad else chars
        ok = b"=" not in data and (not pad or chars[-pad:] == b"=" * pad)
        if ok and pad and data:
            ok = not (B64_VALUE[data[-1]] & {1: 0x3, 2: 0xF}[pad])
        try:
            raw = pybase64.b64decode(chars, validate=True) if ok else None
        except ValueError:
            raw = None
        if raw is None:
            raise FormatError(line=no, array=self.array, chunk=ix, check="base64",
                              expected="canonical base64 (padding only at the end, zero pad bits)",
                              got=chars[-8:].decode("ascii", "replace"))
        return raw


def _done(value):
    from concurrent.futures import Future

    fut = Future()
    fut.set_result(value)
    return fut
