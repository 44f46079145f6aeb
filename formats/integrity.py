"""Integrity helpers shared by the formats: CRC32C, SHA-256, fastxor, merkle links."""

from __future__ import annotations

import hashlib
import mmap
import os

import crc32c as _crc32c
import numpy as np

from .iosafe import open_input

ZERO_HASH = "0" * 64
_HASH_WINDOW = 64 << 20


def crc32c(data, value: int = 0) -> int:
    """CRC32C (Castagnoli); ``value`` continues a running CRC. Releases the GIL on big inputs."""
    return _crc32c.crc32c(data, value=value)


def crc32c_holding_gil(data) -> int:
    """CRC32C of a small piece without releasing the GIL: a thread checking a batch of
    chunks one by one otherwise gives it up and waits to get it back for each (a restore's
    decoding threads spent more time waiting than computing). For the WTXT codec's batched
    chunks (32 KiB by default: 3 us; never more than a 2 MiB batch: 0.2 ms)."""
    return _crc32c.crc32c(data, gil_release_mode=0)


def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path) -> str:
    """SHA-256 of a file's bytes (for checking a file someone else wrote; writers get their
    digest while writing, see ``atomic_write_digest``). Hashed from a read-only map in
    64 MiB windows, each unmapped once hashed: no copy out of the page cache (read()
    copying it cost 11% of a restore's CPU) and bounded resident memory for any size. (A
    file truncated while mapped raises SIGBUS: the files hashed here are shards, scratch
    copies and downloads, replaced by rename, never truncated in place.)"""
    h = hashlib.sha256()
    with open_input(path, buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return h.hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as whole:
            view = memoryview(whole)
            try:
                for start in range(0, size, _HASH_WINDOW):
                    h.update(view[start:start + _HASH_WINDOW])    # releases the GIL
                    if size > _HASH_WINDOW:
                        whole.madvise(mmap.MADV_DONTNEED, start,
                                      min(_HASH_WINDOW, size - start))
            finally:
                view.release()
    return h.hexdigest()


def git_blob_id(data, *, algorithm: str = "sha1") -> str:
    """Git's object id of a blob holding ``data`` (a buffer): the hash of ``blob <size>\\0``
    and the bytes, SHA-1 (or ``"sha256"`` for a SHA-256 repository) as hex.

    >>> git_blob_id(b"")
    'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391'
    """
    h = hashlib.new(algorithm, b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def merkle_link(merkle_prev: str, hash_all: str, ts: str, gen: str, build: str) -> str:
    """``SHA256(merkle_prev_32 || hash_all_32 || ts || gen || build)`` as hex (the text
    fields ASCII)."""
    h = hashlib.sha256(bytes.fromhex(merkle_prev) + bytes.fromhex(hash_all))
    h.update(f"{ts}{gen}{build}".encode("ascii"))
    return h.hexdigest()


class FastXor:
    """XOR of little-endian u64 words over a byte stream fed in pieces (zero-padded at the end).

    Pieces need not be 8-byte aligned: each byte lands in the lane given by its stream offset.
    """

    def __init__(self) -> None:
        self.offset = 0
        self.lanes = np.zeros(8, np.uint8)
        self.words = np.uint64(0)

    def update(self, data) -> None:
        buf = np.frombuffer(data, np.uint8)
        n = buf.size
        if n == 0:
            return
        head = (-self.offset) % 8
        head = min(head, n)
        if head:
            start = self.offset % 8
            self.lanes[start:start + head] ^= buf[:head]
        body = buf[head:]
        full = body.size // 8 * 8
        if full:
            self.words ^= np.bitwise_xor.reduce(body[:full].view("<u8"))
        tail = body[full:]
        if tail.size:
            self.lanes[:tail.size] ^= tail
        self.offset += n

    def hexdigest(self) -> str:
        total = self.words ^ self.lanes.view("<u8")[0]
        return f"{int(total):016x}"
