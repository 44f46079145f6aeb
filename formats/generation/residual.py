"""Lossless numeric residuals: a shard file stored as the XOR against the same path's previous
generation, byte-plane shuffled and zstd-compressed, with a header that binds it to its base.

Consecutive generations of trained weights differ in their low mantissa bits: the XOR of two
generations is mostly zero in the sign/exponent byte planes, which zstd then compresses well.
Decoding checks that it is applied to the right base (length and SHA-256) and that the result
is the exact target (length and SHA-256), so a residual yields the target's bytes or an error.
Byte layout: ``docs/formats/residual.md``.

>>> base = np.linspace(0, 1, 1000, dtype=np.float32).tobytes()
>>> target = (np.linspace(0, 1, 1000, dtype=np.float32) * np.float32(1.001)).tobytes()
>>> blob = encode_residual(base, target, itemsize=4)
>>> decode_residual(base, blob) == target
True
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import numpy as np
import zstandard as zstd

from snapops.formats._kernels import (compact_nonzero, expand_nonzero, unshuffle_xor,
                                      zero_run_producer)
from snapops.formats.errors import FormatError, LimitError
from snapops.formats.limits import (
    DEFAULT_LIMITS,
    DeclaredLimits,
    check_declared,
    zstd_decompressor,
)
from snapops.formats.zstdframe import (ONE_SHOT, FrameError, FrameWriter, decode_frames_into,
                                       frame_sizes)

MAGIC = b"SNRS"
VERSION = 2        # a frame per byte plane, sparse planes; version 1 (one frame) still read
READABLE = (1, 2)
# magic, version, itemsize, flags, target length, base length, base sha256, target sha256,
# payload length
HEADER = struct.Struct("<4sBBHQQ32s32sQ")
ITEMSIZES = (1, 2, 4, 8)
LEVEL = 1          # without the producer: level 3 is 1.5x slower here for the same size
THREADS = 2
CHUNK_ITEMS = 1 << 20   # items per chunk of a plane on its way to the compressor
MAX_FRAMES = 16         # a frame per plane, two per sparse plane (its bitmap, its values)
# A plane's literals are Huffman-coded only when its bytes' entropy (sampled) promises a
# saving of at least 1/8: a plane of nearly random bytes (the second of float32) saved 3% and
# decoded at 0.76 GB/s, against 11 GB/s stored raw.
HUFFMAN_BITS_MAX = 7.0
SAMPLE_STEP = 8
# A plane (not the last) at most this dense with nonzero bytes is stored sparse: a bitmap of
# its nonzero bytes, then those bytes. The carry planes (15-30% nonzero) Huffman-decode 3-4x
# faster that way (a quarter of the bytes to decode) and are 5-10% smaller.
SPARSE_MAX = 0.5


@dataclass(frozen=True)
class ResidualHeader:
    itemsize: int
    target_length: int
    base_length: int
    base_sha256: str
    target_sha256: str
    payload_length: int
    sparse: int = 0          # the flags: bit k set, plane k stored sparse (version 2)


def _plane_chunks(base: bytes | memoryview, target: bytes | memoryview,
                  itemsize: int) -> Iterator[np.ndarray]:
    """The byte planes of ``target`` XOR ``base`` (a shorter base counts as zeros, a longer
    one is cut: all first bytes of each ``itemsize`` item, then all second bytes, ...; a tail
    shorter than one item at the end), at most ``CHUNK_ITEMS`` bytes at a time (a yielded
    array is valid until the next one is asked for): per plane, one XOR of the two files'
    strided bytes per chunk of items, so neither file is copied (strided inputs in 1 Mi-item
    chunks run faster here than a whole-file XOR followed by a strided copy per plane).

    >>> [int(x) for c in _plane_chunks(bytes(9), bytes(range(9)), 4) for x in c]
    [0, 4, 1, 5, 2, 6, 3, 7, 8]
    """
    t, b = np.frombuffer(target, np.uint8), np.frombuffer(base, np.uint8)
    items = len(t) // itemsize
    whole = items * itemsize
    covered = min(len(b), whole) // itemsize            # items wholly inside the base
    t_items = t[:whole].reshape(items, itemsize)
    b_items = b[:covered * itemsize].reshape(covered, itemsize)
    beyond = t_items[covered:].copy()                   # past the base's end: base = zeros
    part = b[covered * itemsize:min(len(b), whole)]
    beyond.reshape(-1)[:len(part)] ^= part
    chunk = np.empty(min(CHUNK_ITEMS, covered), np.uint8)
    for k in range(itemsize):
        for start in range(0, covered, CHUNK_ITEMS):
            n = min(CHUNK_ITEMS, covered - start)
            np.bitwise_xor(t_items[start:start + n, k], b_items[start:start + n, k],
                           out=chunk[:n])
            yield chunk[:n]
        if len(beyond):
            yield np.ascontiguousarray(beyond[:, k])
    tail = t[whole:].copy()
    n = max(0, min(len(b), len(t)) - whole)
    tail[:n] ^= b[whole:whole + n]
    yield tail


def _plane_sizes(length: int, itemsize: int) -> list[int]:
    """The bytes of each byte plane of a residual's planes, the last one also holding the
    tail.

    >>> _plane_sizes(10, 4), _plane_sizes(3, 4)
    ([2, 2, 2, 4], [0, 0, 0, 3])
    """
    items, tail = divmod(length, itemsize)
    return [items] * (itemsize - 1) + [items + tail]


def _huffman_pays(plane: np.ndarray) -> bool:
    """Whether a plane whose first bytes are ``plane`` is worth Huffman-coding: the entropy of
    every ``SAMPLE_STEP``-th byte, at most ``HUFFMAN_BITS_MAX`` bits per byte.

    >>> noise = np.random.default_rng(0).integers(0, 256, 1 << 16, np.uint8)
    >>> _huffman_pays(np.zeros(4096, np.uint8)), _huffman_pays(noise)
    (True, False)
    """
    counts = np.bincount(plane[::SAMPLE_STEP], minlength=256)
    seen = counts[counts > 0] / max(1, counts.sum())
    return float(-(seen * np.log2(seen)).sum()) <= HUFFMAN_BITS_MAX


def _sparse_pays(plane: np.ndarray) -> bool:
    """Whether a plane whose first bytes are ``plane`` is stored sparse: at most
    ``SPARSE_MAX`` of every ``SAMPLE_STEP``-th byte nonzero."""
    sample = plane[::SAMPLE_STEP]
    return np.count_nonzero(sample) <= SPARSE_MAX * len(sample)


def _sparse(first: np.ndarray, chunks: Iterator[np.ndarray], size: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """The bitmap (bit j of byte g, least significant first: byte 8g + j is nonzero) and the
    nonzero bytes, in order, of a plane of ``size`` bytes that starts with ``first`` and goes
    on with ``chunks`` (gathered, then compacted in place by the C kernel: numpy's masked
    indexing took 70 ms for 16 MiB, the kernel 2).

    >>> bitmap, values = _sparse(np.array([0, 5, 0, 0, 0, 0, 0, 0, 7], np.uint8), iter([]), 9)
    >>> bitmap.tolist(), values.tolist()
    ([2, 1], [5, 7])
    """
    plane = np.empty(size, np.uint8)
    chunk, done = first, 0
    while True:
        plane[done:done + len(chunk)] = chunk
        done += len(chunk)
        if done >= size:
            break
        chunk = next(chunks)
    bitmap = np.empty((size + 7) // 8, np.uint8)
    return bitmap, plane[:compact_nonzero(plane, bitmap, plane)]


def _write_frame(out: BinaryIO, parts: list[np.ndarray], literals: bool) -> None:
    with FrameWriter(out, sum(len(p) for p in parts), level=LEVEL, threads=THREADS,
                     producer=zero_run_producer(), literals=literals) as frame:
        for part in parts:
            frame.write(part)


def write_residual(base: bytes | memoryview, target: bytes | memoryview, out: BinaryIO, *,
                   itemsize: int, base_sha256: str | None = None,
                   target_sha256: str | None = None) -> int:
    """Write the residual that turns ``base`` into ``target`` to ``out`` (a seekable binary
    file, from its current position); its length. ``itemsize`` is the width of the numbers in
    the file (bytes per element of its dominant dtype). The planes go through the compressor a
    chunk at a time, so no copy of either file is held in memory (a sparse plane is gathered
    first: one plane, 1/itemsize of the file, at most). A caller that already knows the
    SHA-256 of either (hex) passes it and saves a pass over the bytes."""
    if itemsize not in ITEMSIZES:
        raise ValueError(f"itemsize must be one of {ITEMSIZES}, got {itemsize}")
    start = out.tell()
    out.write(bytes(HEADER.size))                       # the header is written last
    chunks = _plane_chunks(base, target, itemsize)
    sparse = 0
    for plane, size in enumerate(_plane_sizes(len(target), itemsize)):
        if not size:
            continue
        first = next(chunks)
        if plane < itemsize - 1 and _sparse_pays(first):
            sparse |= 1 << plane
            bitmap, values = _sparse(first, chunks, size)
            _write_frame(out, [bitmap], _huffman_pays(bitmap))
            _write_frame(out, [values], _huffman_pays(values[:len(first)]))
            continue
        with FrameWriter(out, size, level=LEVEL, threads=THREADS, producer=zero_run_producer(),
                         literals=_huffman_pays(first)) as frame:
            frame.write(first)
            done = len(first)
            while done < size:                          # chunks never straddle two planes
                chunk = next(chunks)
                frame.write(chunk)
                done += len(chunk)
    if len(target) == 0:
        _write_frame(out, [], True)
    end = out.tell()
    out.seek(start)
    out.write(HEADER.pack(MAGIC, VERSION, itemsize, sparse, len(target), len(base),
                          bytes.fromhex(base_sha256 or hashlib.sha256(base).hexdigest()),
                          bytes.fromhex(target_sha256 or hashlib.sha256(target).hexdigest()),
                          end - start - HEADER.size))
    out.seek(end)
    return end - start


def encode_residual(base: bytes | memoryview, target: bytes | memoryview, *, itemsize: int,
                    base_sha256: str | None = None, target_sha256: str | None = None) -> bytes:
    """:func:`write_residual` into memory: the residual's bytes."""
    out = io.BytesIO()
    write_residual(base, target, out, itemsize=itemsize, base_sha256=base_sha256,
                   target_sha256=target_sha256)
    return out.getvalue()


