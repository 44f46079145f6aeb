"""SHA-256 of a file its writer fills out of order: a helper thread hashes the bytes in file
order as soon as every region before them is written, reading them back from the page cache in
bounded blocks.

A writer that lays a file out first and fills it from several threads (WTXT: the chunks as they
are encoded, the header once the root hash is known) would otherwise hash the whole file after
the last write, on one core. Following the written prefix instead, the hashing runs beside the
encoding and the digest is ready moments after the last region is reported.

Example::

    digest = PrefixDigest(fd, base=0, size=8)
    os.pwrite(fd, b"efgh", 4); digest.finished(4, 8)
    os.pwrite(fd, b"abcd", 0); digest.finished(0, 4)
    digest.hexdigest()   # -> SHA-256 of b"abcdefgh"
"""

from __future__ import annotations

import hashlib
import heapq
import os
import threading

BLOCK = 4 << 20


class PrefixDigest:
    """Hash bytes ``[base, base + size)`` of ``fd`` (readable; kept open by the caller) in
    order; :meth:`finished` reports each region once its bytes are in the file (regions are
    relative to ``base`` and do not overlap)."""

    def __init__(self, fd: int, base: int, size: int) -> None:
        self._fd, self._base, self._size = fd, base, size
        self._sha = hashlib.sha256()
        self._pending: list[tuple[int, int]] = []   # finished regions beyond the frontier
        self._frontier = 0                          # bytes [0, frontier) are all written
        self._cond = threading.Condition()
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="file-digest", daemon=True)
        self._thread.start()

    def finished(self, start: int, end: int) -> None:
        if end <= start:
            return
        with self._cond:
            heapq.heappush(self._pending, (start, end))
            moved = False
            while self._pending and self._pending[0][0] <= self._frontier:
                _, stop = heapq.heappop(self._pending)
                if stop > self._frontier:
                    self._frontier, moved = stop, True
            if moved:
                self._cond.notify()

    def _run(self) -> None:
        hashed = 0
        buffer = bytearray(min(BLOCK, max(self._size, 1)))
        view = memoryview(buffer)
        try:
            while hashed < self._size:
                with self._cond:
                    while self._frontier <= hashed and not self._stopped:
                        self._cond.wait()
                    if self._stopped:
                        return
                    limit = self._frontier
                while hashed < limit:
                    want = min(len(buffer), limit - hashed)
                    got = os.preadv(self._fd, [view[:want]], self._base + hashed)
                    if got <= 0:
                        raise OSError(f"short read at offset {self._base + hashed}")
                    self._sha.update(view[:got])
                    hashed += got
        except BaseException as exc:  # handed to hexdigest(), in the writer's thread
            self._error = exc

    def hexdigest(self) -> str:
        """The digest, once every byte was reported (waits for the helper to catch up)."""
        with self._cond:
            if self._frontier < self._size and not self._stopped:
                raise RuntimeError(f"bytes from offset {self._frontier} were never reported")
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._stopped:
            raise RuntimeError("digest cancelled")
        return self._sha.hexdigest()

    def cancel(self) -> None:
        """Stop the helper (the file is being abandoned)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()
