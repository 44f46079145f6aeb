"""Spool files: a pinned generation on disk in a zero-encoding binary form.

Layout: ``SNAPSPOOL 1\\n`` + one line of JSON (gen, meta with ts (and rank and world in a
multi-rank run), and per array name, dtype, shape, offset, nbytes, crc32c, optional logical
dtype (bf16, c64, float8: held as the unsigned integer of their width), and for a rank's piece
of a global array its global_shape and offsets) + LF, zero padding to 64 bytes, then each
array's raw C-order bytes at a 64-aligned offset, in header order, with nothing after the last
one. Rank ``r`` of a multi-rank run names its files ``gen-<gen>-r<r>.spool``.
Written through the atomic helper (temp, fsync, rename) so a spool file is complete or absent;
read by mmap without copying. The CRC32C per array catches later corruption.

The header comes from another process and is checked before use: at most ``MAX_HEADER`` bytes
and ``MAX_DEPTH`` levels of nesting, no floats, NaN or
Infinity, integers of at most 20 digits, no duplicate keys, exactly the known keys, every value
of its type and range, unique array names, and extents that tile the file exactly. Any failure
raises FormatError (the daemon logs it and drops the generation as ``bad_spool``).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snapops.formats.atomic import atomic_write
from snapops.formats.dtypes import DTYPES as LOGICAL_DTYPES
from snapops.formats.dtypes import unsigned_for
from snapops.formats.errors import DataError, FormatError, LimitError, TruncatedError
from snapops.formats.integrity import crc32c
from snapops.formats.model import close_map

from .safeio import open_regular

MAGIC = b"SNAPSPOOL 1\n"
ALIGN = 64
MAX_HEADER = 16 << 20
MAX_ARRAYS = 1 << 20
MAX_DEPTH = 4                 # levels of objects/arrays: {"arrays": [{"shape": [...]}]}
MAX_NAME = 1024               # characters of an array name
MAX_DIMS = 32
MAX_GEN = 10**18 - 1          # what a WAL record can name
TS = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
MAX_RANK = 999_999            # what a WAL writer id can name
_HEADER_KEYS = frozenset({"gen", "meta", "arrays"})
_ENTRY_KEYS = frozenset({"name", "dtype", "shape", "offset", "nbytes", "crc32c"})
# "bf16": true is what clients before "logical" wrote for {"logical": "bf16"}; still read
_OPTIONAL_KEYS = frozenset({"logical", "bf16", "global_shape", "offsets"})
_NAME = re.compile(r"gen-([0-9]{12,18})(?:-r(0|[1-9][0-9]{0,5}))?\.spool")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# dtypes a spool holds as themselves
DTYPES = {"<f8", "<f4", "<f2", "<i8", "<u8", "<i4", "<u4", "<i2", "<u2", "|i1", "|u1", "|b1"}
# the others it carries as the unsigned integer of their width, named in the entry's "logical"
# (bf16, c64, the float8 family): {name: the stored dtype string}
LOGICAL = {name: LOGICAL_DTYPES[unsigned_for(dtype)].str for name, dtype in LOGICAL_DTYPES.items()
           if dtype.str not in DTYPES and unsigned_for(dtype) is not None}


def spool_name(gen: int, rank: int | None = None) -> str:
    """``gen-000000000012.spool``, or ``gen-000000000012-r3.spool`` for rank 3's part."""
    return f"gen-{gen:012d}.spool" if rank is None else f"gen-{gen:012d}-r{rank}.spool"


def _bytes(array: np.ndarray) -> memoryview:
    flat = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class SpoolEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc: int
    logical: str | None = None   # the array's dtype, stored as the same-width unsigned
    global_shape: tuple[int, ...] | None = None    # a rank's piece: the global array's shape
    offsets: tuple[int, ...] | None = None         # ... and where the piece starts in it


def plan(arrays: dict[str, np.ndarray]) -> tuple[list[dict], int]:
    """Entries (without CRCs) and the data size, arrays in the given order."""
    entries, at = [], 0
    for name, array in arrays.items():
        entries.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape),
                        "offset": at, "nbytes": int(array.nbytes)})
        at = _align(at + array.nbytes)
    return entries, at