def read_header(blob: bytes | memoryview, path: str = "residual", *,
                total: int | None = None) -> ResidualHeader:
    """The header of a residual, checked for shape (not yet against any base); ``total`` is
    the residual's whole length when ``blob`` holds only its start."""
    total = len(blob) if total is None else total
    if len(blob) < HEADER.size:
        raise FormatError("residual shorter than its header", path=path, offset=0,
                          check="residual", expected=f"at least {HEADER.size} bytes",
                          got=f"{len(blob)} bytes")
    magic, version, itemsize, flags, t_len, b_len, b_sha, t_sha, p_len = \
        HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise FormatError("not a snapops residual", path=path, offset=0, check="residual",
                          expected=repr(MAGIC), got=repr(magic))
    if version not in READABLE:
        raise FormatError("unsupported residual version", path=path, offset=4,
                          check="residual", expected="version 1 or 2",
                          got=f"version {version}")
    if itemsize not in ITEMSIZES:
        raise FormatError("bad residual item size", path=path, offset=5, check="residual",
                          expected=f"one of {ITEMSIZES}", got=str(itemsize))
    sparse_ok = (1 << (itemsize - 1)) - 1 if version == 2 and t_len >= itemsize else 0
    if flags & ~sparse_ok:
        raise FormatError("bad residual flags", path=path, offset=6, check="residual",
                          expected=f"sparse planes within {sparse_ok:#x}", got=f"{flags:#x}")
    if HEADER.size + p_len != total:
        raise FormatError("residual payload length differs from the header", path=path,
                          offset=HEADER.size - 8, check="residual",
                          expected=f"{HEADER.size + p_len} bytes in all", got=f"{total}")
    return ResidualHeader(itemsize, t_len, b_len, b_sha.hex(), t_sha.hex(), p_len, flags)


