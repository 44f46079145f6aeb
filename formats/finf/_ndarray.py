"""``!ndarray`` entries: validated from the tree's mapping, built from numpy arrays.

An entry names where its bytes are (``source``: a block index, or a relative URI in exploded
form), how to read them (``dtype``, ``byteorder``, ``shape``) and optionally ``offset`` bytes
into the block. snapops writes ``byteorder`` explicitly (docs/formats/finf.md); a reader gets a
missing one only for one-byte types, where it means nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DataError, FormatError, UnsupportedVersionError
from ..limits import check_dims
from . import _spec as S

_KNOWN_KEYS = ("source", "dtype", "byteorder", "shape", "offset")


@dataclass(eq=False)
class NDArrayRef:
    """One ``!ndarray`` entry of the tree.

    >>> NDArrayRef(source=0, dtype="float32", shape=(2, 3)).nbytes
    24
    """

    source: int | str
    dtype: str
    shape: tuple[int, ...]
    byteorder: str = "little"
    offset: int = 0
    tag: str = S.NDARRAY_TAG
    line: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # unknown keys, kept for re-emission

    @property
    def itemsize(self) -> int:
        return int(S.DTYPES[self.dtype][1:])

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(S.BYTEORDERS[self.byteorder] + S.DTYPES[self.dtype])

    @property
    def is_external(self) -> bool:
        return isinstance(self.source, str)

    def to_mapping(self) -> dict[str, Any]:
        """The entry as written: source, dtype, byteorder, shape (offset only when not 0)."""
        out: dict[str, Any] = {"source": self.source, "dtype": self.dtype,
                               "byteorder": self.byteorder, "shape": list(self.shape)}
        if self.offset:
            out["offset"] = self.offset
        out.update(self.extra)
        return out

    def with_source(self, source: int | str) -> "NDArrayRef":
        return NDArrayRef(source, self.dtype, self.shape, self.byteorder, self.offset, self.tag,
                          self.line, dict(self.extra))


def _uint(value: Any, what: str, line: int | None) -> int:
    if type(value) is not int or value < 0:
        raise FormatError(f"ndarray {what} must be a non-negative integer", line=line,
                          expected="an integer >= 0", got=value)
    return value


def ref_from_mapping(mapping: Any, tag: str, line: int | None) -> NDArrayRef:
    """Validate one ``!ndarray`` mapping (already constructed by the safe loader)."""
    if not isinstance(mapping, dict):
        raise FormatError("!ndarray must be a mapping", line=line, expected="a mapping",
                          got=type(mapping).__name__)
    for key in S.UNSUPPORTED_NDARRAY_KEYS:
        if key in mapping:
            raise UnsupportedVersionError(f"ndarray '{key}' is not supported by snapops",
                                          line=line, expected="source/dtype/shape/byteorder",
                                          got=key)
    if "source" not in mapping:
        raise FormatError("ndarray without a source", line=line, expected="'source' key",
                          got=sorted(map(str, mapping)))
    source = mapping["source"]
    if isinstance(source, str):
        if not source:
            raise FormatError("empty ndarray source", line=line, expected="a relative URI",
                              got=source)
    else:
        source = _uint(source, "source", line)
    dtype = mapping.get("dtype")
    if not isinstance(dtype, str) or dtype not in S.DTYPES:
        cls = UnsupportedVersionError if dtype is not None else FormatError
        raise cls("unsupported ndarray dtype", line=line, expected=" ".join(S.DTYPES), got=dtype)
    byteorder = mapping.get("byteorder")
    if byteorder is None and S.DTYPES[dtype][1] == "1":
        byteorder = "little"
    if byteorder not in S.BYTEORDERS:
        raise FormatError("ndarray byteorder must be written explicitly", line=line,
                          expected="little or big", got=byteorder)
    shape = mapping.get("shape")
    if not isinstance(shape, list):
        raise FormatError("ndarray shape must be a list of integers", line=line,
                          expected="[d0, d1, ...]", got=shape)
    if len(shape) > S.MAX_NDIM:
        raise FormatError("too many dimensions", line=line, expected=f"<= {S.MAX_NDIM}",
                          got=len(shape))
    dims = tuple(_uint(d, "shape entry", line) for d in shape)
    check_dims(None, dims, int(S.DTYPES[dtype][1]), line=line)
    offset = _uint(mapping.get("offset", 0), "offset", line)
    extra = {k: v for k, v in mapping.items() if k not in _KNOWN_KEYS}
    return NDArrayRef(source, dtype, dims, byteorder, offset, tag, line, extra)


def ref_for_array(array: np.ndarray, source: int | str, name: str) -> NDArrayRef:
    """The entry snapops writes for ``array`` (always little-endian, C order)."""
    kind = array.dtype.kind + str(array.dtype.itemsize)
    name_of = S.DTYPE_NAMES.get(kind)
    if name_of is None or array.dtype.kind not in "iuf":
        raise DataError(f"array {name!r}: FINF 0.1.0 stores int8..uint64, float32 and float64, "
                        f"not {array.dtype}")
    return NDArrayRef(source, name_of, tuple(int(d) for d in array.shape))