def write_spool(path: str | os.PathLike, gen: int, arrays: dict[str, np.ndarray],
                meta: dict | None = None, logical: dict[str, str] | None = None,
                boxes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None) -> int:
    """Write one generation atomically; returns the file size. ``logical`` names the dtype of
    the arrays held as their unsigned bits ({name: "bf16"}); ``boxes`` gives the arrays that
    are pieces of global arrays: {name: (global_shape, offsets)}."""
    entries, _ = plan(arrays)
    for entry, array in zip(entries, arrays.values()):
        entry["crc32c"] = crc32c(_bytes(array))
        if logical and entry["name"] in logical:
            entry["logical"] = logical[entry["name"]]
        if boxes and entry["name"] in boxes:
            entry["global_shape"], entry["offsets"] = map(list, boxes[entry["name"]])
    header = _header(gen, meta, entries)
    if len(header) >= MAX_HEADER:   # the reader would refuse it: never write it
        raise DataError(f"spool header of {len(header)} bytes: expected under {MAX_HEADER} "
                        "(fewer or shorter array names)")
    head = MAGIC + header + b"\n"
    start = _align(len(head))
    with atomic_write(path) as out:
        out.write(head + bytes(start - len(head)))
        at = 0
        for entry, array in zip(entries, arrays.values()):
            if entry["offset"] > at:
                out.write(bytes(entry["offset"] - at))
            out.write(_bytes(array))
            at = entry["offset"] + entry["nbytes"]
    return start + at


def _header(gen: int, meta: dict | None, entries: list[dict]) -> bytes:
    return json.dumps({"gen": gen, "meta": meta or {}, "arrays": entries},
                      separators=(",", ":"), sort_keys=True).encode("utf-8")


# One entry of a request as :func:`check_request` takes it: name, little-endian dtype string,
# shape, logical dtype name (or None), and (global_shape, offsets) for a rank's piece of a global
# array, else None.
RequestEntry = tuple[str, str, tuple[int, ...], "str | None",
                     "tuple[tuple[int, ...], tuple[int, ...]] | None"]
_ENTRY_BOUND = 256    # bytes of an entry's JSON apart from its name and its size lists
_DIM_BOUND = 21       # bytes of one size in a list: 19 digits ("<= 1 << 62"), a comma


def check_request(gen, entries: list[RequestEntry], meta: dict | None = None) -> None:
    """DataError unless a spool file holding these arrays as generation ``gen`` passes
    :func:`parse_header`: the same rules (gen, names, dtypes, dimensions, boxes, number of
    arrays, header size), checked before anything is copied. Costs O(arrays), never a pass
    over the data."""
    try:
        _int(gen, "gen", MAX_GEN)
        if len(entries) > MAX_ARRAYS:
            raise _Bad("arrays", f"at most {MAX_ARRAYS} arrays", len(entries))
        bound = 0
        for name, dtype, shape, logical, box in entries:
            where = f"array {_short(name)}"
            _check_array(name, dtype, shape, logical, where)
            if box is not None:
                _check_box(tuple(shape), *map(list, box), where)
            bound += _ENTRY_BOUND + 12 * len(name) + _DIM_BOUND * len(shape) * (3 if box else 1)
        if bound >= MAX_HEADER - 4096 and len(_request_header(gen, entries, meta)) >= MAX_HEADER:
            raise _Bad("spool header", f"under {MAX_HEADER} bytes (fewer or shorter array "
                       "names)", f"{len(entries)} arrays")
    except _Bad as exc:
        raise DataError(exc.request_text()) from None


def _request_header(gen: int, entries: list[RequestEntry], meta: dict | None) -> bytes:
    """The header :func:`write_spool` would write (every CRC at its widest)."""
    out, at = [], 0
    for name, dtype, shape, logical, box in entries:
        nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
        entry = {"name": name, "dtype": dtype, "shape": list(shape), "offset": at,
                 "nbytes": nbytes, "crc32c": 0xFFFFFFFF}
        if logical is not None:
            entry["logical"] = logical
        if box is not None:
            entry["global_shape"], entry["offsets"] = map(list, box)
        out.append(entry)
        at = _align(at + nbytes)
    return _header(gen, meta, out)


def _short(name) -> str:
    text = repr(name)
    return text if len(text) <= 60 else text[:57] + "..."