@dataclass(frozen=True)
class Planes:
    """A residual's byte planes as decoded, to be applied: ``dense`` is laid out as the planes
    are (``target_length`` bytes), but that the place of a sparse plane holds its values, not
    its bytes; ``sparse`` is (plane, bitmap, values) for each sparse plane. Sparse planes stay
    a bitmap and its values until the kernel that applies them expands them on its way:
    expanded beforehand, the planes of a sparse change (1% of rows) cost a write and a read
    of a shard's worth of zeros per residual."""
    dense: np.ndarray
    itemsize: int
    sparse: tuple[tuple[int, np.ndarray, np.ndarray], ...] = ()

    def layout(self) -> np.ndarray:
        """The planes as the format lays them out (sparse planes expanded), in new memory.

        >>> bitmap, values = np.array([0b101], np.uint8), np.array([9, 8], np.uint8)
        >>> Planes(np.arange(6, dtype=np.uint8), 2, ((0, bitmap, values),)).layout().tolist()
        [9, 0, 8, 3, 4, 5]
        """
        out = self.dense.copy()
        n = len(out) // self.itemsize
        for plane, bitmap, values in self.sparse:
            expand_nonzero(out[plane * n:(plane + 1) * n], bitmap, values)
        return out


def planes_room(head: ResidualHeader) -> int:
    """The bytes a buffer needs to decode ``head``'s residual into (:func:`decompress_planes`):
    its planes (a sparse plane's values in its place: at most as many as its bytes), then the
    bitmaps of its sparse planes.

    >>> planes_room(ResidualHeader(4, 10, 0, "", "", 0, sparse=0b101))
    12
    """
    return head.target_length + sum((size + 7) // 8 for _, size, sparse in _segments(head)
                                    if sparse)


