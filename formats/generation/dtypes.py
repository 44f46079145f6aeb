"""Logical dtype names as the MANIFEST spells them, and their numpy dtypes (bf16 is
``ml_dtypes.bfloat16``). One spelling everywhere: ``f32``, ``bf16``, ``i64``, ``bool``...

>>> dtype_name(np.dtype("<f4")), numpy_dtype("bf16").name
('f32', 'bfloat16')
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from snapops.formats.errors import DataError

_NAMES = {
    "f64": np.dtype("<f8"), "f32": np.dtype("<f4"), "f16": np.dtype("<f2"),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i64": np.dtype("<i8"), "i32": np.dtype("<i4"), "i16": np.dtype("<i2"), "i8": np.dtype("i1"),
    "u64": np.dtype("<u8"), "u32": np.dtype("<u4"), "u16": np.dtype("<u2"), "u8": np.dtype("u1"),
    "bool": np.dtype("?"), "c64": np.dtype("<c8"), "c128": np.dtype("<c16"),
}
_BY_DTYPE = {dt.newbyteorder("<") if dt.byteorder not in "|=" else dt: name
             for name, dt in _NAMES.items()}


def dtype_name(dtype: np.dtype) -> str:
    """The canonical short name of a numpy dtype (either byte order); DataError if none."""
    dt = np.dtype(dtype)
    key = dt.newbyteorder("<") if dt.byteorder == ">" else dt
    for known, name in _BY_DTYPE.items():
        if key == known:
            return name
    raise DataError(f"dtype {dt} has no snapops name (supported: {', '.join(_NAMES)})")


def numpy_dtype(name: str) -> np.dtype:
    try:
        return _NAMES[name]
    except KeyError:
        raise DataError(f"unknown dtype {name!r} (supported: {', '.join(_NAMES)})") from None


def same_width_unsigned(dtype: np.dtype) -> np.dtype:
    """The unsigned integer dtype of the same width (how a format without ``dtype`` stores it)."""
    return np.dtype(f"<u{np.dtype(dtype).itemsize}")
