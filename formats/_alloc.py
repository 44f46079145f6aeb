"""glibc allocator tuning for the streaming codecs.

The codecs allocate and free buffers of 1-2 MiB at a high rate. With glibc's defaults these
are mmap()ed and trimmed back to the OS each time, so every buffer costs fresh zeroed pages:
measured here, that halves WTXT encode throughput (225 -> 557 MB/s per core). Raising the
mmap threshold to 4 MiB and the trim threshold to 64 MiB keeps such buffers in the heap;
large user arrays (> 4 MiB) are still mmap()ed and returned to the OS when freed.
Process-wide and idempotent; set SNAPOPS_MALLOC_TUNING=0 to leave the allocator alone.

:func:`populated_buffer` hands out large decode targets with their pages already present.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform

import numpy as np

from .libc import libc_function

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MADV_POPULATE_WRITE = 23         # Linux 5.14+
POPULATE_FROM = 1 << 20
_tuned = False


def tune_allocator() -> bool:
    """Apply the thresholds once per process; returns True when they are in effect."""
    global _tuned
    if _tuned:
        return True
    if os.environ.get("SNAPOPS_MALLOC_TUNING", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is None:
        return False
    _tuned = bool(mallopt(M_MMAP_THRESHOLD, 4 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 64 << 20))
    return _tuned


def populated_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` whose pages are present before it is written.

    Faulting a fresh mapping's pages one by one while decoding into it costs 2-6x what one
    call for all of them does. ``mmap(MAP_POPULATE)`` is that call, but Python makes it
    holding the GIL (0.35 s per GiB here, during which no other thread of a restore runs);
    ``madvise(MADV_POPULATE_WRITE)`` through ctypes releases it. The mapping asks for
    transparent huge pages (as numpy does for its large arrays): a 1 GiB WTXT restore's
    decoding took 15% less CPU (0.25 s less in the kernel). Small buffers come from the
    heap; without that madvise (an old kernel) MAP_POPULATE is used. The array owns its
    mapping: it is unmapped when the array is freed."""
    if nbytes < POPULATE_FROM or not hasattr(mmap, "MAP_POPULATE"):
        return np.empty(nbytes, np.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError, AttributeError):   # a kernel without THP
        region.madvise(mmap.MADV_HUGEPAGE)
    out = np.frombuffer(region, np.uint8)
    if _populate(out.ctypes.data, nbytes):
        return out
    del out
    region.close()
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                       | mmap.MAP_POPULATE)
    return np.frombuffer(region, np.uint8)


def _populate(address: int, nbytes: int) -> bool:
    """madvise(MADV_POPULATE_WRITE) with the GIL released (ctypes drops it for the call)."""
    madvise = libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    return madvise is not None and madvise(address, nbytes, MADV_POPULATE_WRITE) == 0