def residual_planes(blob: bytes | memoryview, *, path: str = "residual",
                    limits: DeclaredLimits = DEFAULT_LIMITS) -> tuple[ResidualHeader, np.ndarray]:
    """The checked header of a residual and its byte planes as the format lays them out
    (sparse ones expanded; not yet applied)."""
    head, planes = _header_and_planes(blob, path, limits)
    return head, planes.layout()


def _header_and_planes(blob: bytes | memoryview, path: str,
                       limits: DeclaredLimits) -> tuple[ResidualHeader, Planes]:
    """The checked header of a residual in memory and its decoded planes."""
    head = read_header(blob, path)
    check_declared("residual target", head.target_length, limits, path)
    return head, decompress_planes(memoryview(blob)[HEADER.size:], head, None, path)


def apply_planes(base: np.ndarray, head: ResidualHeader, planes: Planes,
                 path: str = "residual") -> np.ndarray:
    """The target of a residual from its ``base`` (a writable contiguous uint8 array, changed
    in place when it has the target's length) and its decoded ``planes``: the base fitted to
    the target's length (cut, or padded with zeros) XOR the unshuffled planes, in one
    sequential pass (the C kernel: 4x faster than numpy's strided XOR per plane), which
    expands the sparse planes on the way. FormatError when a sparse plane's bitmap does not
    match its values (the base's bytes are then undefined)."""
    if len(base) != head.target_length:
        fitted = np.zeros(head.target_length, np.uint8)
        n = min(len(base), head.target_length)
        fitted[:n] = base[:n]
        base = fitted
    size = head.itemsize
    whole = len(base) // size * size
    try:
        unshuffle_xor(base[:whole], planes.dense[:whole], size, planes.sparse)
    except ValueError as exc:
        raise FormatError(f"residual payload has a bad sparse plane: {exc}", path=path,
                          offset=HEADER.size, check="residual") from None
    base[whole:] ^= planes.dense[whole:]
    return base


def decode_residual(base: bytes | memoryview, blob: bytes | memoryview, *,
                    path: str = "residual", limits: DeclaredLimits = DEFAULT_LIMITS) -> bytes:
    """``target`` from ``base`` and its residual ``blob``; FormatError when ``blob`` is not a
    residual of ``base`` or does not reproduce the target it names."""
    head, planes = _header_and_planes(blob, path, limits)
    if len(base) != head.base_length or hashlib.sha256(base).hexdigest() != head.base_sha256:
        raise FormatError("residual applied to the wrong base", path=path, offset=24,
                          check="residual-base", expected=f"base sha256={head.base_sha256}",
                          got=f"sha256={hashlib.sha256(base).hexdigest()}")
    out = apply_planes(np.frombuffer(base, np.uint8).copy(), head, planes, path).tobytes()
    got = hashlib.sha256(out).hexdigest()
    if got != head.target_sha256:
        raise FormatError("residual does not reproduce its target", path=path,
                          check="residual-digest", expected=f"sha256={head.target_sha256}",
                          got=f"sha256={got}")
    return out


