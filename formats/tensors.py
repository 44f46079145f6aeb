"""torch tensors <-> numpy arrays, bit for bit and dtype for dtype (torch is imported lazily).

bf16 and the float8 types have no numpy dtype of their own: they cross as a same-width integer
view and come out as the ``ml_dtypes`` type (never through a float conversion).

>>> import torch
>>> t = torch.tensor([1.0, -2.5], dtype=torch.bfloat16)
>>> a = tensor_to_numpy(t, "w"); a.dtype.name
'bfloat16'
>>> torch.equal(numpy_to_tensor(a), t)
True
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import DataError

# torch dtype name -> (integer view dtype name in torch, numpy dtype of the logical type)
_VIEWED = {
    "bfloat16": ("int16", ml_dtypes.bfloat16),
    "float8_e4m3fn": ("uint8", ml_dtypes.float8_e4m3fn),
    "float8_e5m2": ("uint8", ml_dtypes.float8_e5m2),
    "float8_e4m3fnuz": ("uint8", ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2fnuz": ("uint8", ml_dtypes.float8_e5m2fnuz),
    "float8_e8m0fnu": ("uint8", ml_dtypes.float8_e8m0fnu),
}
_BY_NUMPY = {np.dtype(logical): name for name, (_, logical) in _VIEWED.items()}


def is_tensor(value: Any) -> bool:
    """True for a torch.Tensor, without importing torch when it was never imported."""
    cls = type(value)
    return cls.__module__.partition(".")[0] == "torch" and hasattr(value, "detach")


def tensor_to_numpy(tensor: Any, name: str = "?") -> np.ndarray:
    """A CPU numpy array with the tensor's dtype and bits (a copy only when the tensor is on
    another device, not contiguous or carries a lazy conjugate/negation)."""
    import torch

    if tensor.layout != torch.strided or tensor.is_quantized:
        raise DataError(f"array {name!r}: {tensor.layout} / quantized tensors are not "
                        "supported; convert to a dense tensor first")
    try:
        plain = tensor.detach().resolve_conj().resolve_neg().cpu().contiguous()
    except (RuntimeError, NotImplementedError) as exc:   # meta tensors, lost devices
        raise DataError(f"array {name!r}: cannot copy the tensor to the CPU: {exc}") from exc
    kind = str(plain.dtype).removeprefix("torch.")
    try:
        if kind in _VIEWED:
            carrier, logical = _VIEWED[kind]
            return plain.view(getattr(torch, carrier)).numpy().view(logical)
        return plain.numpy()
    except (TypeError, RuntimeError) as exc:
        raise DataError(f"array {name!r}: torch dtype {kind} has no exact numpy dtype "
                        "(nothing is converted silently)") from exc
    except ValueError as exc:   # numpy's own bound: dimensions past intp, even when one is 0
        shape = "x".join(str(d) for d in plain.shape)
        raise DataError(f"array {name!r}: shape {shape} is one numpy cannot hold "
                        f"({exc})") from exc


def numpy_to_tensor(array: np.ndarray) -> Any:
    """The tensor holding ``array``'s bits with the matching torch dtype (shares memory when
    the array is writable, C-contiguous and little-endian)."""
    import torch

    array = np.asarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = array.copy(order="C")       # keeps 0-d arrays 0-d
    kind = _BY_NUMPY.get(array.dtype)
    if kind is not None:
        carrier = _VIEWED[kind][0]
        return torch.from_numpy(array.view(np.dtype(carrier))).view(getattr(torch, kind))
    try:
        return torch.from_numpy(array)
    except TypeError as exc:
        raise DataError(f"dtype {array.dtype} has no torch equivalent") from exc
