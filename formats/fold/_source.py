"""Where FOLD bytes come from: a buffer in memory, a read-only mmap, or positional reads.

All three hand out memoryviews, so the parser does not care which it has. ``MappedSource``
(the default) gives zero-copy views of the page cache; ``FileSource`` copies each chunk with
``preadv`` into a per-thread scratch buffer reused from chunk to chunk, for filesystems where
mapping is unavailable or unwanted. On the bench machine both read at the same speed.
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from ..errors import TruncatedError
from ..iosafe import open_input
from ..model import close_map


class BufferSource:
    """Bytes already in memory (also the base of MappedSource)."""

    def __init__(self, buffer) -> None:
        self.view = memoryview(buffer).cast("B") if len(buffer) else memoryview(b"")
        self.size = len(self.view)

    def read(self, offset: int, length: int, *, scratch: bool = False) -> memoryview:
        return self.view[offset:offset + length]

    def close(self) -> None:
        self.view.release()


class MappedSource(BufferSource):
    def __init__(self, path: str) -> None:
        with _opened(path) as f:
            size = os.fstat(f.fileno()).st_size
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        super().__init__(self._map if self._map is not None else b"")

    def close(self) -> None:
        super().close()
        close_map(self._map)


class FileSource:
    """``preadv`` into a reusable per-thread buffer; the file stays open until ``close``."""

    def __init__(self, path: str) -> None:
        self._file = _opened(path)
        self.size = os.fstat(self._file.fileno()).st_size
        self._local = threading.local()

    def read(self, offset: int, length: int, *, scratch: bool = False) -> memoryview:
        if scratch:
            buf = getattr(self._local, "buf", None)
            if buf is None or buf.size < length:
                buf = self._local.buf = np.empty(max(length, 1 << 20), np.uint8)
            view = memoryview(buf)[:length]
        else:
            view = memoryview(bytearray(length))
        done = 0
        while done < length:
            n = os.preadv(self._file.fileno(), [view[done:]], offset + done)
            if n <= 0:
                raise TruncatedError("file shrank while being read", offset=offset + done,
                                     expected=f"{length} bytes", got=done)
            done += n
        return view

    def close(self) -> None:
        self._file.close()


def _opened(path: str):
    return open_input(path, buffering=0)


def open_source(path: str, use_mmap: bool):
    return MappedSource(path) if use_mmap else FileSource(path)