def decompress_planes(source: BinaryIO | bytes | memoryview, head: ResidualHeader,
                      out: np.ndarray | None, path: str = "residual") -> Planes:
    """The byte planes of a residual, decompressed into ``out`` (a writable uint8 array at
    least :func:`planes_room` long, which a caller decoding many residuals reuses: no fresh
    memory per residual; None: a new one, allocated once the frames declare their sizes),
    sparse ones as their bitmap and values (:class:`Planes`). ``source`` is the payload, or a
    file positioned at its first byte. The payload must be at most ``MAX_FRAMES`` zstd frames
    whose declared content sizes hold exactly the planes (a sparse one: a bitmap of one bit
    per byte, at most as many values as bytes), so nothing beyond ``out`` is ever written.
    Whether a bitmap's bits match its values is checked when the plane is applied."""
    segments = _segments(head)
    room = planes_room(head)
    if out is not None and len(out) < room:
        raise ValueError(f"out holds {len(out)} bytes, the planes need {room}")
    try:
        with _payload(source) as payload:
            if payload is not None and ONE_SHOT:
                frames = frame_sizes(payload, MAX_FRAMES)
                _check_frames(frames, segments, head.target_length, path)
                buffer = _allocate(room, path) if out is None else out[:room]
                sparse = _decode_segments(payload, frames, segments, buffer, head)
            else:
                buffer = _allocate(room, path) if out is None else out[:room]
                sparse = _stream_segments(source, segments, buffer, head, path)
    except (zstd.ZstdError, FrameError) as exc:
        raise FormatError(f"residual payload is not valid zstd: {exc}", path=path,
                          offset=HEADER.size, check="residual") from None
    return Planes(buffer[:head.target_length], head.itemsize, tuple(sparse))


def _segments(head: ResidualHeader) -> list[tuple[int, int, bool]]:
    """Where the decoded frames go: (offset, bytes, sparse) per plane that has bytes; without
    sparse planes, all of the target as one segment (frames cut anywhere).

    >>> _segments(ResidualHeader(4, 10, 0, "", "", 0, sparse=0b100))
    [(0, 2, False), (2, 2, False), (4, 2, True), (6, 4, False)]
    """
    if not head.sparse:
        return [(0, head.target_length, False)]
    sizes = _plane_sizes(head.target_length, head.itemsize)
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    return [(at, size, bool(head.sparse >> k & 1))
            for k, (at, size) in enumerate(zip(starts, sizes)) if size]


