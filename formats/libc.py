"""C library calls Python's standard library does not offer (fallocate, sync_file_range,
madvise, mallopt), looked up once per process through ctypes in the C library the process
already has. A foreign call made through ctypes releases the GIL for its duration.

Example::

    madvise = libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    # -> a callable, or None where the C library has no such function
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable


@functools.lru_cache(maxsize=None)
def libc_function(name: str, argtypes: tuple, restype=ctypes.c_int) -> Callable | None:
    """The C library's ``name`` with these argument and result types (``errno`` kept for
    ``ctypes.get_errno``), or None where it does not exist."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = list(argtypes)
    fn.restype = restype
    return fn
