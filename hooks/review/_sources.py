"""Array sources for review: one uniform, lazy view of any supported snapshot file.

A source lists its arrays (name, dtype, shape) without reading them and hands out element
ranges on demand, so a diff walks two files array by array and block by block in bounded
memory. WTXT goes through its chunk index (``snapops.formats.wtxt.open_index``): each
chunk's SHA-256 comes from the ch lines alone, so unchanged chunks are recognised without
decoding them, and the chunks that are needed are decoded on demand.

Review does not verify: the bodies are decoded without the parity/CRC/hash checks of the
WTXT reader (``snapops verify`` and the hooks do that). Malformed text still raises
``FormatError``, never a bare numpy or base64 error.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from snapops.formats.errors import FormatError, TruncatedError
from snapops.formats.iosafe import open_regular, read_error
from snapops.formats.limits import DEFAULT_LIMITS, DeclaredLimits, check_declared
from snapops.formats.model import le_contiguous
from snapops.formats.registry import detect

from ._npz import npz_members


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


def open_snapshot(path: str | os.PathLike, *, rows_per_block: int | None = None,
                  limits: DeclaredLimits = DEFAULT_LIMITS) -> SnapshotSource:
    """Open any supported snapshot for review (``detect`` picks the format). Every array's
    declared size is bounded by ``limits`` (and by the file) before anything is read.

    Example::

        with open_snapshot("state.npz") as snap:
            first = snap.arrays[snap.names()[0]].read(0, 10)
    """
    handler = detect(path)
    if handler.capabilities.streams_text:  # WTXT: chunks compared by their ch-line digests
        return _open_wtxt(os.fspath(path), rows_per_block)
    return _open_generic(os.fspath(path), handler, rows_per_block, limits)


# --- WTXT -----------------------------------------------------------------------------------

def _open_wtxt(path: str, rows_per_block: int | None) -> SnapshotSource:
    from snapops.formats.wtxt import open_index
    from snapops.formats.wtxt.read import header_info

    index = open_index(path)
    try:
        info = header_info(index.header)
        meta = {k: _text(v) for k, v in info.__dict__.items()
                if v is not None and k not in ("gen_text", "root_pending")}
        # header_end is past the root line, or past the sign line when the file is signed
        header = bytes(index.buffer[:index.header_end]).decode("ascii").splitlines()[1:]
        source = SnapshotSource("wtxt", meta, header)
        source.closers.append(index.close)
        logical = wtxt_logical(index)
        for item in index.arrays:
            name, dtype = logical[item.name]
            source.arrays[name] = _wtxt_source(index, item, name, dtype, rows_per_block)
    except FormatError as exc:
        index.close()
        raise exc.located(path) from None
    except BaseException:
        index.close()
        raise
    return source


def wtxt_logical(index) -> dict[str, tuple[str, np.dtype]]:
    """Stored name -> (original name, logical dtype) of every array of an open WTXT index,
    from its audit line's ``snapops_names`` and ``snapops_dtypes`` records, applied by the
    functions ``snapops.load`` applies them with (``layer__0__weight`` stored as ``u16`` is
    ``layer.0.weight``, ``bf16``). Review does not verify: the records are not checked
    against the header's digest of the audit line (``snapops verify`` does that)."""
    from snapops.formats.dtypes import DTYPE_META_KEY, restore_logical
    from snapops.formats.wtxt.logical import NAMES_KEY, audit_pairs, original_names

    audit = index.audit[len(b"audit "):].decode("ascii") if index.audit else None
    pairs = audit_pairs(audit)
    stored = {item.name: item.line.np_dtype for item in index.arrays}
    names = original_names(list(stored), pairs.get(NAMES_KEY))
    carriers = {names[key]: np.empty(0, dtype) for key, dtype in stored.items()}
    logical, _ = restore_logical(carriers, pairs.get(DTYPE_META_KEY))
    return {key: (names[key], logical[names[key]].dtype) for key in stored}


