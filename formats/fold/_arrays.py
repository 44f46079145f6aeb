"""How snapops stores arrays in FOLD, and how peer chunks (TSAV, NPZ0) become arrays.

snapops layout (``metadata.snapops.layout == "ndarray/1"``), no pickle anywhere:

* each array is one or more chunks of ctype ``NDAR`` whose payloads, concatenated, are the
  array's C-order little-endian bytes (split every ``segment`` bytes, 16 MiB by default, so
  chunks compress in parallel and stay far below MAX_CHUNK_SIZE);
* chunk names: the array's name for the first piece, ``name#1``, ``name#2``... for the others;
* ``metadata.snapops.arrays`` lists, in the file's (byte-wise sorted) order,
  ``{"name", "dtype", "shape", "chunks"}`` with ``dtype`` numpy's little-endian ``dtype.str``
  (``"<f4"``, ``"|b1"``, ``"<M8[ns]"``, ``"<U3"``...) or an ml_dtypes name (``"bfloat16"``,
  ``"float8_e4m3fn"``...), and ``chunks`` the piece names in order;
* ``metadata.snapops.meta`` holds the snapshot's metadata (JSON scalars).

The table sits in ``metadata``, so ``manifest_hash`` covers names, dtypes and shapes, and
``chunk_hashes`` ties every piece's SHA-256 to it.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError, FormatError, LimitError, UnsupportedVersionError
from ..model import Snapshot, le_contiguous
from ..npz import ZIP_ERRORS
from ._layout import ChunkEntry

NDAR = "NDAR"
TSAV = "TSAV"
NPZ0 = "NPZ0"
JSON = "JSON"
LAYOUT = "ndarray/1"
SEGMENT = 16 * 1024 * 1024
TABLE_KEYS = ("name", "dtype", "shape", "chunks")
_DTYPE = re.compile(r"[<|][a-zA-Z?][0-9]{1,10}(\[[0-9]{0,10}[a-zA-Z]{1,3}\])?")
_ML_NAME = re.compile(r"[a-z][a-z0-9_]{1,31}")
_MAX_NDIM = 64


@dataclass(frozen=True)
class ArraySpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


# -- writing ------------------------------------------------------------------------------------

def dtype_str(array: np.ndarray, name: str) -> str:
    """numpy's little-endian ``dtype.str``, or the ml_dtypes name (``"bfloat16"``...), whose
    ``dtype.str`` (``"<V2"``) would lose the type."""
    dt = array.dtype
    if dt.type.__module__.partition(".")[0] == "ml_dtypes":
        if _ml_dtype(dt.name) != dt:
            raise DataError(f"array {name!r}: dtype {dt} has no portable name")
        return dt.name
    if dt.hasobject or dt.names is not None or dt.subdtype is not None or dt.itemsize == 0:
        raise DataError(f"array {name!r}: dtype {dt} cannot be stored in FOLD "
                        "(object, structured, sub-array and zero-size dtypes are refused)")
    le = le_contiguous(np.empty(0, dt)).dtype
    if not _DTYPE.fullmatch(le.str) or np.dtype(le.str) != le:
        raise DataError(f"array {name!r}: dtype {dt} has no portable name")
    return le.str


def _ml_dtype(name: str) -> np.dtype | None:
    """An ml_dtypes type (bfloat16, float8_*, int4...) by name; None if unknown."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    kind = getattr(ml_dtypes, name, None)
    try:
        dt = np.dtype(kind) if isinstance(kind, type) else None
    except TypeError:
        return None
    return dt if dt is not None and dt.name == name else None


def plan_arrays(snapshot: Snapshot, segment: int = SEGMENT
                ) -> tuple[list[tuple[str, memoryview]], list[dict]]:
    """Pieces ``(chunk name, raw bytes)`` in file order, and the ``arrays`` table."""
    if segment <= 0:
        raise DataError(f"segment must be positive, got {segment}")
    pieces: list[tuple[str, memoryview]] = []
    table: list[dict] = []
    taken: set[str] = set()
    for name in snapshot.sorted_names():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"array name {name!r} is not valid UTF-8") from None
        array = snapshot.arrays[name]
        dtype = dtype_str(array, name)
        raw = memoryview(le_contiguous(array).reshape(-1).view(np.uint8))
        starts = range(0, max(len(raw), 1), segment)
        names = [name if i == 0 else f"{name}#{i}" for i in range(len(starts))]
        for chunk_name, start in zip(names, starts, strict=True):
            if chunk_name in taken:
                raise DataError(f"chunk name {chunk_name!r} is used twice "
                                "(an array name collides with another array's piece name)")
            taken.add(chunk_name)
            pieces.append((chunk_name, raw[start:start + segment]))
        table.append({"name": name, "dtype": dtype, "shape": [int(d) for d in array.shape],
                      "chunks": names})
    return pieces, table


