"""``.safetensors``, read and written by snapops itself, so bf16, f16 and float8 stay native.

Layout: an 8-byte little-endian header length N, N bytes of JSON (``name -> {dtype, shape,
data_offsets}`` and an optional ``__metadata__`` of strings), then the data. The reader
bounds N, checks every entry and that the declared extents tile the data exactly (no overlap,
no hole, no trailing bytes) before mapping anything; arrays are read-only views on one mmap.
The writer plans first (tensors by descending item size, then name, so every offset is
aligned), then writes in file order; snapshot metadata goes to ``__metadata__`` as strings.
The format has no integrity data: ``verify`` checks structure only, and says so.

>>> import ml_dtypes
>>> _ = FORMAT.save({"w": np.ones((2, 2), ml_dtypes.bfloat16)}, "w.safetensors", gen=1)
>>> snap = FORMAT.load("w.safetensors")
>>> snap["w"].dtype.name, snap.meta["gen"]
('bfloat16', 1)
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

from .atomic import atomic_write_digest
from .contract import Capabilities, SnapshotFormat, VerifyOptions, WriteResult
from .dtypes import dtype_name
from .errors import DataError, FormatError, LimitError, TruncatedError
from .iosafe import open_input
from .limits import check_shape
from .model import ArrayMapping, Snapshot, close_map, raw_bytes
from .report import Report

MAX_HEADER = 100 << 20          # the reference implementation's bound
MAX_NDIM = 64
DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I32": np.dtype("<i4"), "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
}
_CODES = {dtype_name(d): code for code, d in DTYPES.items()}


def parse_header(head: bytes, size: int, path: str) -> tuple[dict, dict[str, str], int]:
    """Entries ``name -> (dtype, shape, begin, end)``, ``__metadata__`` and the data start."""
    if size < 8:
        raise TruncatedError(path=path, offset=0, expected="an 8-byte header length",
                             got=f"{size} bytes")
    (length,) = struct.unpack("<Q", head[:8])
    if length > MAX_HEADER or 8 + length > size:
        raise LimitError("header length out of bounds", path=path, offset=0,
                         expected=f"<= {min(MAX_HEADER, size - 8)}", got=length)
    try:
        doc = json.loads(bytes(head[8:8 + length]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError("header is not UTF-8 JSON", path=path, offset=8) from exc
    except RecursionError:     # the C decoder stops a deep nesting so
        raise LimitError("header JSON nests too deeply", path=path, offset=8) from None
    if not isinstance(doc, dict):
        raise FormatError("header must be a JSON object", path=path, offset=8,
                          got=type(doc).__name__)
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError("__metadata__ must map strings to strings", path=path, offset=8)
    entries = {name: _entry(name, value, path) for name, value in doc.items()}
    _check_tiling(entries, size - 8 - length, path)
    return entries, meta, 8 + length


def _entry(name: str, value: Any, path: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
    ok = (isinstance(value, dict) and value.get("dtype") in DTYPES
          and isinstance(value.get("shape"), list) and len(value["shape"]) <= MAX_NDIM
          and all(type(d) is int and d >= 0 for d in value["shape"])
          and isinstance(value.get("data_offsets"), list) and len(value["data_offsets"]) == 2
          and all(type(o) is int and o >= 0 for o in value["data_offsets"]))
    if not ok:
        raise FormatError("bad tensor entry", path=path, array=name,
                          expected="{dtype: one of " + " ".join(DTYPES) + ", shape: [int...], "
                          "data_offsets: [begin, end]}", got=str(value)[:120])
    dtype, (begin, end) = DTYPES[value["dtype"]], value["data_offsets"]
    # numpy cannot hold some shapes of no bytes ((0, 2**62)): refused as any too large one
    nbytes = check_shape(name, value["shape"], dtype.itemsize, path=path)
    if end - begin != nbytes:
        raise FormatError("data_offsets disagree with dtype and shape", path=path, array=name,
                          expected=f"{nbytes} bytes", got=f"{end - begin} bytes")
    return dtype, tuple(value["shape"]), begin, end


def _check_tiling(entries: dict, data_len: int, path: str) -> None:
    """Declared extents cover the data exactly: no overlap, no hole, no trailing bytes."""
    at = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin != at:
            raise FormatError("tensor extents overlap or leave a hole", path=path, array=name,
                              expected=f"data_offsets starting at {at}", got=begin)
        at = end
    if at != data_len:
        raise FormatError("data does not end where the last tensor ends", path=path,
                          expected=f"{at} data bytes", got=data_len)


class SafetensorsFile(ArrayMapping):
    """An open ``.safetensors``: header checked, data mapped; ``[name]`` is a read-only view."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open_input(path) as handle:
                self.size = os.fstat(handle.fileno()).st_size
                self._mm = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) \
                    if self.size else None
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror}", path=path) from exc
        try:
            self.entries, self.meta, self.data_start = parse_header(
                self._mm if self._mm is not None else b"", self.size, path)
        except BaseException:
            self.close()
            raise
        self.names = sorted(self.entries)

    def _entry(self, name: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
        if name not in self.entries:
            raise FormatError("no such array", path=self.path, array=name,
                              expected="one of " + ", ".join(self.names[:8]), got=name)
        return self.entries[name]

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        dtype, shape, _, _ = self._entry(name)
        return dtype, shape

    def array(self, name: str) -> np.ndarray:
        dtype, shape, begin, end = self._entry(name)
        if begin == end:
            return np.zeros(shape, dtype)
        out = np.frombuffer(self._mm, dtype, (end - begin) // dtype.itemsize,
                            self.data_start + begin)
        return out.reshape(shape)

    def close(self) -> None:
        mm, self._mm = getattr(self, "_mm", None), None
        close_map(mm)


def snapshot_meta(meta: dict[str, str]) -> dict[str, Any]:
    """``__metadata__`` as snapshot meta: ``gen`` (written as its decimal text, all values
    are strings) comes back as the int it was."""
    out: dict[str, Any] = dict(meta)
    gen = out.get("gen")
    if isinstance(gen, str) and gen.isascii() and gen.isdigit() and str(int(gen)) == gen:
        out["gen"] = int(gen)
    return out


def plan(snapshot: Snapshot) -> tuple[bytes, list[str]]:
    """The header bytes (length prefix included) and the tensor order."""
    order = sorted(snapshot.arrays, key=lambda n: (-snapshot.arrays[n].dtype.itemsize,
                                                   n.encode("utf-8", "surrogatepass")))
    doc: dict[str, Any] = {}
    if snapshot.meta:
        doc["__metadata__"] = {str(k): v if isinstance(v, str) else json.dumps(v)
                               for k, v in sorted(snapshot.meta.items())}
    at = 0
    for name in order:
        array = snapshot.arrays[name]
        size = int(array.nbytes)
        doc[name] = {"dtype": _CODES[dtype_name(array.dtype)],
                     "shape": [int(d) for d in array.shape], "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, order


class Safetensors(SnapshotFormat):
    name = "safetensors"
    title = "safetensors"
    suffixes = (".safetensors",)
    capabilities = Capabilities(native_dtypes=frozenset(_CODES), mmap=True)

    def sniff(self, head: bytes) -> bool:
        return len(head) >= 10 and head[8:10] == b'{"' and \
            struct.unpack("<Q", head[:8])[0] <= MAX_HEADER

    def _save(self, snapshot: Snapshot, path: str, options: Any) -> WriteResult:
        if "__metadata__" in snapshot.arrays:
            raise DataError("safetensors: an array cannot be called __metadata__ (the "
                            "format's metadata key)")
        try:
            header, order = plan(snapshot)
        except (TypeError, ValueError) as exc:
            raise DataError(f"safetensors: metadata cannot be written: {exc}") from None
        with atomic_write_digest(path, stable=True) as out:
            out.write(header)
            for name in order:
                out.write(raw_bytes(snapshot.arrays[name]))
        return self.result(path, snapshot, out.size, out.hexdigest())

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        f = SafetensorsFile(path)
        try:
            return Snapshot({n: f.array(n) for n in f.names}, snapshot_meta(f.meta))
        finally:
            f.close()       # the map lives on while the arrays refer to it

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        f = SafetensorsFile(path)
        return f, snapshot_meta(f.meta)

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        def check() -> tuple[int, int]:
            with SafetensorsFile(path) as f:
                return len(f.names), sum(end - begin for *_, begin, end in f.entries.values())

        return self.checked(path, check, ("structure", "extents"),
                            "safetensors files carry no checksum: changed tensor bytes are "
                            "not detectable (structure checked only)")

    def _inspect(self, path: str) -> dict:
        with SafetensorsFile(path) as f:
            return {"file_size": f.size, "meta": snapshot_meta(f.meta),
                    "header": {"header_bytes": f.data_start - 8, "tensors": len(f.names)},
                    "arrays": [{"name": n, "data_offsets": list(f.entries[n][2:])}
                               for n in f.names]}


FORMAT = Safetensors()
