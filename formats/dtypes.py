"""Dtype names spelled one way, and logical dtypes a format cannot hold natively.

Every format, ``inspect`` and report names a dtype with :func:`dtype_name` (``f32``, ``bf16``,
``bool``...). A format that cannot store a dtype keeps its bits as the unsigned integer of the
same width and records the logical dtype in its own metadata under ``snapops_dtypes``;
:func:`store_logical` and :func:`restore_logical` are the two halves of that, shared by every
format. The record is one ASCII line, ``LOGICAL=NAMES;LOGICAL=NAMES``, with NAMES either ``*``
(every array stored with that width) or comma-separated names, percent-encoded so any name
fits (and so WTXT's audit line can carry it verbatim):

>>> import ml_dtypes
>>> arrays = {"w": np.ones(2, ml_dtypes.bfloat16), "step": np.int64(3)}
>>> stored, record = store_logical(arrays, frozenset({"u16", "i64"}), "wtxt")
>>> stored["w"].dtype, record
(dtype('uint16'), 'bf16=*')
>>> restored, note = restore_logical(stored, record)
>>> restored["w"].dtype.name, note
('bfloat16', 'dtype of 1 array (w: bf16) comes from unbound metadata (snapops_dtypes), stored as same-width unsigned integers')
"""

from __future__ import annotations

from typing import Mapping
from urllib.parse import quote, unquote

import ml_dtypes
import numpy as np

from .errors import DataError, FormatError
from .model import little_endian

DTYPE_META_KEY = "snapops_dtypes"
# set (True) in a loaded file's meta or a verify report's details by a format whose
# verified signature covered the record (WTXT, through its audit binding)
DTYPE_BOUND_KEY = "snapops_dtypes_bound"
MAX_RECORD = 3800   # fits a WTXT audit line (4096 bytes) with room for the user's own pairs

_NUMPY = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
    "u64": np.uint64, "u32": np.uint32, "u16": np.uint16, "u8": np.uint8,
    "bool": np.bool_, "c64": np.complex64, "c128": np.complex128,
    "f8e4m3fn": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2,
    "f8e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "f8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "f8e8m0fnu": ml_dtypes.float8_e8m0fnu,  # the MX formats' shared scale
}
DTYPES: dict[str, np.dtype] = {name: np.dtype(t) for name, t in _NUMPY.items()}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_UNSIGNED = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}


def dtype_name(dtype: np.dtype) -> str:
    """The one spelling of ``dtype`` (any byte order): ``f32``, ``bf16``, ``bool``, ``c64``...;
    numpy's little-endian ``dtype.str`` for anything outside the table.

    >>> dtype_name(np.dtype(">f4")), dtype_name(np.dtype(ml_dtypes.bfloat16))
    ('f32', 'bf16')
    """
    dtype = np.dtype(dtype)
    native = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    return _NAMES.get(native, native.str)


def dtype_label(dtype: np.dtype) -> str:
    """How messages name ``dtype``: :func:`dtype_name` where that is readable, numpy's or
    ml_dtypes' name otherwise (``float128``, ``int4``; both are ``<f16``/``<V1`` in
    ``dtype.str``), ``structured [...]`` for a record.

    >>> dtype_label(np.dtype(ml_dtypes.int4)), dtype_label(np.dtype([("a", "<i4")]))
    ('int4', "structured [('a', '<i4')]")
    """
    dtype = np.dtype(dtype)
    if dtype.names is not None:
        return f"structured {dtype.descr}"
    name = dtype_name(dtype)
    return dtype.name if name not in DTYPES and dtype.kind in "fcV" else name


def keepers(test, what: str) -> str:
    """The phrase "FOLD, npz and pt keep {what}" naming the formats whose capabilities pass
    ``test``, from the registry (so a message never names a format that would refuse too)."""
    from .registry import all_handlers     # here: the registry imports every format

    titles = [h.title for h in all_handlers() if test(h.capabilities)]
    if not titles:
        return f"no snapops format keeps {what}"
    listed = titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]
    return f"{listed} keep{'s' if len(titles) == 1 else ''} {what}"


def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype for a name from :func:`dtype_name` (None when unknown).

    >>> numpy_dtype("bf16").name, numpy_dtype("<M8[s]"), numpy_dtype("nonsense")
    ('bfloat16', dtype('<M8[s]'), None)
    """
    if name in DTYPES:
        return DTYPES[name]
    try:
        dtype = np.dtype(name)
    except TypeError:
        return None
    return dtype if dtype_name(dtype) == name else None


def unsigned_for(dtype: np.dtype) -> str | None:
    """The unsigned integer dtype name of the same width (None for widths without one)."""
    if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None:
        return None
    return _UNSIGNED.get(dtype.itemsize)


def can_hold(dtype: np.dtype, native: frozenset[str]) -> bool:
    """True when a format storing ``native`` dtypes keeps ``dtype`` (itself, or as the
    same-width unsigned integer plus the record)."""
    name = dtype_name(dtype)
    return name in native or (name in DTYPES and unsigned_for(dtype) in native)


def store_logical(arrays: Mapping[str, np.ndarray], native: frozenset[str], format_name: str,
                  limit: int | None = None) -> tuple[dict[str, np.ndarray], str | None]:
    """Arrays a format can write (dtypes outside ``native`` viewed as same-width unsigned
    integers) and the ``snapops_dtypes`` record naming their logical dtypes (None if none);
    ``limit`` bounds the record's length (WTXT: :data:`MAX_RECORD`)."""
    stored: dict[str, np.ndarray] = {}
    logical: dict[str, str] = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        dtype = dtype_name(array.dtype)
        if dtype in native:
            stored[name] = array
            continue
        if not can_hold(array.dtype, native):
            label = dtype_label(array.dtype)
            raise DataError(f"array {name!r}: {format_name} cannot hold dtype {label} (holds "
                            f"{', '.join(sorted(native))}); "
                            + keepers(lambda caps: caps.holds(array.dtype), "it"))
        # the carrier's bytes are read little-endian: a big-endian array is swapped first
        stored[name] = little_endian(array).view(DTYPES[unsigned_for(array.dtype)])
        logical[name] = dtype
    return stored, encode_record(logical, stored, limit) if logical else None