def meta_json(meta: dict) -> dict:
    out = {}
    for key, value in meta.items():
        if not isinstance(key, str) or not (value is None or isinstance(value, (str, int, float))):
            raise DataError(f"meta {key!r}: only str keys and str/int/float/bool values are "
                            f"stored in FOLD, got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"meta {key!r}: {value} is not representable in JSON")
        out[key] = value
    return out


# -- reading ------------------------------------------------------------------------------------

def parse_table(metadata: dict, by_name: dict[str, ChunkEntry], where: dict
                ) -> tuple[list[ArraySpec], dict] | None:
    """The snapops array table, validated against the chunks; None for a peer file."""
    if "snapops" not in metadata:
        if any(c.ctype == NDAR for c in by_name.values()):
            raise FormatError("NDAR chunks without metadata.snapops", **where,
                              expected="an array table", got="none")
        return None
    section = metadata["snapops"]
    if not isinstance(section, dict) or section.get("layout") != LAYOUT:
        got = section.get("layout") if isinstance(section, dict) else type(section).__name__
        raise UnsupportedVersionError("snapops array layout", **where, expected=LAYOUT, got=got)
    rows, meta = section.get("arrays"), section.get("meta", {})
    if not isinstance(rows, list):
        raise FormatError("metadata.snapops.arrays", **where, expected="array",
                          got=type(rows).__name__)
    if not isinstance(meta, dict) or not all(
            v is None or isinstance(v, (str, int, float)) for v in meta.values()):
        raise FormatError("metadata.snapops.meta", **where, expected="object of scalars",
                          got=str(meta)[:80])
    used: set[str] = set()
    specs = [_parse_row(row, by_name, used, where) for row in rows]
    if len({s.name for s in specs}) != len(specs):
        raise FormatError("array names repeat", **where, expected="unique names",
                          got=sorted(s.name for s in specs)[:5])
    orphans = [c.name for c in by_name.values() if c.ctype == NDAR and c.name not in used]
    if orphans:
        raise FormatError("NDAR chunks no array refers to", **where,
                          expected="every NDAR chunk in the table", got=orphans[:5])
    return specs, meta


def _parse_row(row: Any, by_name: dict[str, ChunkEntry], used: set[str], where: dict
               ) -> ArraySpec:
    if not isinstance(row, dict) or tuple(sorted(row)) != tuple(sorted(TABLE_KEYS)):
        raise FormatError("array table row", **where, expected="keys " + ", ".join(TABLE_KEYS),
                          got=str(row)[:80])
    name, dtype, shape, chunks = (row[k] for k in TABLE_KEYS)
    ok = (isinstance(name, str) and isinstance(dtype, str) and isinstance(shape, list)
          and isinstance(chunks, list) and len(shape) <= _MAX_NDIM and chunks
          and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**62
                  for d in shape)
          and all(isinstance(c, str) for c in chunks))
    if not ok:
        raise FormatError("array table row", **where, array=str(name)[:80],
                          expected="name, dtype, shape (<= 64 dims), non-empty chunk list",
                          got=str(row)[:120])
    if math.prod(max(d, 1) for d in shape) >= 2**62:
        raise LimitError("array shape too large", **where, array=name, expected="< 2**62",
                         got=shape)
    dt = parse_dtype(dtype, name, where)
    nbytes = 0
    for c in chunks:
        entry = by_name.get(c)
        if entry is None or entry.ctype != NDAR or c in used:
            why = "missing" if entry is None else "reused" if c in used else entry.ctype
            raise FormatError(f"array piece {c!r}", **where, array=name,
                              expected="an unused NDAR chunk", got=why)
        used.add(c)
        nbytes += entry.uncomp_len
    spec = ArraySpec(name, dt, tuple(shape), tuple(chunks))
    if nbytes != spec.nbytes:
        raise FormatError("array pieces do not add up to the array", **where, array=name,
                          expected=f"{spec.nbytes} bytes", got=nbytes)
    return spec


def parse_dtype(text: str, name: str, where: dict) -> np.dtype:
    if _ML_NAME.fullmatch(text):
        dt = _ml_dtype(text)
        if dt is None:
            raise UnsupportedVersionError("array dtype", **where, array=name,
                                          expected="a numpy or ml_dtypes dtype", got=text)
        return dt
    try:
        dt = np.dtype(text) if _DTYPE.fullmatch(text) else None
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt.str != text or dt.hasobject or dt.itemsize == 0 or dt.names:
        raise FormatError("array dtype", **where, array=name,
                          expected="a little-endian numpy dtype string", got=text)
    return dt


