"""The snapshot model shared by every format: ordered named numpy arrays plus metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np

from .errors import DataError, LimitError
from .limits import DEFAULT_LIMITS


@dataclass
class Snapshot:
    """Named arrays (insertion-ordered) and free-form metadata (str -> str/int/float).

    Writers decide their own canonical order (WTXT sorts names byte-wise); the model keeps
    whatever order the source had.

    >>> snap = Snapshot({"w": np.zeros((2, 3), np.float32)}, {"gen": 1})
    >>> snap.nbytes
    24
    """

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, obj: "Snapshot | Mapping[str, Any]") -> "Snapshot":
        """Accept a Snapshot or a plain mapping of name -> array-like (numpy arrays, torch
        tensors of any dtype and device, scalars), checked the same way for every format:
        names and meta keys are str of valid Unicode, values are arrays within the limits.

        >>> Snapshot.coerce({"step": 3})["step"].dtype
        dtype('int64')
        """
        if isinstance(obj, Snapshot):
            items, meta = obj.arrays, obj.meta
        elif isinstance(obj, Mapping):
            items, meta = obj, {}
        else:
            raise DataError(f"expected a Snapshot or a mapping of arrays, got {type(obj).__name__}")
        if not isinstance(items, Mapping) or not isinstance(meta, Mapping):
            raise DataError("a Snapshot's arrays and meta must be mappings, got "
                            f"{type(items).__name__} and {type(meta).__name__}")
        arrays = {}
        for name, value in items.items():
            check_text(name, "array name")
            arrays[name] = as_numpy(value, name)
        for key, value in meta.items():
            check_text(key, "meta key")
            check_text(value, f"meta {key!r}", must_be_str=False)
        return cls(arrays, dict(meta))

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    def sorted_names(self) -> list[str]:
        """Names in byte-wise ASCII order (the canonical order of every snapops writer)."""
        return sorted(self.arrays, key=lambda n: n.encode("utf-8", "surrogatepass"))

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __len__(self) -> int:
        return len(self.arrays)

    def equal(self, other: "Snapshot") -> bool:
        """Bit-exact equality of names, dtypes, shapes and bytes (NaNs compare by bits)."""
        if set(self.arrays) != set(other.arrays):
            return False
        for name, a in self.arrays.items():
            b = other.arrays[name]
            if a.dtype != b.dtype or a.shape != b.shape:
                return False
            if raw_bytes(a) != raw_bytes(b):
                return False
        return True


def check_text(value: Any, what: str, must_be_str: bool = True) -> None:
    """Refuse a value that is no str (when ``must_be_str``) and any str, also inside lists
    and dicts, that is not valid Unicode (a lone surrogate cannot be written as UTF-8)."""
    if must_be_str and not isinstance(value, str):
        raise DataError(f"{what}s must be str, got {value!r}")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"{what} {value!r} is not valid Unicode (a lone surrogate); "
                            "expected text that encodes as UTF-8") from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_text(key, f"{what} key", must_be_str=False)
            check_text(item, what, must_be_str=False)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_text(item, what, must_be_str=False)


def as_numpy(value: Any, name: str = "?") -> np.ndarray:
    """Turn an array-like (numpy, a torch tensor of any dtype on any device, a scalar) into a
    numpy array with the same dtype and bits (torch bf16 becomes ``ml_dtypes.bfloat16``),
    refusing what cannot be kept exactly and arrays larger than any reader accepts (before
    anything is copied: a zero-stride view may claim terabytes).

    >>> import torch
    >>> as_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype.name
    'bfloat16'
    """
    from .tensors import is_tensor, tensor_to_numpy

    if isinstance(value, np.ma.MaskedArray):
        raise DataError(f"array {name!r}: a masked array would lose its mask; pass "
                        "a.filled(...), or its data and mask as two arrays")
    if isinstance(value, np.ndarray):
        array = value
    elif is_tensor(value):
        array = tensor_to_numpy(value, name)
    else:
        try:
            array = np.asarray(value)
        except (ValueError, TypeError):
            raise DataError(f"array {name!r}: expected an array-like of one shape and "
                            f"dtype, got a {type(value).__name__} numpy cannot make one "
                            "array of (ragged?)") from None
    if array.dtype.hasobject:
        raise DataError(f"array {name!r}: object arrays are not supported")
    limit = DEFAULT_LIMITS.max_bytes
    if array.nbytes > limit:
        raise LimitError(f"array {name!r} is larger than readers accept",
                         expected=f"at most {limit} bytes (DeclaredLimits.max_bytes)",
                         got=f"{array.nbytes} bytes")
    return array


def little_endian_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` in little-endian byte order (itself when it already is, or has none)."""
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not np.little_endian):
        return dtype.newbyteorder("<")
    return dtype


def little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` with a little-endian dtype (the same array when it already has one)."""
    wanted = little_endian_dtype(array.dtype)
    return array if wanted is array.dtype else array.astype(wanted)


def le_contiguous(array: np.ndarray) -> np.ndarray:
    """The array as C-contiguous little-endian data (a view when it already is)."""
    return np.ascontiguousarray(little_endian(array))


def raw_bytes(array: np.ndarray) -> memoryview:
    """The raw little-endian C-order bytes of ``array`` as a flat memoryview (no copy if possible)."""
    flat = le_contiguous(array).reshape(-1)
    return memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")


class ArrayMapping:
    """Mapping-style access for the lazy readers of every format: a subclass provides ``names``
    (in file order) and ``array(name)``; ``len``, iteration, ``in`` and ``[name]`` follow."""

    names: list[str]

    def array(self, name: str) -> np.ndarray:  # pragma: no cover - abstract
        raise TypeError(f"{type(self).__name__} must define array()")

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """``(dtype, shape)`` of ``name``; readers with an index override this to avoid
        reading the data."""
        array = self.array(name)
        return array.dtype, tuple(array.shape)

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> np.ndarray:
        return self.array(name)

    def close(self) -> None:  # pragma: no cover - readers without resources
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_map(mapping) -> None:
    """Close an mmap unless arrays still view it (it is unmapped when the last one goes)."""
    if mapping is None:
        return
    try:
        mapping.close()
    except BufferError:
        pass