def encode_record(logical: Mapping[str, str], stored: Mapping[str, np.ndarray],
                  limit: int | None = None) -> str:
    """``LOGICAL=NAMES;...``; NAMES is ``*`` when the logical dtype covers every array stored
    with its width."""
    groups = []
    for dtype in sorted(set(logical.values())):
        names = sorted(n for n, d in logical.items() if d == dtype)
        width = DTYPES[dtype].itemsize
        same_width = [n for n, a in stored.items() if a.dtype.itemsize == width
                      and dtype_name(a.dtype) == _UNSIGNED[width]]
        if sorted(same_width) == names:
            groups.append(f"{dtype}=*")
        elif "" in names:        # "bf16=" would read back as no name at all
            raise DataError(f"an array with an empty name and dtype {dtype} cannot be listed "
                            "in the record of logical dtypes beside arrays of its stored "
                            "width; name it, or use a format that stores it natively ("
                            + keepers(lambda caps: caps.stores(dtype), "it") + ")")
        else:
            groups.append(f"{dtype}=" + ",".join(quote(n, safe="") for n in names))
    record = ";".join(groups)
    if limit is not None and len(record) > limit:
        kinds = set(logical.values())
        raise DataError(f"the record of logical dtypes is {len(record)} bytes (limit "
                        f"{limit}): too many mixed-dtype arrays for one file; "
                        + keepers(lambda caps: all(caps.stores(d) for d in kinds),
                                  "them natively")
                        + ", or split the state into smaller files")
    return record


def decode_record(record: str, stored: Mapping[str, np.ndarray]) -> dict[str, str]:
    """name -> logical dtype from a ``snapops_dtypes`` record; FormatError if malformed."""
    out: dict[str, str] = {}
    widths_with_star: set[int] = set()
    for group in record.split(";"):
        dtype, sep, names = group.partition("=")
        if not sep or dtype not in DTYPES or not names:
            raise FormatError("malformed snapops_dtypes record", check="dtypes",
                              expected="LOGICAL=NAMES;... with known dtype names", got=group)
        width = DTYPES[dtype].itemsize
        if names == "*":
            widths_with_star.add(width)
            carrier = _UNSIGNED[width]
            out.update({n: dtype for n, a in stored.items() if dtype_name(a.dtype) == carrier})
        else:
            try:
                out.update({unquote(n, errors="strict"): dtype for n in names.split(",")})
            except UnicodeDecodeError as exc:
                raise FormatError("snapops_dtypes names are not UTF-8", check="dtypes",
                                  got=names[:60]) from exc
    if len(widths_with_star) < sum(1 for g in record.split(";") if g.endswith("=*")):
        raise FormatError("snapops_dtypes gives two logical dtypes to all arrays of one width",
                          check="dtypes", got=record)
    return out


def restore_logical(arrays: Mapping[str, np.ndarray], record: str | None, *,
                    bound: bool = False) -> tuple[dict[str, np.ndarray], str | None]:
    """The arrays with their logical dtypes restored from ``record``, and the note saying so
    (None when there was nothing to restore); ``bound``: a verified signature covered it."""
    if not record:
        return dict(arrays), None
    logical = decode_record(record, arrays)
    out = dict(arrays)
    for name, dtype in logical.items():
        out[name] = view_logical(out.get(name), dtype, name)
    return out, logical_note(logical, bound=bound)


def view_logical(array: np.ndarray | None, dtype: str, name: str) -> np.ndarray:
    """``array`` (stored as the same-width unsigned integer) viewed as logical ``dtype``."""
    target = DTYPES[dtype]
    carrier = _UNSIGNED.get(target.itemsize)
    if array is None or dtype_name(array.dtype) != carrier:
        raise FormatError("snapops_dtypes names an array that is not stored as the unsigned "
                          "integer of that width", check="dtypes", array=name,
                          expected=carrier,
                          got="no such array" if array is None else dtype_name(array.dtype))
    return array.view(target)


def logical_note(logical: Mapping[str, str], *, bound: bool = False) -> str:
    """The sentence reports and Snapshot.meta carry when dtypes came from the side record;
    ``bound``: the file's verified signature covers that record.

    >>> logical_note({"w": "bf16"}, bound=True)
    'dtype of 1 array (w: bf16) comes from metadata (snapops_dtypes) covered by the verified signature, stored as same-width unsigned integers'
    """
    shown = ", ".join(f"{n}: {d}" for n, d in sorted(logical.items())[:5])
    more = f", ... {len(logical) - 5} more" if len(logical) > 5 else ""
    plural = "array" if len(logical) == 1 else "arrays"
    source = (f"metadata ({DTYPE_META_KEY}) covered by the verified signature" if bound
              else f"unbound metadata ({DTYPE_META_KEY})")
    return (f"dtype of {len(logical)} {plural} ({shown}{more}) comes from {source}, stored "
            "as same-width unsigned integers")