def alloc(nbytes: int, where: dict, name: str) -> np.ndarray:
    """A flat uint8 buffer (untouched pages cost nothing until written)."""
    try:
        return np.empty(nbytes, np.uint8)
    except (MemoryError, ValueError) as exc:
        raise LimitError("cannot allocate the declared size", **where, array=name,
                         expected="memory for the array", got=nbytes) from exc


def shaped(flat: np.ndarray, spec: ArraySpec) -> np.ndarray:
    return flat.view(spec.dtype).reshape(spec.shape)


# -- peer chunks --------------------------------------------------------------------------------

def torch_arrays(raw, chunk: str, trusted: bool, where: dict) -> tuple[dict, dict]:
    """Arrays and scalar fields of a TSAV chunk (``torch.save`` of ``{"state_dict": ...}``)."""
    try:
        import torch
    except ImportError:
        raise UnsupportedVersionError(
            f"chunk {chunk!r} is a torch pickle (TSAV); reading it needs torch "
            "(pip install torch)", **where, expected="torch installed", got="no torch") from None
    try:   # a pickle can fail in any way; weights_only refuses anything but tensors and plain data
        obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=not trusted)
    except Exception as exc:
        raise FormatError(f"chunk {chunk!r}: torch.load(weights_only={not trusted}) refused "
                          "the payload", **where, check="torch_load", got=str(exc)[:200]) from exc
    state = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict):
        raise FormatError(f"chunk {chunk!r}", **where, expected="a dict with a state_dict",
                          got=type(obj).__name__)
    arrays, meta = {}, {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            arrays[str(key)] = _tensor_numpy(value, f"{chunk}:{key}", where)
    if state is not obj:
        for key, value in obj.items():
            if key != "state_dict" and (value is None or isinstance(value, (str, int, float))):
                meta[f"fold.{chunk}.{key}"] = value
    skipped = [str(k) for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if skipped:
        meta[f"fold.{chunk}.skipped"] = ",".join(skipped)
    return arrays, meta


def _tensor_numpy(tensor, name: str, where: dict) -> np.ndarray:
    """A tensor as numpy; bf16 and float8 become their ml_dtypes types, bit for bit."""
    import torch

    tensor = tensor.detach().cpu().contiguous()
    try:
        return tensor.numpy().copy()
    except (TypeError, RuntimeError) as exc:   # bf16, float8, sparse, quantized...
        ml = _ml_dtype(str(tensor.dtype).removeprefix("torch."))
        if ml is not None and not tensor.is_sparse and not tensor.is_quantized:
            raw = {1: torch.uint8, 2: torch.int16}.get(ml.itemsize)
            if raw is not None and tensor.element_size() == ml.itemsize:
                return tensor.view(raw).numpy().view(ml).copy()
        raise UnsupportedVersionError(f"tensor {name!r} has no numpy equivalent", **where,
                                      expected="a numpy or ml_dtypes dtype",
                                      got=str(tensor.dtype)) from exc


def npz_arrays(raw, chunk: str, max_bytes: int, where: dict) -> dict[str, np.ndarray]:
    """Members of an NPZ0 chunk (``numpy.savez_compressed``), without pickle and bounded:
    each member's declared shape must match its stored size before anything is allocated."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
        infos = archive.infolist()
    except ZIP_ERRORS as exc:
        raise FormatError(f"chunk {chunk!r} is not a zip archive", **where, check="npz",
                          got=str(exc)) from exc
    total = sum(i.file_size for i in infos)
    if total > max_bytes:
        raise LimitError(f"chunk {chunk!r} expands too much", **where,
                         expected=f"<= {max_bytes} bytes", got=total)
    arrays = {}
    with archive:
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            try:
                with archive.open(info) as member:
                    arrays[key] = _read_npy(member, info.file_size)
            except FormatError as exc:
                raise type(exc)(f"chunk {chunk!r} member {key!r}: {exc.message}", **where,
                                expected=exc.expected, got=exc.got) from exc
            except Exception as exc:   # zipfile and numpy's header parser raise many kinds
                raise FormatError(f"chunk {chunk!r} member {key!r} is not a readable .npy",
                                  **where, check="npz", got=str(exc)[:200]) from exc
    return arrays


def _read_npy(member, size: int) -> np.ndarray:
    fmt = np.lib.format
    version = fmt.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(member)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = fmt.read_array_header_2_0(member)
    else:
        raise FormatError("npy version", expected="1.0, 2.0 or 3.0", got=version)
    if dtype.hasobject:
        raise FormatError("npy member needs pickle (object array); refused",
                          expected="a plain dtype", got=str(dtype))
    nbytes = math.prod(shape) * dtype.itemsize
    body = member.read(nbytes + 1)
    if len(body) != nbytes:
        raise FormatError("npy data size", expected=f"{nbytes} bytes", got=len(body))
    array = np.frombuffer(body, dtype=dtype).copy()
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
