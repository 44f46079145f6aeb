"""glibc allocator tuning for the streaming codecs.

The codecs allocate and free buffers of 1-2 MiB at a high rate. With glibc's defaults these
are mmap()ed and trimmed back to the OS each time, so every buffer costs fresh zeroed pages:
measured here, that halves WTXT encode throughput (225 -> 557 MB/s per core). Raising the
mmap threshold to 4 MiB and the trim threshold to 64 MiB keeps such buffers in the heap;
large user arrays (> 4 MiB) are still mmap()ed and returned to the OS when freed.
Process-wide and idempotent; set SNAPOPS_MALLOC_TUNING=0 to leave the allocator alone.

:func:`decode_buffer` hands out large decode targets (see there for how their pages
come in).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import platform

import numpy as np

from .libc import libc_function

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MADV_POPULATE_WRITE = 23         # Linux 5.14+
POPULATE_FROM = 1 << 20
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
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


def decode_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` for decoded data, owning its memory.

    Large ones are mappings of their own (unmapped when the array is freed) that ask for
    transparent huge pages: the decoding threads then fault them in 2 MiB at a time, each on
    its own core, as they write. Populating the whole mapping up front instead (one madvise,
    on the thread that parses the file) made fresh memory a serial step: a 256 MiB WTXT load
    ran at 270 MB/s against 344 (medians of 6 alternating runs, memory returned to the VM's
    host between them; 371 against 369 when it was not). Without huge pages (disabled, or a
    kernel without them) faulting 4 KiB at a time costs 2-6x what populating does, so the
    pages are populated first (:func:`populated_buffer`). Small buffers come from the heap.
    """
    if nbytes < POPULATE_FROM or not hasattr(mmap, "MAP_POPULATE"):
        return np.empty(nbytes, np.uint8)
    if not huge_pages_enabled():
        return populated_buffer(nbytes)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if not ask_huge_pages(region):
        region.close()
        return populated_buffer(nbytes)
    return np.frombuffer(region, np.uint8)


def ask_huge_pages(region: mmap.mmap) -> bool:
    """Advise the kernel to back ``region`` with transparent huge pages (a fault per 2 MiB
    instead of per 4 KiB; for a shared map of a file, 2 MiB folios in its page cache where the
    file system has them, as ext4 on Linux 6.18 does); whether the advice was taken."""
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, AttributeError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=1)
def huge_pages_enabled(setting: str = THP_SETTING) -> bool:
    """Transparent huge pages are on for mappings that ask for them (``always`` or
    ``madvise`` selected in ``setting``)."""
    try:
        with open(setting, encoding="ascii") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return False
    return "[always]" in text or "[madvise]" in text


def populated_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` whose pages are present before it is written
    (where huge pages are off: see :func:`decode_buffer`).

    ``mmap(MAP_POPULATE)`` holds the GIL while it faults every page in (0.35 s per GiB here,
    during which no other thread runs); ``madvise(MADV_POPULATE_WRITE)`` through ctypes
    releases it (Linux 5.14+; MAP_POPULATE before that). Small buffers come from the heap."""
    if nbytes < POPULATE_FROM or not hasattr(mmap, "MAP_POPULATE"):
        return np.empty(nbytes, np.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
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
