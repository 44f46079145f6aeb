"""The snapshot model shared by every format: ordered named numpy arrays plus metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np

from .errors import DataError


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
        tensors of any dtype and device, scalars).

        >>> Snapshot.coerce({"step": 3})["step"].dtype
        dtype('int64')
        """
        if isinstance(obj, Snapshot):
            return obj
        if not isinstance(obj, Mapping):
            raise DataError(f"expected a Snapshot or a mapping of arrays, got {type(obj).__name__}")
        arrays = {}
        for name, value in obj.items():
            if not isinstance(name, str):
                raise DataError(f"array names must be str, got {name!r}")
            arrays[name] = as_numpy(value, name)
        return cls(arrays)

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


def as_numpy(value: Any, name: str = "?") -> np.ndarray:
    """Turn an array-like (numpy, a torch tensor of any dtype on any device, a scalar) into a
    numpy array with the same dtype and bits (torch bf16 becomes ``ml_dtypes.bfloat16``).

    >>> import torch
    >>> as_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype.name
    'bfloat16'
    """
    from .tensors import is_tensor, tensor_to_numpy

    if isinstance(value, np.ndarray):
        array = value
    elif is_tensor(value):
        array = tensor_to_numpy(value, name)
    else:
        array = np.asarray(value)
    if array.dtype.hasobject:
        raise DataError(f"array {name!r}: object arrays are not supported")
    return array


def le_contiguous(array: np.ndarray) -> np.ndarray:
    """The array as C-contiguous little-endian data (a view when it already is)."""
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and np.little_endian is False):
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array)


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
