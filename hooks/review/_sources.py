"""Array sources for review: one uniform, lazy view of any supported snapshot file.

A source lists its arrays (name, dtype, shape) without reading them and hands out element
ranges on demand, so a diff walks two files array by array and block by block in bounded
memory. WTXT is special: its chunk layout and each chunk's SHA-256 come from the ch lines
alone, so unchanged chunks are recognised without decoding them, and the chunks that are
needed are decoded with vectorised numpy + pybase64 (both release the GIL).

Review does not verify: the bodies are decoded without the parity/CRC/hash checks of the
WTXT reader (``snapops verify`` and the hooks do that). Malformed text still raises
``FormatError``, never a bare numpy or base64 error.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pybase64

from snapops.formats.errors import FormatError
from snapops.formats.model import le_contiguous
from snapops.formats.registry import detect

LF = 0x0A
WIDTH = 76
LINE = WIDTH + 3                      # 76 base64 chars, a space, a parity digit, LF
_B64_VALUE = np.full(256, 0xFF, np.uint8)
_B64_VALUE[np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)] = np.arange(64)


@dataclass(frozen=True)
class Layout:
    """Blocks of ``block_elems`` elements (the last may be shorter) over ``n_elems`` elements;
    rows of ``row_elems`` elements label them (``name[r0:r1]`` when blocks are whole rows)."""

    n_elems: int
    block_elems: int
    row_elems: int

    @property
    def count(self) -> int:
        return -(-self.n_elems // self.block_elems) if self.n_elems else 0

    @property
    def row_aligned(self) -> bool:
        return self.block_elems % self.row_elems == 0

    @property
    def rows_per_block(self) -> int | None:
        return self.block_elems // self.row_elems if self.row_aligned else None

    def span(self, ix: int) -> tuple[int, int]:
        """Element range [start, stop) of block ``ix``."""
        start = ix * self.block_elems
        return start, min(start + self.block_elems, self.n_elems)

    def label(self, ix: int) -> tuple[str, int, int]:
        """('rows' or 'flat', start, stop) of block ``ix``."""
        start, stop = self.span(ix)
        if self.row_aligned:
            return "rows", start // self.row_elems, -(-stop // self.row_elems)
        return "flat", start, stop


def default_layout(shape: tuple[int, ...], itemsize: int, rows_per_block: int | None = None
                   ) -> Layout:
    """Row blocks of about 32 KiB (a power of two of rows, as WTXT's row blocking picks)."""
    n = int(np.prod(shape, dtype=object)) if shape else 1
    row_elems = int(np.prod(shape[1:], dtype=object)) if len(shape) > 1 else 1
    if rows_per_block is None:
        rows = max(1, 32768 // max(row_elems * itemsize, 1))
        rows_per_block = 1 << (rows.bit_length() - 1)
    return Layout(n, max(1, rows_per_block * max(row_elems, 1)), max(row_elems, 1))


@dataclass
class ArraySource:
    """One array of a snapshot. ``read(start, stop)`` returns elements [start, stop) of the
    flattened array (native byte order); ``digests`` (WTXT) holds each native block's SHA-256
    as 64 ASCII hex bytes per row, or None."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    layout: Layout
    read: Callable[[int, int], np.ndarray]
    digests: Callable[[], np.ndarray] | None = None
    sha256: str | None = None         # whole-array digest when the file states it
    release: Callable[[], None] = lambda: None

    @property
    def n_elems(self) -> int:
        return self.layout.n_elems

    @property
    def nbytes(self) -> int:
        return self.layout.n_elems * self.dtype.itemsize


@dataclass
class SnapshotSource:
    """A snapshot opened for review: format name, header lines, metadata and arrays by name."""

    format: str
    meta: dict[str, str]
    header_lines: list[str]
    arrays: dict[str, ArraySource] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(self.arrays, key=lambda n: n.encode("utf-8", "surrogatepass"))

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()

    def __enter__(self) -> "SnapshotSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_snapshot(path: str | os.PathLike, *, rows_per_block: int | None = None
                  ) -> SnapshotSource:
    """Open any supported snapshot for review (``detect`` picks the format)."""
    handler = detect(path)
    if handler.capabilities.streams_text:
        return _open_wtxt(os.fspath(path), rows_per_block)
    return _open_generic(os.fspath(path), handler, rows_per_block)


# --- WTXT -----------------------------------------------------------------------------------

def _open_wtxt(path: str, rows_per_block: int | None) -> SnapshotSource:
    from snapops.formats.wtxt._index import open_index
    from snapops.formats.wtxt.read import header_info

    index = open_index(path)
    info = header_info(index.header)
    meta = {k: _text(v) for k, v in info.__dict__.items()
            if v is not None and k not in ("gen_text", "root_pending")}
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    # header_end is past the root line, or past the sign line when the file is signed
    header = bytes(mapped[:index.header_end]).decode("ascii", "replace").splitlines()[1:]
    source = SnapshotSource("wtxt", meta, header)
    source.closers.append(lambda: _close_map(mapped))
    for item in index.arrays:
        wa = WtxtArray(path, mapped, item)
        source.arrays[item.name] = wa.source(rows_per_block)
    return source


def _close_map(mapped) -> None:
    if isinstance(mapped, mmap.mmap):
        try:
            mapped.close()
        except BufferError:
            pass  # a caller still holds a view: the map goes when that view is collected


class WtxtArray:
    """Chunk-level access to one WTXT array through the file's mmap (see module docstring)."""

    def __init__(self, path: str, mapped, item) -> None:
        self.path, self.mapped, self.item = path, mapped, item
        arr = item.info.line
        self.name, self.dtype, self.shape = arr.name, arr.np_dtype, tuple(arr.shape)
        self.plan = item.info.plan
        self.runs = self._runs()

    def _runs(self) -> list[tuple[int, int, int, int, int, int]]:
        """(first, count, length, text start, text bytes per chunk, head bytes) per run."""
        from snapops.formats.wtxt._plan import ENDCH, body_len, chunk_text_len

        runs, at = [], self.item.body_start
        for first, count, length in self.plan.runs(1 << 62):
            row = chunk_text_len(first, length)
            runs.append((first, count, length, at, row, row - body_len(length) - len(ENDCH)))
            at += count * row
        return runs

    def source(self, rows_per_block: int | None) -> ArraySource:
        itemsize = self.dtype.itemsize
        row_elems = int(np.prod(self.shape[1:], dtype=object)) if len(self.shape) > 1 else 1
        n = self.plan.nbytes // itemsize
        native = Layout(n, max(1, self.plan.chunk_len // itemsize), max(row_elems, 1))
        layout = native if rows_per_block is None else default_layout(
            self.shape, itemsize, rows_per_block)
        digests = self.digests if layout == native and n else None
        return ArraySource(self.name, self.dtype, self.shape, layout, self.read_elems,
                           digests, self.item.info.line.sha256)

    def _error(self, ix: int, expected: str, got: object) -> FormatError:
        return FormatError(path=self.path, array=self.name, chunk=ix, expected=expected,
                           got=got, check="grammar")

    def _text(self, run, first: int, count: int) -> np.ndarray:
        """The text of ``count`` chunks of ``run`` from chunk ``first`` as (count, row) bytes."""
        run_first, _, _, start, row, _ = run
        offset = start + (first - run_first) * row
        if offset + count * row > len(self.mapped):
            raise self._error(first, f"{count * row} bytes of chunk text", "a shorter file")
        return np.frombuffer(self.mapped, np.uint8, count * row, offset).reshape(count, row)

    def digests(self) -> np.ndarray:
        """(chunks, 64) uint8: the sha256= hex of every ch line, read without decoding."""
        out = np.empty((self.plan.count, 64), np.uint8)
        for run in self.runs:
            first, count, length, start, _, head = run
            text = self._text(run, first, count)
            pos = len(b"ch ix=%06d off=%012d len=%d sha256=" % (first, first * length, length))
            ok = (text[:, head - 1] == LF).all() and (
                text[:, pos - 7:pos] == np.frombuffer(b"sha256=", np.uint8)).all()
            if not ok:
                raise self._error(first, "ch lines of the declared chunk layout",
                                  "other text (run snapops verify)")
            out[first:first + count] = text[:, pos:pos + 64]
        return out

    def decode(self, first: int, count: int) -> np.ndarray:
        """Raw bytes of chunks [first, first + count) as one uint8 array."""
        if count <= 0 or self.plan.nbytes == 0:
            return np.empty(0, np.uint8)
        pieces = []
        for run in self.runs:
            r_first, r_count, length = run[:3]
            lo, hi = max(first, r_first), min(first + count, r_first + r_count)
            if lo >= hi:
                continue
            text = self._text(run, lo, hi - lo)
            body = text[:, run[5]:run[5] + _body_len(length)]
            try:
                pieces.append(_decode_bodies(body, length).reshape(-1))
            except (ValueError, TypeError) as exc:
                raise self._bad_chunk(body, lo, length, exc) from exc
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _bad_chunk(self, body: np.ndarray, first: int, length: int, exc) -> FormatError:
        """A FormatError naming the first chunk of ``body`` that does not decode."""
        for k in range(body.shape[0]):
            try:
                _decode_bodies(body[k:k + 1], length)
            except (ValueError, TypeError) as one:
                first, exc = first + k, one
                break
        return self._error(first, "canonical base64 chunk bodies (run snapops verify)",
                           str(exc))

    def read_elems(self, start: int, stop: int) -> np.ndarray:
        itemsize, chunk = self.dtype.itemsize, self.plan.chunk_len
        if stop <= start:
            return np.empty(0, self.dtype)
        first = start * itemsize // chunk
        last = (stop * itemsize - 1) // chunk
        raw = self.decode(first, last - first + 1)
        skip = start * itemsize - first * chunk
        return raw[skip:skip + (stop - start) * itemsize].view(self.dtype)


def _body_len(length: int) -> int:
    b64 = 4 * -(-length // 3)
    full, tail = divmod(b64, WIDTH)
    return full * LINE + (tail + 3 if tail else 0)


def _decode_bodies(body: np.ndarray, length: int) -> np.ndarray:
    """(count, body bytes) of equal-length chunk bodies -> (count, length) raw bytes.

    Every full 76-character line decodes to exactly 57 bytes, so the full lines of all chunks
    are gathered with one copy of 76-byte items (a memcpy per line, far faster than a strided
    byte copy) and decoded in one pybase64 call; each chunk's last line (which holds the
    '=' padding, if any) is decoded separately, its final quantum through a lookup table.
    A misplaced separator puts a space, parity digit or LF among the base64 characters, which
    ``validate=True`` refuses."""
    count = body.shape[0]
    b64 = 4 * -(-length // 3)
    full, tail = divmod(b64, WIDTH)
    whole, rest = divmod(length, 3)
    if rest and not tail:               # the padding sits in the last full line
        full, tail = full - 1, WIDTH
    out = np.empty((count, length), np.uint8)
    if full:
        lines = body[:, :full * LINE].reshape(count, full, LINE)[:, :, :WIDTH].view(f"S{WIDTH}")
        decoded = pybase64.b64decode(np.ascontiguousarray(lines), validate=True)
        out[:, :full * 57] = np.frombuffer(decoded, np.uint8).reshape(count, full * 57)
    if not tail:
        return out
    last = body[:, full * LINE:full * LINE + tail]
    plain = tail if not rest else tail - 4          # characters without padding
    at = full * 57
    if plain:
        decoded = pybase64.b64decode(np.ascontiguousarray(last[:, :plain]), validate=True)
        out[:, at:at + plain // 4 * 3] = np.frombuffer(decoded, np.uint8).reshape(count, -1)
        at += plain // 4 * 3
    if rest:
        quantum = last[:, plain:]
        values = _B64_VALUE[quantum[:, :rest + 1]]
        if (values == 0xFF).any() or not (quantum[:, rest + 1:] == ord("=")).all():
            raise ValueError("bad final base64 quantum")
        v = values.astype(np.uint16)
        out[:, at] = ((v[:, 0] << 2) | (v[:, 1] >> 4)) & 0xFF
        if rest == 2:
            out[:, at + 1] = ((v[:, 1] << 4) | (v[:, 2] >> 2)) & 0xFF
    return out


# --- every other format --------------------------------------------------------------------

def _open_generic(path: str, handler, rows_per_block: int | None) -> SnapshotSource:
    """Per-array lazy access through the format's ``open_lazy``."""
    getter, names, meta, close = _lazy_access(path, handler)
    source = SnapshotSource(handler.name, {k: _text(v) for k, v in meta.items()}, [])
    source.closers.append(close)
    for name, (dtype, shape) in names.items():
        source.arrays[name] = _ndarray_source(name, dtype, shape, getter, rows_per_block)
    return source


def _ndarray_source(name: str, dtype, shape, getter, rows_per_block) -> ArraySource:
    cache: dict[str, np.ndarray] = {}
    lock = threading.Lock()          # tasks of one array run in parallel: load it once

    def flat() -> np.ndarray:
        with lock:
            if "a" not in cache:
                array = le_contiguous(np.asarray(getter(name))).reshape(-1)
                cache["a"] = array.view(array.dtype.newbyteorder("="))
            return cache["a"]

    def read(start: int, stop: int) -> np.ndarray:
        return flat()[start:stop]

    dtype = np.dtype(dtype).newbyteorder("=")
    return ArraySource(name, dtype, tuple(int(d) for d in shape),
                       default_layout(tuple(shape), dtype.itemsize, rows_per_block), read,
                       release=cache.clear)


def _lazy_access(path: str, handler):
    """The format's ``open_lazy``: names, dtypes and shapes from its index (no data read),
    one array read on demand, with its logical dtype."""
    lazy = handler.open_lazy(path)
    shapes = {name: lazy.spec(name) for name in lazy.names}
    return lazy.array, shapes, dict(lazy.meta), lazy.close


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        import json

        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return str(value)