def _check_frames(frames: list[tuple[int, int]], segments: list[tuple[int, int, bool]],
                  length: int, path: str) -> None:
    """The frames' declared sizes against the planes, before anything is decoded."""
    if len(segments) == 1 and not segments[0][2]:
        _check_length(sum(declared for _, declared in frames), length, path)
        return
    wanted = sum(2 if sparse else 1 for _, _, sparse in segments)
    if len(frames) != wanted:
        raise FormatError("residual payload does not have a frame per plane", path=path,
                          offset=HEADER.size, check="residual",
                          expected=f"{wanted} frames", got=f"{len(frames)}")
    at = 0
    for _, size, sparse in segments:
        rules = [("exactly", (size + 7) // 8), ("at most", size)] if sparse \
            else [("exactly", size)]
        for (rule, bound), (_, declared) in zip(rules, frames[at:at + len(rules)]):
            if declared > bound or (rule == "exactly" and declared != bound):
                raise FormatError("residual frame does not fit its plane", path=path,
                                  offset=HEADER.size, check="residual",
                                  expected=f"{rule} {bound} bytes", got=f"{declared} bytes")
        at += len(rules)


def _places(head: ResidualHeader, buffer: np.ndarray
            ) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
    """Where each segment (:func:`_segments`) is decoded to in ``buffer``: (its plane, the
    place of its bytes, or of a sparse plane's values; None, or the place of the sparse
    plane's bitmap). A sparse plane has at most as many values as bytes: they go to its own
    place; its bitmap past the planes, after those of the sparse planes before it
    (:func:`planes_room`).

    >>> [(k, len(at), bitmap is None or len(bitmap)) for k, at, bitmap in
    ...  _places(ResidualHeader(4, 22, 0, "", "", 0, sparse=0b101), np.empty(24, np.uint8))]
    [(0, 5, 1), (1, 5, True), (2, 5, 1), (3, 7, True)]
    """
    bitmaps = head.target_length
    plane_size = max(1, head.target_length // head.itemsize)
    for offset, size, sparse in _segments(head):
        bitmap = None
        if sparse:
            bitmap = buffer[bitmaps:bitmaps + (size + 7) // 8]
            bitmaps += len(bitmap)
        yield offset // plane_size, buffer[offset:offset + size], bitmap


def _decode_segments(payload: memoryview, frames: list[tuple[int, int]],
                     segments: list[tuple[int, int, bool]], buffer: np.ndarray,
                     head: ResidualHeader) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The frames (checked by :func:`_check_frames`) decoded into their places in
    ``buffer``; the sparse planes as (plane, bitmap, values)."""
    if len(segments) == 1 and not segments[0][2]:
        decode_frames_into(payload, buffer[:head.target_length], frames)
        return []
    starts = np.cumsum([0] + [compressed for compressed, _ in frames]).tolist()

    def decode(index: int, place: np.ndarray) -> np.ndarray:
        decode_frames_into(payload[starts[index]:starts[index + 1]], place,
                           frames[index:index + 1])
        return place[:frames[index][1]]

    sparse, index = [], 0
    for plane, place, bitmap in _places(head, buffer):
        if bitmap is None:
            decode(index, place)
            index += 1
        else:
            sparse.append((plane, decode(index, bitmap), decode(index + 1, place)))
            index += 2
    return sparse


def _stream_segments(source, segments: list[tuple[int, int, bool]], buffer: np.ndarray,
                     head: ResidualHeader, path: str
                     ) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Where libzstd's one-shot decoder cannot be used: the frames streamed, each segment
    into its place (a sparse plane's bitmap first, which says how many values follow); the
    sparse planes as (plane, bitmap, values)."""
    reader = zstd_decompressor().stream_reader(source, read_size=1 << 20, closefd=False,
                                               read_across_frames=True)

    def read_into(view: memoryview) -> int:
        got = 0
        while got < len(view) and (n := reader.readinto(view[got:])):
            got += n
        return got

    sparse = []
    for plane, place, bitmap in _places(head, buffer):
        if bitmap is None:
            _check_length(read_into(memoryview(place)), len(place), path)
            continue
        _check_length(read_into(memoryview(bitmap)), len(bitmap), path)
        count = int(np.unpackbits(bitmap).sum())
        if count > len(place):
            raise FormatError("residual payload has a bad sparse plane: its bitmap sets more "
                              "bits than the plane has bytes", path=path, offset=HEADER.size,
                              check="residual", expected=f"at most {len(place)} bits",
                              got=f"{count}")
        _check_length(read_into(memoryview(place[:count])), count, path)
        sparse.append((plane, bitmap, place[:count]))
    _check_length(sum(size for _, size, _ in segments) + len(reader.read(1)),
                  head.target_length, path)
    return sparse


def _check_length(got: int, length: int, path: str) -> None:
    if got > length:
        raise FormatError("residual payload expands beyond its declared length", path=path,
                          offset=HEADER.size, check="residual", expected=f"{length} bytes",
                          got=f"{got} bytes")
    if got < length:
        raise FormatError("residual payload does not hold its declared length", path=path,
                          offset=HEADER.size, check="residual", expected=f"{length} bytes",
                          got=f"{got} bytes")


@contextlib.contextmanager
def _payload(source: BinaryIO | bytes | memoryview) -> Iterator[memoryview | None]:
    """The payload as a buffer: ``source`` itself, or the rest of the file from its
    position, mapped (no copy through ``read``); None for a stream that cannot be mapped."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield memoryview(source)
        return
    try:
        at, size = source.tell(), os.fstat(source.fileno()).st_size
        pages = mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) if size > at else None
    except (OSError, ValueError, io.UnsupportedOperation):
        yield None
        return
    if pages is None:
        yield memoryview(b"")
        return
    with pages:
        view = memoryview(pages)[at:]
        try:
            yield view
        finally:
            view.release()


def _allocate(length: int, path: str) -> np.ndarray:
    try:
        return np.empty(length, np.uint8)
    except MemoryError:
        raise LimitError("no memory for the residual's target", path=path, offset=8,
                         check="limit", expected=f"{length} bytes free", got="MemoryError"
                         ) from None
