"""How payload bytes become arrays: the plan a writer follows and the entries a reader checks.

Two layouts, chosen by ``payload_layout.kind``:

``raw_dense`` (the peer's): one row-major matrix (``matrix_type`` DENSE_FLOAT or INTEGER,
``rows`` x ``cols``) or one vector (``VECTOR``, ``rows`` x 1) of ``data_type``. A view with
``is_transposed`` stores the transpose (read back as a zero-copy ``.T``); ``is_conjugated``
conjugates complex values (a copy); ``scalar`` must be 1 (snapops does not rescale stored
values). ``data_type`` BIT (bit-packed, LSB first; matrix rows padded to 64 bytes, vectors to
8) is unpacked to ``bool`` (a copy). snapops writes ``params = {"name", "crc32c"}``; the peer
writes ``{}`` and ignores params.

``snapops.arrays/v1`` (snapops' own): ``params = {"align": 64, "arrays": [...]}``, each entry
``{"name", "dtype", "shape", "offset", "length", "crc32c"?}`` with offsets relative to the
payload start. Entries are in name order (byte-wise), each starts at the previous end rounded
up to ``align``, padding is zero, and the last end is ``payload_length``: the extents tile the
payload with no overlap, no unexplained hole and no trailing bytes. ``matrix_type`` is
``SNAPOPS_ARRAYS``, ``data_type`` ``MIXED``, ``rows`` = ``cols`` = 0.
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError, FormatError, LimitError, UnsupportedVersionError
from ..model import Snapshot, raw_bytes
from . import _spec as S
from ._codec import encode_metadata


def identity_view() -> dict:
    """The view the peer writes for a plain matrix (``scalar`` as a map even when real)."""
    return {"is_conjugated": False, "is_transposed": False, "scalar": {"imag": 0.0, "real": 1.0}}


@dataclass(frozen=True)
class Entry:
    """One array: where its bytes are (``offset`` from the payload start) and how to read them."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]              # logical shape
    offset: int
    length: int
    crc32c: int | None = None
    stored_shape: tuple[int, ...] = ()
    transpose: bool = False
    conjugate: bool = False
    bits: int = 0                        # bit-packed BIT data: the row stride in bytes

    def to_dict(self) -> dict:
        out = {"name": self.name, "dtype": S.dtype_name(self.dtype) or str(self.dtype),
               "shape": list(self.shape), "offset": self.offset, "length": self.length}
        if self.crc32c is not None:
            out["crc32c"] = self.crc32c
        if self.transpose or self.conjugate or self.bits:
            out["stored"] = {"shape": list(self.stored_shape), "transpose": self.transpose,
                             "conjugate": self.conjugate, "bit_row_stride": self.bits}
        return out

    def materialize(self, buf, payload_offset: int) -> np.ndarray:
        """The array, a read-only view on ``buf`` unless unpacking or conjugation copies."""
        count = 1
        for d in self.stored_shape:
            count *= d
        if self.bits:
            out = _unpack_bits(buf, payload_offset + self.offset, self.stored_shape, self.bits)
        elif count == 0:
            out = np.zeros(self.stored_shape, self.dtype)
        else:
            out = np.frombuffer(buf, self.dtype, count, payload_offset + self.offset)
            out = out.reshape(self.stored_shape)
        if self.transpose:
            out = out.T.reshape(self.shape)         # a view (vectors: a reshape of one)
        if self.conjugate and out.dtype.kind == "c":
            out = np.conjugate(out)
        out.flags.writeable = False
        return out


def _unpack_bits(buf, at: int, stored_shape: tuple[int, ...], stride: int) -> np.ndarray:
    rows, cols = stored_shape if len(stored_shape) == 2 else (1, stored_shape[0])
    if rows * cols == 0:
        return np.zeros(stored_shape, bool)
    packed = np.frombuffer(buf, np.uint8, rows * stride, at).reshape(rows, stride)
    bits = np.unpackbits(packed, axis=1, count=cols, bitorder="little")
    return bits.astype(bool).reshape(stored_shape)


