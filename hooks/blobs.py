"""Byte streams over git blobs for the verifiers: a sniffed head put back in front of a pipe, and
a work-tree file that proves, while it is read, that it is the blob being checked.

Why the second: ``git cat-file`` inflates a 256 MiB blob at ~150 MB/s on this machine, slower
than WTXT verification itself. When the work-tree copy has the blob's size, we verify the file
and hash the very bytes the verifier reads with git's object hash (``blob <size>\\0`` + content)
on a second core. If the id matches the staged one, the verified bytes *were* the staged blob;
if not (edited after ``git add``, eol/clean filters), the result is thrown away and the blob is
verified from ``git cat-file`` instead.
"""

from __future__ import annotations

import hashlib
import io
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

READ_SIZE = 1 << 20
MAX_BACKLOG = 8


class PrefixedStream(io.RawIOBase):
    """``head`` followed by the rest of ``stream`` (after a sniff consumed ``head``)."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        super().__init__()
        self._head, self._stream = head, stream

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size is None or size < 0 or size >= len(self._head):
                data, self._head = self._head, b""
                more = self._stream.read(-1 if size is None or size < 0 else size - len(data))
                return data + (more or b"")
            data, self._head = self._head[:size], self._head[size:]
            return data
        return self._stream.read(size)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def read_head(stream: BinaryIO, size: int) -> bytes:
    """Exactly ``size`` bytes unless the stream ends first (pipes return short reads)."""
    parts, missing = [], size
    while missing:
        block = stream.read(missing)
        if not block:
            break
        parts.append(block)
        missing -= len(block)
    return b"".join(parts)


class HashingFile(io.RawIOBase):
    """Reads a file and feeds every byte read, in order, to git's object hash on a worker
    thread (hashlib releases the GIL), so hashing overlaps verification."""

    def __init__(self, path: str | os.PathLike, size: int, algorithm: str = "sha1") -> None:
        super().__init__()
        self._file = open(path, "rb", buffering=0)
        self._hash = hashlib.new(algorithm)
        self._hash.update(b"blob %d\0" % size)
        self._size, self._seen = size, 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="snapops-blobhash")
        self._backlog: list[Future] = []

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(READ_SIZE if size is None or size < 0 else size)
        if data:
            self._seen += len(data)
            self._backlog.append(self._pool.submit(self._hash.update, data))
            if len(self._backlog) > MAX_BACKLOG:  # bounded memory: wait for the oldest block
                self._backlog.pop(0).result()
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def object_id(self) -> str:
        """Finish reading (a verifier may stop at a failure) and return the git object id of
        everything read; '' when the file's length is not the blob's size."""
        while self.read(READ_SIZE):
            pass
        for fut in self._backlog:
            fut.result()
        self._backlog.clear()
        return self._hash.hexdigest() if self._seen == self._size else ""

    def close(self) -> None:
        if not self.closed:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._file.close()
        super().close()
