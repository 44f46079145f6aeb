"""Git's delta and pack formats, written without git: a changed shard as a delta of its
previous version, in a pack with its index (``pack-format.txt`` in git's documentation).

Why write them here: a 1%-rows change of a large WTXT shard is found by git's own delta search
at about 15 MB/s, and ``pack-objects`` computes it a second time while writing (it caches no
delta over 64 KiB), so every push of a sparse generation cost a full search of every rewritten
shard. The daemon already knows the two versions; :func:`git_delta` compares them block by block
with numpy, and ``git push`` then reuses the delta it finds in the pack. Tests check every byte
against the real git (``index-pack`` writes the same index, ``fsck --strict`` accepts the pack).

Layout written (pack version 2, index version 2):

* pack: ``PACK``, version, object count; per object a type-and-size header, for a
  ``REF_DELTA`` the base's object id, then the zlib stream; the SHA-1 of all that;
* index: ``\\377tOc``, version, 256 fan-out counts, the sorted object ids, the CRC-32 of each
  object's packed bytes, 31-bit offsets (larger ones through a 64-bit table), the pack's SHA-1,
  and the SHA-1 of the index itself.

Example::

    delta = git_delta(old_bytes, new_bytes, limit=len(new_bytes) // 4)
    with open(tmp, "wb") as out:
        pack = PackWriter(out.write, count=2)
        pack.add_blob(old_oid, old_bytes)
        pack.add_delta(new_oid, old_oid, delta)
        pack_sha = pack.finish()
    idx_file.write(index_bytes(pack.entries, pack_sha))
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["BLOCK", "IndexEntry", "PackWriter", "git_delta", "index_bytes"]

BLOCK = 512                  # bytes compared as one unit: a changed WTXT row is ~5 KiB of text
COPY_MAX = 1 << 23           # one copy instruction's size (the format allows up to 2**24 - 1)
INSERT_MAX = 127             # one insert instruction's literal bytes (the format's limit)
OFFSET_MAX = (1 << 32) - 1   # a copy instruction's base offset has 4 bytes
COMPARE_BLOCKS = 2048        # blocks compared per numpy call (bounded temporaries)
FEED = 1 << 20               # bytes per zlib call

_OBJ_BLOB = 3
_OBJ_REF_DELTA = 7


def _varint(n: int) -> bytes:
    """The delta header's sizes: 7 bits per byte, least significant first."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _copy(offset: int, size: int) -> bytes:
    """A copy instruction: the bytes of ``offset`` and ``size`` that are not zero, flagged."""
    command, args = 0x80, bytearray()
    for i in range(4):
        byte = (offset >> (8 * i)) & 0xFF
        if byte:
            command |= 1 << i
            args.append(byte)
    for i in range(3):
        byte = (size >> (8 * i)) & 0xFF
        if byte:
            command |= 0x10 << i
            args.append(byte)
    return bytes([command]) + bytes(args)


def _matches(target: np.ndarray, base: np.ndarray, first: int, stop: int,
             shift: int) -> np.ndarray:
    """For target blocks ``first..stop``: equal to the base bytes ``shift`` bytes earlier?"""
    equal = np.zeros(stop - first, bool)
    for lo in range(first, stop, COMPARE_BLOCKS):
        hi = min(stop, lo + COMPARE_BLOCKS)
        t = target[lo * BLOCK:hi * BLOCK].reshape(hi - lo, BLOCK)
        b = base[lo * BLOCK - shift:hi * BLOCK - shift].reshape(hi - lo, BLOCK)
        equal[lo - first:hi - first] = (t == b).all(axis=1)
    return equal