# ---- the write plan ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """Everything a writer needs: entries with final offsets and the buffers to write;
    :meth:`metadata` adds the CRCs and payload_uuid once the payload has been written."""

    kind: str
    entries: tuple[Entry, ...]
    buffers: tuple[memoryview, ...]
    payload_length: int
    meta: dict                          # snapshot meta, stored under "provenance"

    def metadata(self, crcs: list[int] | None, payload_uuid: Any = None) -> dict:
        entries = list(self.entries) if crcs is None else [
            _with_crc(e, c) for e, c in zip(self.entries, crcs)]
        out = identity_metadata(self.kind, entries)
        if payload_uuid is None and crcs is None:
            payload_uuid = "random"     # without CRCs a derived UUID would not track the bytes
        out["payload_uuid"] = _payload_uuid(payload_uuid, out)
        if self.meta:
            out["provenance"] = self.meta
        return out


def _with_crc(entry: Entry, crc: int | None) -> Entry:
    return Entry(entry.name, entry.dtype, entry.shape, entry.offset, entry.length, crc,
                 entry.stored_shape)


def plan_layout(snapshot: Snapshot, layout: str = "auto") -> Plan:
    """Decide the layout, order and offsets for ``snapshot`` (no bytes are written).

    ``layout="auto"`` writes one 1-D or 2-D array of a peer dtype as the peer's ``raw_dense``
    matrix or vector, anything else as ``snapops.arrays/v1``; ``"arrays"`` always uses the
    latter; ``"raw_dense"`` refuses what the peer cannot read.
    """
    if layout not in ("auto", "arrays", "raw_dense"):
        raise DataError(f"layout must be 'auto', 'arrays' or 'raw_dense', got {layout!r}")
    snapshot = Snapshot.coerce(snapshot)
    names = snapshot.sorted_names()
    if len(names) > S.MAX_ARRAYS:
        raise DataError(f"{len(names)} arrays; a PyCauset container holds at most {S.MAX_ARRAYS}")
    arrays = [snapshot.arrays[n] for n in names]
    peer = (len(arrays) == 1 and arrays[0].ndim in (1, 2)
            and S.peer_data_type(arrays[0].dtype) is not None)
    if layout == "raw_dense" and not peer:
        raise DataError("layout='raw_dense' holds exactly one 1-D or 2-D array of a peer dtype "
                        f"({', '.join(str(d) for d in S.PEER_DATA_TYPE)})")
    kind = S.RAW_DENSE if peer and layout != "arrays" else S.ARRAYS_KIND
    entries, pos = [], 0
    for name, array in zip(names, arrays):
        _check_array(name, array, kind)
        offset = S.align(pos, S.ARRAYS_ALIGN) if kind == S.ARRAYS_KIND else 0
        shape = tuple(int(d) for d in array.shape)
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        entries.append(Entry(name, dtype, shape, offset, int(array.nbytes), None, shape))
        pos = offset + int(array.nbytes)
    return Plan(kind, tuple(entries), tuple(raw_bytes(a) for a in arrays), pos,
                dict(snapshot.meta))


def _check_array(name: str, array: np.ndarray, kind: str) -> None:
    if len(name.encode("utf-8", "surrogatepass")) > S.MAX_NAME_BYTES:
        raise DataError(f"array name longer than {S.MAX_NAME_BYTES} bytes: {name[:40]!r}...")
    if kind == S.ARRAYS_KIND and S.dtype_name(array.dtype) is None:
        raise DataError(f"array {name!r}: dtype {array.dtype} has no PyCauset encoding "
                        f"(supported: {', '.join(S.ARRAY_DTYPES)})")
    if array.ndim > S.MAX_NDIM:
        raise DataError(f"array {name!r}: more than {S.MAX_NDIM} dimensions")


def identity_metadata(kind: str, entries: list[Entry]) -> dict:
    """rows, cols, seed, view, payload_layout, matrix_type, data_type for ``entries``."""
    if kind == S.RAW_DENSE:
        (e,) = entries
        params: dict[str, Any] = {"name": e.name}
        if e.crc32c is not None:
            params["crc32c"] = e.crc32c
        vector = len(e.shape) == 1
        return {"rows": e.shape[0], "cols": 1 if vector else e.shape[1], "seed": 0,
                "view": identity_view(), "payload_layout": {"kind": S.RAW_DENSE, "params": params},
                "matrix_type": "VECTOR" if vector else (
                    "INTEGER" if e.dtype.kind in "iu" else "DENSE_FLOAT"),
                "data_type": S.peer_data_type(e.dtype)}
    listing = []
    for e in entries:
        item = {"name": e.name, "dtype": S.dtype_name(e.dtype), "shape": list(e.shape),
                "offset": e.offset, "length": e.length}
        if e.crc32c is not None:
            item["crc32c"] = e.crc32c
        listing.append(item)
    return {"rows": 0, "cols": 0, "seed": 0, "view": identity_view(),
            "payload_layout": {"kind": S.ARRAYS_KIND,
                               "params": {"align": S.ARRAYS_ALIGN, "arrays": listing}},
            "matrix_type": S.ARRAYS_MATRIX_TYPE, "data_type": S.ARRAYS_DATA_TYPE}


def _payload_uuid(option: Any, identity: dict) -> str:
    """By default a UUID derived from the identity metadata (which holds every array's CRC-32C),
    so equal input gives equal bytes; ``"random"`` (a uuid4, as the peer does) or a fixed one."""
    if option is None:
        digest = bytearray(hashlib.sha256(b"snapops-pycauset-uuid\0" +
                                          encode_metadata(identity)).digest()[:16])
        digest[6] = (digest[6] & 0x0F) | 0x80      # RFC 9562 version 8, variant 10
        digest[8] = (digest[8] & 0x3F) | 0x80
        return bytes(digest).hex()
    if option == "random":
        return uuidlib.uuid4().hex
    try:
        return uuidlib.UUID(str(option)).hex
    except ValueError as exc:
        raise DataError(f"payload_uuid: {exc}") from exc


# ---- reading: metadata -> entries ---------------------------------------------------------------

def _bad(message: str, got: Any = None, expected: str | None = None, cls=FormatError,
         array: str | None = None) -> FormatError:
    return cls(message, expected=expected, got=got, array=array,
               check="limit" if cls is LimitError else "layout")


def _uint(value: Any, what: str, array: str | None = None) -> int:
    if type(value) is not int or value < 0:
        raise _bad(f"{what} must be a non-negative integer", value, "uint", array=array)
    return value


def _dim(value: Any, what: str, array: str | None = None) -> int:
    if _uint(value, what, array) > S.MAX_DIM:
        raise _bad(f"{what} too large", value, f"<= {S.MAX_DIM}", LimitError, array)
    return value


def parse_entries(meta: dict, payload_length: int) -> list[Entry]:
    """The arrays the typed metadata declares, checked against ``payload_length``."""
    layout = meta.get("payload_layout")
    if layout is not None and not isinstance(layout, dict):
        raise _bad("payload_layout must be a map", type(layout).__name__)
    kind = layout_kind(meta)
    matrix_type = meta.get("matrix_type")
    if kind == S.ARRAYS_KIND:
        if _view(meta) != (False, False):
            raise _bad(f"a {S.ARRAYS_KIND} container must have the identity view",
                       meta.get("view"), "is_transposed = is_conjugated = false",
                       UnsupportedVersionError)
        return _parse_arrays(layout.get("params"), payload_length)
    if matrix_type in (*S.PEER_MATRIX_TYPES, "VECTOR") and kind in (None, S.RAW_DENSE):
        return [_parse_raw_dense(meta, layout, payload_length)]
    raise _bad("payload layout not supported", f"matrix_type={matrix_type!r}, kind={kind!r}",
               f"raw_dense DENSE_FLOAT/INTEGER/VECTOR or {S.ARRAYS_KIND}",
               UnsupportedVersionError)


def layout_kind(meta: dict) -> Any:
    """``payload_layout.kind`` or None."""
    layout = meta.get("payload_layout")
    return layout.get("kind") if isinstance(layout, dict) else None


def _view(meta: dict) -> tuple[bool, bool]:
    view = meta.get("view", {})
    if not isinstance(view, dict):
        raise _bad("view must be a map", type(view).__name__)
    transposed, conjugated = view.get("is_transposed", False), view.get("is_conjugated", False)
    if type(transposed) is not bool or type(conjugated) is not bool:
        raise _bad("view.is_transposed / is_conjugated must be bools", (transposed, conjugated))
    scalar = view.get("scalar", 1.0)
    if isinstance(scalar, dict):
        scalar = (scalar.get("real"), scalar.get("imag"))
    else:
        scalar = (scalar, 0.0)
    if not all(type(x) in (int, float) for x in scalar) or scalar != (1, 0):
        raise _bad("view.scalar other than 1 is not supported (stored values are read as is)",
                   view.get("scalar"), "1.0 or {real: 1.0, imag: 0.0}", UnsupportedVersionError)
    return transposed, conjugated


def _name_and_crc(params: Any) -> tuple[str, int | None]:
    if not isinstance(params, dict):
        return S.DEFAULT_NAME, None
    name = params.get("name", S.DEFAULT_NAME)
    if not isinstance(name, str) or len(name.encode("utf-8", "surrogatepass")) > S.MAX_NAME_BYTES:
        raise _bad("payload_layout.params.name must be a string", name)
    crc = params.get("crc32c")
    if crc is not None and (type(crc) is not int or not 0 <= crc < 1 << 32):
        raise _bad("crc32c must be a 32-bit unsigned integer", crc, array=name)
    return name, crc


def _parse_raw_dense(meta: dict, layout: Any, payload_length: int) -> Entry:
    name, crc = _name_and_crc(layout.get("params") if isinstance(layout, dict) else None)
    rows, cols = _dim(meta.get("rows"), "rows"), _dim(meta.get("cols"), "cols")
    data_type, matrix_type = meta.get("data_type"), meta.get("matrix_type")
    transposed, conjugated = _view(meta)
    vector = matrix_type == "VECTOR"
    if vector and cols != 1:
        raise _bad("a VECTOR has cols = 1", cols, "1", array=name)
    if data_type == "BIT":
        dtype = np.dtype(bool)
    elif data_type in S.PEER_DTYPES:
        dtype = S.PEER_DTYPES[data_type]
    else:
        raise _bad("data_type not supported", data_type,
                   f"BIT or one of {', '.join(S.PEER_DTYPES)}", UnsupportedVersionError, name)
    if vector:
        stored, shape = (rows,), ((1, rows) if transposed else (rows,))
    else:
        stored = (cols, rows) if transposed else (rows, cols)
        shape = (rows, cols)
    if data_type == "BIT":
        stride = S.align((stored[-1] + 7) // 8, 8 if vector else 64)
        needed = stride * (1 if vector else stored[0])
    else:
        stride, needed = 0, rows * cols * dtype.itemsize
    # pycauset 0.6.1 stores one element of padding for an empty matrix: accept a little slack
    # there, nowhere else.
    if payload_length < needed or (payload_length > needed and not (needed == 0 and
                                                                     payload_length <= 64)):
        raise _bad("payload_length disagrees with rows, cols and data_type", payload_length,
                   str(needed), array=name)
    return Entry(name, dtype, shape, 0, needed, crc, stored, transposed,
                 conjugated and dtype.kind == "c", stride)


def _parse_arrays(params: Any, payload_length: int) -> list[Entry]:
    if not isinstance(params, dict) or not isinstance(params.get("arrays"), list):
        raise _bad(f"{S.ARRAYS_KIND} params must hold an 'arrays' list", params)
    align_to = params.get("align")
    if type(align_to) is not int or not 1 <= align_to <= S.PAYLOAD_ALIGN or \
            align_to & (align_to - 1):
        raise _bad("params.align must be a power of two in 1..4096", align_to)
    items = params["arrays"]
    if len(items) > S.MAX_ARRAYS:
        raise _bad("too many arrays", len(items), f"<= {S.MAX_ARRAYS}", LimitError)
    entries, names, pos = [], set(), 0
    for i, item in enumerate(items):
        entry = _parse_array_item(item, i)
        if entry.name in names:
            raise _bad("duplicate array name", entry.name, "unique names", array=entry.name)
        names.add(entry.name)
        if entry.offset != S.align(pos, align_to):
            raise _bad("array offsets do not tile the payload", entry.offset,
                       f"offset {S.align(pos, align_to)} (previous end aligned to {align_to})",
                       array=entry.name)
        pos = entry.offset + entry.length
        entries.append(entry)
    if pos != payload_length:
        raise _bad("arrays do not cover the payload exactly", payload_length,
                   f"payload_length {pos} (end of the last array)")
    return entries


_ITEM_KEYS = ("name", "dtype", "shape", "offset", "length")


def _parse_array_item(item: Any, i: int) -> Entry:
    if not isinstance(item, dict) or any(k not in item for k in _ITEM_KEYS):
        raise _bad(f"arrays[{i}] must be a map with {', '.join(_ITEM_KEYS)}", item)
    name, crc = _name_and_crc(item)
    dtype = S.ARRAY_DTYPES.get(item["dtype"]) if isinstance(item["dtype"], str) else None
    if dtype is None:
        raise _bad("unknown dtype", item["dtype"], ", ".join(S.ARRAY_DTYPES),
                   UnsupportedVersionError, name)
    shape = item["shape"]
    if not isinstance(shape, list) or len(shape) > S.MAX_NDIM:
        raise _bad(f"shape must be a list of at most {S.MAX_NDIM} sizes", shape, array=name)
    count, span = 1, dtype.itemsize
    for d in shape:
        count *= _dim(d, "a dimension", name)
        span *= max(d, 1)
    if span >= 1 << 62:        # numpy refuses such shapes even when they hold no element
        raise _bad("shape too large", shape, "a product of sizes below 2**62", LimitError, name)
    offset, length = _uint(item["offset"], "offset", name), _uint(item["length"], "length", name)
    if count * dtype.itemsize != length:
        raise _bad("length disagrees with shape and dtype", length,
                   str(count * dtype.itemsize), array=name)
    return Entry(name, dtype, tuple(shape), offset, length, crc, tuple(shape))