def _wtxt_source(index, item, name: str, dtype: np.dtype, rows_per_block: int | None
                 ) -> ArraySource:
    """One WTXT array through the file's chunk index under its original ``name`` and logical
    ``dtype`` (the stored bits viewed as it): chunk SHA-256 values from the ch lines,
    elements decoded chunk by chunk on demand (without the checks: review does not verify)."""
    shape, plan = tuple(item.line.shape), item.plan
    itemsize = dtype.itemsize
    row_elems = int(np.prod(shape[1:], dtype=object)) if len(shape) > 1 else 1
    n = plan.nbytes // itemsize
    native = Layout(n, max(1, plan.chunk_len // itemsize), max(row_elems, 1))
    layout = native if rows_per_block is None else default_layout(shape, itemsize,
                                                                   rows_per_block)

    def read(start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty(0, dtype)
        first = start * itemsize // plan.chunk_len
        last = (stop * itemsize - 1) // plan.chunk_len
        raw = index.decode(item.name, first, last - first + 1, check=False)
        skip = start * itemsize - first * plan.chunk_len
        return raw[skip:skip + (stop - start) * itemsize].view(dtype)

    digests = (lambda: index.chunk_sha256(item.name)) if layout == native and n else None
    return ArraySource(name, dtype, shape, layout, read, digests, item.line.sha256)


# --- every other format --------------------------------------------------------------------

def _open_generic(path: str, handler, rows_per_block: int | None,
                  limits: DeclaredLimits) -> SnapshotSource:
    """Streamed access for .npz members and .safetensors tensors (bounded memory), per-array
    lazy access where the format offers it (``open_lazy`` with ``names`` and ``[name]``),
    else one ``load``."""
    streamed = STREAMED.get(handler.name)
    if streamed is not None:
        return streamed(path, rows_per_block, limits)
    getter, names, meta, close = _lazy_access(path, handler)
    source = SnapshotSource(handler.name, {k: _text(v) for k, v in meta.items()}, [])
    source.closers.append(close)
    for name, (dtype, shape) in names.items():
        check_declared(name, _nbytes(dtype, shape), limits, path)
        source.arrays[name] = _ndarray_source(name, dtype, shape, getter, rows_per_block)
    return source


def _nbytes(dtype, shape) -> int:
    return int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize


def _open_npz(path: str, rows_per_block: int | None, limits: DeclaredLimits
              ) -> SnapshotSource:
    """Members streamed; snapops' metadata member gives the meta lines and the logical
    dtypes of arrays stored as same-width unsigned integers (bf16 shows as bf16)."""
    from snapops.formats.dtypes import DTYPE_META_KEY, DTYPES, decode_record
    from snapops.formats.npz import read_meta

    archive, members = npz_members(path, limits)
    source = SnapshotSource("npz", {}, [])
    source.closers.append(archive.close)
    try:
        meta = read_meta(archive, path)
        record = meta.pop(DTYPE_META_KEY, None)
        logical = decode_record(str(record), {n: np.empty(0, m.dtype) for n, m in
                                              members.items()}) if record else {}
    except FormatError as exc:
        archive.close()
        raise exc.located(path) from None
    source.meta = {k: _text(v) for k, v in meta.items()}
    for name, member in members.items():
        dtype, read = member.dtype, member.read
        if name in logical:
            dtype = DTYPES[logical[name]]
            read = _viewed(member.read, dtype)
        source.arrays[name] = ArraySource(
            name, dtype, member.shape,
            default_layout(member.shape, dtype.itemsize, rows_per_block), read,
            release=member.release)
    return source


def arrays_source(format: str, arrays: dict[str, np.ndarray], meta: dict[str, str] | None = None,
                  *, rows_per_block: int | None = None) -> SnapshotSource:
    """Arrays already in memory (or mapped), e.g. a generation reassembled from its shards,
    as a SnapshotSource for :func:`~snapops.hooks.review._compare.diff_snapshots`."""
    source = SnapshotSource(format, dict(meta or {}), [])
    for name, array in arrays.items():
        source.arrays[name] = _ndarray_source(name, array.dtype, array.shape, arrays.__getitem__,
                                              rows_per_block)
    return source


def _viewed(read: Callable[[int, int], np.ndarray], dtype: np.dtype):
    return lambda start, stop: read(start, stop).view(dtype)


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


def _open_safetensors(path: str, rows_per_block: int | None, limits: DeclaredLimits
                      ) -> SnapshotSource:
    """Tensors read block by block with ``pread`` (bounded memory), after snapops' own header
    check (every dtype, BF16 and float8 too; extents tile the data exactly); arrays stored
    as same-width unsigned integers show their logical dtype."""
    from snapops.formats.dtypes import DTYPE_META_KEY, DTYPES, decode_record
    from snapops.formats.safetensors import MAX_HEADER, parse_header

    try:
        fd = open_regular(path, os.O_RDONLY, follow=True)   # a FIFO or device: refused
    except OSError as exc:
        raise read_error(path, exc) from exc
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        length = int.from_bytes(head, "little") if len(head) == 8 else 0
        head += os.pread(fd, min(length, MAX_HEADER, max(size - 8, 0)), 8)
        entries, meta, data_start = parse_header(head, size, path)
        meta = dict(meta)
        record = meta.pop(DTYPE_META_KEY, None)
        logical = decode_record(record, {n: np.empty(0, e[0]) for n, e in entries.items()}) \
            if record else {}
    except FormatError as exc:
        os.close(fd)
        raise exc.located(path) from None
    except BaseException:
        os.close(fd)
        raise
    source = SnapshotSource("safetensors", {k: _text(v) for k, v in meta.items()}, [])
    source.closers.append(lambda: os.close(fd))
    for name, (stored, shape, begin, _) in entries.items():
        dtype = DTYPES[logical[name]] if name in logical else stored
        check_declared(name, _nbytes(dtype, shape), limits, path)
        source.arrays[name] = ArraySource(
            name, dtype.newbyteorder("="), shape,
            default_layout(shape, dtype.itemsize, rows_per_block),
            _range_reader(fd, data_start + begin, math.prod(shape), stored, dtype, path, name))
    return source


def _range_reader(fd: int, at: int, count: int, stored: np.dtype, dtype: np.dtype, path: str,
                  name: str):
    """``read(start, stop)`` of elements (as a slice of the ``count`` elements would) of a
    tensor whose data starts at byte ``at``."""
    size = stored.itemsize

    def read(start: int, stop: int) -> np.ndarray:
        start, stop, _ = slice(start, stop).indices(count)
        want = max(stop - start, 0) * size
        data = os.pread(fd, want, at + start * size)
        if len(data) != want:
            raise TruncatedError(path=path, array=name, expected=f"{want} bytes",
                                 got=len(data))
        values = np.frombuffer(data, stored)
        values = values.view(dtype) if dtype != stored else values
        return values.astype(values.dtype.newbyteorder("="), copy=False)
    return read


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        import json

        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return str(value)


# formats whose members are read block by block here (bounded memory for any member size)
STREAMED = {"npz": _open_npz, "safetensors": _open_safetensors}