def _sources(base: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Each whole target block's offset in the base, or -1: blocks are found at the same offset
    from the start or from the end (a header line that grew shifts all that follows)."""
    blocks = len(target) // BLOCK
    source = np.full(blocks, -1, np.int64)
    starts = np.arange(blocks, dtype=np.int64) * BLOCK
    aligned = min(len(target), len(base)) // BLOCK
    hit = np.flatnonzero(_matches(target, base, 0, aligned, 0))
    source[hit] = starts[hit]
    shift = len(target) - len(base)
    if shift:
        first = max(0, -(-shift // BLOCK))               # base offset >= 0
        stop = min(blocks, (len(base) + shift) // BLOCK)  # base end <= len(base)
        if stop > first:
            hit = np.flatnonzero(_matches(target, base, first, stop, shift)) + first
            hit = hit[source[hit] < 0]
            source[hit] = starts[hit] - shift
    return source


def git_delta(base, target, limit: int) -> bytes | None:
    """Git's delta turning ``base`` into ``target`` (buffers), or None when its literal bytes
    would pass ``limit`` (a dense change: not worth a delta), the base is too large to
    address or the target is empty. Exact by construction: copies are of blocks found equal,
    the rest is literal.

    Example::

        git_delta(b"a" * 4096, b"a" * 4096 + b"tail", limit=64)
        # -> b'\\x80 \\x84 \\xa0\\x10\\x04tail'  (sizes 4096, 4100; copy 4096 from 0; insert)
    """
    b = np.frombuffer(base, np.uint8)
    t = np.frombuffer(target, np.uint8)
    if len(b) > OFFSET_MAX or not len(t):
        return None  # (git cannot stream an empty blob stored as a delta)
    source = _sources(b, t)
    blocks = len(source)
    literal = int(np.count_nonzero(source < 0)) * BLOCK + len(t) - blocks * BLOCK
    if literal > limit:
        return None
    out = [_varint(len(b)), _varint(len(t))]
    if blocks:
        follows = np.zeros(blocks, bool)     # block continues the run before it
        prev, cur = source[:-1], source[1:]
        follows[1:] = ((prev >= 0) & (cur == prev + BLOCK)) | ((prev < 0) & (cur < 0))
        run_starts = np.flatnonzero(~follows).tolist()
        for lo, hi in zip(run_starts, run_starts[1:] + [blocks]):
            if source[lo] >= 0:
                _append_copy(out, int(source[lo]), (hi - lo) * BLOCK)
            else:
                _append_insert(out, t[lo * BLOCK:hi * BLOCK])
    if len(t) > blocks * BLOCK:
        _append_insert(out, t[blocks * BLOCK:])
    return b"".join(out)


def _append_copy(out: list[bytes], offset: int, size: int) -> None:
    while size:
        step = min(size, COPY_MAX)
        out.append(_copy(offset, step))
        offset, size = offset + step, size - step


def _append_insert(out: list[bytes], data: np.ndarray) -> None:
    raw = data.tobytes()
    for i in range(0, len(raw), INSERT_MAX):
        piece = raw[i:i + INSERT_MAX]
        out.append(bytes([len(piece)]))
        out.append(piece)


def _object_header(kind: int, size: int) -> bytes:
    out = bytearray()
    byte, size = (kind << 4) | (size & 0x0F), size >> 4
    while size:
        out.append(byte | 0x80)
        byte, size = size & 0x7F, size >> 7
    out.append(byte)
    return bytes(out)


@dataclass(frozen=True)
class IndexEntry:
    """One packed object as the index lists it."""

    oid: bytes        # 20-byte SHA-1
    offset: int       # where its header starts in the pack
    crc32: int        # of its packed bytes (header, base id, zlib stream)


class PackWriter:
    """Writes a version-2 pack through ``write``, object by object; ``finish`` writes the
    trailer and returns the pack's SHA-1 (its name). ``count`` objects must be added.

    Example::

        pack = PackWriter(out.write, count=1)
        pack.add_blob(oid, data)
        name = pack.finish().hex()
    """

    def __init__(self, write: Callable[[bytes], object], count: int, *, level: int = 0) -> None:
        self._write, self._count, self._level = write, count, level
        self._sha = hashlib.sha1()
        self._offset = 0
        self.entries: list[IndexEntry] = []
        self._emit(b"PACK" + (2).to_bytes(4, "big") + count.to_bytes(4, "big"))

    def _emit(self, data: bytes) -> None:
        self._sha.update(data)
        self._write(data)
        self._offset += len(data)

    def _add(self, oid: str, head: bytes, data, level: int) -> None:
        start, crc = self._offset, zlib.crc32(head)
        self._emit(head)
        packer, view = zlib.compressobj(level), memoryview(data).cast("B")
        for i in range(0, len(view), FEED):
            piece = packer.compress(view[i:i + FEED])
            crc = zlib.crc32(piece, crc)
            self._emit(piece)
        piece = packer.flush()
        self._emit(piece)
        self.entries.append(IndexEntry(bytes.fromhex(oid), start, zlib.crc32(piece, crc)))

    def add_blob(self, oid: str, data) -> None:
        """A whole blob whose git object id is ``oid`` (hex), at the pack's zlib level."""
        self._add(oid, _object_header(_OBJ_BLOB, len(data)), data, self._level)

    def add_delta(self, oid: str, base_oid: str, delta: bytes) -> None:
        """The blob ``oid`` as :func:`git_delta` of the blob ``base_oid`` (in this pack)."""
        head = _object_header(_OBJ_REF_DELTA, len(delta)) + bytes.fromhex(base_oid)
        self._add(oid, head, delta, max(self._level, 1))

    def finish(self) -> bytes:
        if len(self.entries) != self._count:
            raise ValueError(f"pack announced {self._count} objects, got {len(self.entries)}")
        digest = self._sha.digest()
        self._write(digest)
        return digest


def index_bytes(entries: list[IndexEntry], pack_sha: bytes) -> bytes:
    """The version-2 index of a pack holding ``entries``."""
    ordered = sorted(entries, key=lambda e: e.oid)
    counts = np.bincount(np.array([e.oid[0] for e in ordered], np.int64), minlength=256).cumsum()
    small, large = [], []
    for e in ordered:
        if e.offset < 1 << 31:
            small.append(e.offset)
        else:
            small.append(0x80000000 | len(large))
            large.append(e.offset)
    body = b"".join([
        b"\377tOc", (2).to_bytes(4, "big"), counts.astype(">u4").tobytes(),
        *(e.oid for e in ordered),
        np.array([e.crc32 for e in ordered], ">u4").tobytes(),
        np.array(small, ">u4").tobytes(), np.array(large, ">u8").tobytes(), pack_sha])
    return body + hashlib.sha1(body).digest()