class Spool:
    """A spool file opened by mmap: ``arrays()`` gives zero-copy views, CRC-checked.

    The file is opened without blocking or following symlinks and must be a regular file;
    the header is checked field by field (:func:`parse_header`) and the declared extents must
    tile the file exactly. Anything else raises FormatError.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        try:
            fd = open_regular(self.path)
        except OSError as exc:
            raise FormatError(path=self.path, expected="a readable regular spool file",
                              got=exc.strerror or str(exc)) from exc
        try:
            size = os.fstat(fd).st_size
            if size < len(MAGIC):
                raise TruncatedError(path=self.path, offset=0, expected="a spool header",
                                     got=f"{size} bytes")
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            self.gen, self.meta, self.entries, self.data_start = self._parse(size)
        except BaseException:
            self._map.close()
            raise

    def _parse(self, size: int):
        if self._map[:len(MAGIC)] != MAGIC:
            raise FormatError(path=self.path, offset=0, expected="SNAPSPOOL 1",
                              got=bytes(self._map[:12]))
        end = self._map.find(b"\n", len(MAGIC), min(size, len(MAGIC) + MAX_HEADER))
        if end < 0:
            raise LimitError(path=self.path, offset=len(MAGIC),
                             expected=f"a header line under {MAX_HEADER} bytes", got="none")
        gen, meta, entries = parse_header(self._map[len(MAGIC):end], self.path)
        start = _align(end + 1)
        data_end = entries[-1].offset + entries[-1].nbytes if entries else 0
        if size != start + data_end:
            raise FormatError(path=self.path, offset=size, check="extent",
                              expected=f"{start + data_end} bytes as the header declares",
                              got=f"{size} bytes")
        return gen, meta, entries, start

    def arrays(self, check: bool = True) -> dict[str, np.ndarray]:
        out = {}
        for e in self.entries:
            view = memoryview(self._map)[self.data_start + e.offset:
                                         self.data_start + e.offset + e.nbytes]
            if check and crc32c(view) != e.crc:
                raise FormatError(path=self.path, offset=self.data_start + e.offset,
                                  check="crc32c", expected=f"crc32c {e.crc:08x} for {e.name}",
                                  got=f"{crc32c(view):08x}")
            array = np.frombuffer(view, np.dtype(e.dtype)).reshape(e.shape)
            out[e.name] = array.view(LOGICAL_DTYPES[e.logical]) if e.logical else array
        return out

    def close(self) -> None:
        close_map(self._map)

    def __enter__(self) -> "Spool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Bad(ValueError):
    """A header value out of bounds; turned into FormatError by :func:`parse_header` (and into
    DataError by :func:`check_request`). ``_Bad(label, rule, got)`` reads ``label: rule, got
    got``; :meth:`request_text` says it as ``label: expected rule, got got``."""

    def __init__(self, label: str, rule: str | None = None, got: object = None) -> None:
        self.label, self.rule, self.got = label, rule, got
        super().__init__(self._text(""))

    def _text(self, expected: str) -> str:
        text = self.label if self.rule is None else f"{self.label}: {expected}{self.rule}"
        return text if self.got is None else f"{text}, got {str(self.got)[:40]}"

    def request_text(self) -> str:
        return self._text("expected ")


def parse_header(raw: bytes, path: str) -> tuple[int, dict, list[SpoolEntry]]:
    """gen, meta and entries of a spool header line (without its LF); FormatError if any
    field is missing, extra, of the wrong type or out of bounds (see the module docstring)."""
    try:
        header = _load_json(bytes(raw))
        if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
            raise _Bad(f"keys {sorted(_HEADER_KEYS)}")
        gen = _int(header["gen"], "gen", MAX_GEN)
        meta = _meta(header["meta"])
        raw_entries = header["arrays"]
        if not isinstance(raw_entries, list) or len(raw_entries) > MAX_ARRAYS:
            raise _Bad(f"arrays: a list of at most {MAX_ARRAYS} entries")
        entries, at = [], 0
        for index, e in enumerate(raw_entries):
            entry = _entry(e, index, at)
            entries.append(entry)
            at = _align(entry.offset + entry.nbytes)
        if len({e.name for e in entries}) != len(entries):
            raise _Bad("unique array names")
    except (_Bad, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise FormatError(path=path, offset=len(MAGIC), expected="a valid spool header",
                          got=str(exc)[:120]) from None
    return gen, meta, entries


def _load_json(raw: bytes):
    """Strict JSON: ints only, no duplicate keys, nesting bounded. The C parser stops a deep
    nesting with RecursionError (it counts its own recursion), which is turned into _Bad."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant,
                           parse_float=_no_float, parse_int=_bounded_int,
                           object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise _Bad(f"nesting deeper than {MAX_DEPTH} levels") from None
    level, todo = 0, [value]
    while todo:  # breadth first, one level at a time
        level += 1
        if level > MAX_DEPTH:
            raise _Bad(f"nesting deeper than {MAX_DEPTH} levels")
        todo = [child for item in todo if isinstance(item, (dict, list))
                for child in (item.values() if isinstance(item, dict) else item)
                if isinstance(child, (dict, list))]
    return value


def _no_constant(name: str):
    raise _Bad(f"{name} (not a JSON number)")


def _no_float(text: str):
    raise _Bad(f"a number with a fraction or exponent: {text[:40]}")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 20:
        raise _Bad("an integer of more than 20 digits")
    return int(text)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Bad("an object with a duplicate key")
    return out


def _int(value, what: str, high: int) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise _Bad(what, f"an integer in 0..{high}", value)
    return value


def _meta(meta) -> dict:
    if not isinstance(meta, dict) or not set(meta) <= {"ts", "rank", "world"} or \
            ("rank" in meta) != ("world" in meta):
        raise _Bad("meta: an object with the key ts, and rank and world together")
    if "world" in meta and not _int(meta["rank"], "meta.rank", MAX_RANK) < \
            _int(meta["world"], "meta.world", MAX_RANK + 1):
        raise _Bad("meta.rank: below meta.world")
    ts = meta.get("ts")
    if ts is not None:
        if not isinstance(ts, str) or not TS.fullmatch(ts):
            raise _Bad(f"meta.ts: YYYY-MM-DDTHH:MM:SSZ, got {str(ts)[:40]}")
        try:
            time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            raise _Bad(f"meta.ts: a real date and time, got {ts}") from None
    return meta


def _entry(e, index: int, offset: int) -> SpoolEntry:
    where = f"arrays[{index}]"
    if not isinstance(e, dict) or not _ENTRY_KEYS <= set(e) <= _ENTRY_KEYS | _OPTIONAL_KEYS:
        raise _Bad(f"{where}: keys {sorted(_ENTRY_KEYS)} and optionally "
                   f"{sorted(_OPTIONAL_KEYS)}")
    name, dtype, shape = e["name"], e["dtype"], e["shape"]
    logical = e.get("logical")
    if "bf16" in e:
        if type(e["bf16"]) is not bool or "logical" in e:
            raise _Bad(f"{where}.bf16", "a boolean, and no logical beside it")
        logical = "bf16" if e["bf16"] else None
    dims = _check_array(name, dtype, shape, logical, where, sep=".")
    nbytes = _int(e["nbytes"], f"{where}.nbytes", 1 << 62)
    if nbytes != int(np.prod(dims, dtype=object)) * np.dtype(dtype).itemsize:
        raise _Bad(f"{where}.nbytes: shape x itemsize")
    if _int(e["offset"], f"{where}.offset", 1 << 62) != offset:
        raise _Bad(f"{where}.offset: {offset} (arrays in order, 64-aligned, no gaps)")
    return SpoolEntry(name, dtype, dims, offset, nbytes,
                      _int(e["crc32c"], f"{where}.crc32c", 0xFFFFFFFF), logical,
                      *_box(e, dims, where))


def _check_array(name, dtype, shape, logical, where: str, sep: str = " ") -> tuple[int, ...]:
    """The rules of one array's name, dtype, shape and logical dtype (a header entry's, or a
    request's: :func:`check_request`); returns the shape as a tuple."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or _CONTROL.search(name):
        raise _Bad(f"{where}{sep}name", f"1 to {MAX_NAME} printable characters")
    if dtype not in DTYPES:
        raise _Bad(f"{where}{sep}dtype", f"one of {sorted(DTYPES)}", str(dtype)[:20])
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
        raise _Bad(f"{where}{sep}shape", f"a list of at most {MAX_DIMS} sizes",
                   f"{len(shape)} sizes" if isinstance(shape, (list, tuple)) else None)
    dims = tuple(_int(d, f"{where}{sep}shape", 1 << 62) for d in shape)
    if logical is not None and (not isinstance(logical, str) or LOGICAL.get(logical) != dtype):
        raise _Bad(f"{where}{sep}logical", "bf16, c64 or a float8 dtype, carried as the "
                   "unsigned integer of its width", f"{str(logical)[:20]} as {dtype}")
    return dims


def _box(e: dict, dims: tuple[int, ...], where: str):
    """(global_shape, offsets) of a piece, both absent or both present and holding it."""
    if ("global_shape" in e) != ("offsets" in e):
        raise _Bad(f"{where}: global_shape and offsets together")
    if "global_shape" not in e:
        return None, None
    return _check_box(dims, e["global_shape"], e["offsets"], where, sep=".")


def _check_box(dims: tuple[int, ...], global_shape, offsets, where: str, sep: str = " "):
    sizes = []
    for key, value in (("global_shape", global_shape), ("offsets", offsets)):
        if not isinstance(value, list) or len(value) != len(dims):
            raise _Bad(f"{where}{sep}{key}", f"a list of {len(dims)} sizes")
        sizes.append(tuple(_int(d, f"{where}{sep}{key}", 1 << 62) for d in value))
    if any(o + n > g for g, o, n in zip(*sizes, dims)):
        raise _Bad(f"{where}: the piece at offsets {list(sizes[1])} does not fit in "
                   f"global_shape {list(sizes[0])}")
    return sizes[0], sizes[1]


def spool_files(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """(gen, path) of every spool file in ``folder`` (ranks' parts included), by gen."""
    found = []
    for path in Path(folder).glob("gen-*.spool"):
        m = _NAME.fullmatch(path.name)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)
