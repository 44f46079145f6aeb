"""Residuals round-trip exactly and refuse the wrong base, corruption and bombs."""

from __future__ import annotations

import hashlib
import os
import struct

import ml_dtypes
import numpy as np
import pytest
import zstandard as zstd
from snapops.formats._kernels import compact_nonzero, expand_nonzero, unshuffle_xor
from snapops.formats.errors import FormatError, LimitError
from snapops.formats.generation import residual
from snapops.formats.generation.residual import (
    HEADER,
    Planes,
    ResidualHeader,
    apply_planes,
    decode_residual,
    decompress_planes,
    encode_residual,
    planes_room,
    read_header,
)
from snapops.formats.lfs.objects import ObjectStore
from snapops.formats.limits import DeclaredLimits


def _planes(base: bytes, target: bytes) -> np.ndarray:
    """The byte planes a residual (item size 4) stores, decompressed."""
    return residual.residual_planes(encode_residual(base, target, itemsize=4))[1]


def _pair(dtype, n=50_000, step=1e-3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    b = a * (1 + step * rng.standard_normal(n).astype(np.float32))
    return a.astype(dtype).tobytes(), b.astype(dtype).tobytes()


@pytest.mark.parametrize("dtype,itemsize,bound", [(np.float32, 4, 0.75),
                                                  (ml_dtypes.bfloat16, 2, 0.5)])
def test_round_trip_is_exact_and_smaller(dtype, itemsize, bound):
    base, target = _pair(dtype)
    blob = encode_residual(base, target, itemsize=itemsize)
    assert decode_residual(base, blob) == target
    assert len(blob) < bound * len(target)
    known = {"base_sha256": hashlib.sha256(base).hexdigest(),
             "target_sha256": hashlib.sha256(target).hexdigest()}
    assert encode_residual(base, target, itemsize=itemsize, **known) == blob
    head = read_header(blob)
    assert (head.itemsize, head.target_length, head.base_length) == (itemsize, len(target),
                                                                     len(base))


@pytest.mark.parametrize("grow", [-13, 0, 7])
def test_lengths_that_differ_and_odd_tails(grow):
    base, target = _pair(np.float32, n=1001)
    target = target[:len(target) + grow] if grow < 0 else target + b"\x01" * grow
    assert decode_residual(base, encode_residual(base, target, itemsize=4)) == target


def test_shuffle_is_byte_planes():
    data = np.arange(10, dtype=np.uint8)
    planes = _planes(bytes(10), data.tobytes())          # XOR a zero base: the data
    assert planes.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 9]
    head = ResidualHeader(4, len(data), len(data), "", "", 0)
    assert apply_planes(np.zeros(10, np.uint8), head, Planes(planes, 4)).tolist() == \
        data.tolist()



@pytest.mark.parametrize("itemsize", residual.ITEMSIZES)
@pytest.mark.parametrize("offset", [0, 1])
def test_unshuffle_matches_a_transpose(itemsize, offset):
    """A tail shorter than an item, and a base that does not start on a word boundary;
    checked against numpy's transpose."""
    n = (1 << 20) + 5 * itemsize + 3
    rng = np.random.default_rng(itemsize)
    base = rng.integers(0, 256, n + offset, dtype=np.uint8)[offset:]
    planes = rng.integers(0, 256, n, dtype=np.uint8)
    whole = n // itemsize * itemsize
    expected = base.copy()
    expected[:whole] ^= planes[:whole].reshape(itemsize, -1).T.reshape(-1)
    expected[whole:] ^= planes[whole:]
    head = ResidualHeader(itemsize, n, n, "", "", 0)
    assert np.array_equal(apply_planes(base, head, Planes(planes, itemsize)), expected)

@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 33, 4099])
@pytest.mark.parametrize("itemsize", range(1, 9))
def test_the_unshuffle_kernel_is_a_transpose_for_every_item_size(itemsize, count):
    """The C kernel itself, its special cases (2, 4: 16 items at a time, then one by one) and
    its general loop, against numpy."""
    n = count * itemsize
    rng = np.random.default_rng(100 + itemsize + count)
    items, planes = rng.integers(0, 256, (2, n), dtype=np.uint8)
    expected = items ^ planes.reshape(itemsize, -1).T.reshape(-1)
    unshuffle_xor(items, planes, itemsize)
    assert np.array_equal(items, expected)


@pytest.mark.parametrize("itemsize", [2, 4])
def test_the_unshuffle_kernel_skips_only_items_whose_planes_are_zero(itemsize):
    """Planes of zeros but for one byte, in each plane and at each place of a 16-item block
    (the blocks the kernel skips when all their planes are zero), then for a sparse pattern
    of rows: exactly the XOR numpy computes, every other item left as it was."""
    count = 64
    rng = np.random.default_rng(7)
    items = rng.integers(0, 256, count * itemsize, dtype=np.uint8)
    for plane in range(itemsize):
        for at in (0, 1, 15, 16, 31, 47, 63):
            planes = np.zeros(count * itemsize, np.uint8)
            planes[plane * count + at] = 0x5A
            got = items.copy()
            unshuffle_xor(got, planes, itemsize)
            expected = items ^ planes.reshape(itemsize, -1).T.reshape(-1)
            assert np.array_equal(got, expected)
            assert np.count_nonzero(got != items) == 1
    planes = np.zeros((itemsize, 4096), np.uint8)
    planes[:, 1000:1040] = rng.integers(1, 256, (itemsize, 40), dtype=np.uint8)
    big = rng.integers(0, 256, 4096 * itemsize, dtype=np.uint8)
    got = big.copy()
    unshuffle_xor(got, planes.reshape(-1), itemsize)
    assert np.array_equal(got, big ^ planes.T.reshape(-1))


@pytest.mark.parametrize("items, planes, itemsize, error, message", [
    (np.zeros(8, np.uint8), np.zeros(12, np.uint8), 4, ValueError, "same whole number"),
    (np.zeros(10, np.uint8), np.zeros(10, np.uint8), 4, ValueError, "same whole number"),
    (np.zeros(8, np.uint8), np.zeros(8, np.uint8), 0, ValueError, "itemsize must be 1..8"),
    (np.zeros(16, np.uint8), np.zeros(16, np.uint8), 16, ValueError, "itemsize must be 1..8"),
    (np.zeros(16, np.uint8)[::2], np.zeros(8, np.uint8), 4, ValueError, "contiguous"),
    (b"12345678", np.zeros(8, np.uint8), 4, BufferError, "not writable"),
])
def test_the_unshuffle_kernel_refuses_buffers_that_do_not_fit(items, planes, itemsize, error,
                                                               message):
    with pytest.raises(error, match=message):
        unshuffle_xor(items, planes, itemsize)


def test_wrong_base_refused():
    base, target = _pair(np.float32, n=1000)
    other, _ = _pair(np.float32, n=1000, seed=1)
    blob = encode_residual(base, target, itemsize=4)
    with pytest.raises(FormatError, match="wrong base"):
        decode_residual(other, blob)


@pytest.mark.parametrize("where,check", [("magic", "residual"), ("payload", "residual-digest"),
                                         ("length", "residual"),
                                         ("target_digest", "residual-digest")])
def test_corrupt_residual_refused(where, check):
    base, target = _pair(np.float32, n=1000)
    blob = bytearray(encode_residual(base, target, itemsize=4))
    if where == "magic":
        blob[0] ^= 1
    elif where == "payload":
        blob[HEADER.size + len(blob[HEADER.size:]) // 2] ^= 0x40
    elif where == "length":
        blob += b"\0"
    else:
        blob[60] ^= 1                       # inside the target's SHA-256
    with pytest.raises(FormatError, match=rf"\[{check}\]"):
        decode_residual(base, bytes(blob))


def test_declared_size_bounded_before_anything_is_allocated():
    base = b"\0" * 16
    payload = zstd.ZstdCompressor().compress(b"\0" * 16)
    head = HEADER.pack(b"SNRS", 1, 4, 0, 1 << 40, 16, hashlib.sha256(base).digest(),
                       b"\0" * 32, len(payload))
    with pytest.raises(LimitError, match=r"\[limit\]"):
        decode_residual(base, head + payload, limits=DeclaredLimits(max_bytes=1 << 30))


def test_payload_longer_than_declared_refused():
    base = b"\0" * 64
    payload = zstd.ZstdCompressor().compress(b"\0" * 4096)
    head = HEADER.pack(b"SNRS", 1, 4, 0, 64, 64, hashlib.sha256(base).digest(), b"\0" * 32,
                       len(payload))
    with pytest.raises(FormatError, match="beyond its declared length"):
        decode_residual(base, head + payload)
    assert struct.calcsize("<4sBBHQQ32s32sQ") == HEADER.size == 96


def test_planes_decode_into_a_reused_buffer_and_refuse_a_short_one(tmp_path):
    """The planes and the sparse plane's bitmap and values all in ``out`` (the planes' room:
    their length and the bitmap's), nothing written past it; a shorter ``out`` refused."""
    base, target = _pair(np.float32, n=1000)
    blob = encode_residual(base, target, itemsize=4)
    head = read_header(blob)
    room = planes_room(head)
    assert head.sparse == 0b100 and room == head.target_length + 1000 // 8
    out = np.full(room + 10, 7, np.uint8)
    f = tmp_path / "r"
    f.write_bytes(blob)
    with open(f, "rb") as stream:
        stream.seek(HEADER.size)
        planes = decompress_planes(stream, head, out)
    [(plane, bitmap, values)] = planes.sparse
    assert plane == 2 and all(np.shares_memory(a, out) for a in (planes.dense, bitmap, values))
    assert planes.layout().tobytes() == _planes(base, target).tobytes()
    assert out[room:].tolist() == [7] * 10                        # nothing past the room
    with pytest.raises(ValueError, match=rf"out holds {room - 1} bytes, the planes need {room}"):
        decompress_planes(blob[HEADER.size:], head, out[:room - 1])
    payload = zstd.ZstdCompressor(write_content_size=False).compress(b"\0" * 100)
    with pytest.raises(FormatError, match="frame at byte 0 declares no content size"):
        decompress_planes(payload, ResidualHeader(4, 100, 0, "", "", 0), np.empty(100, np.uint8))


def test_a_plane_per_frame_its_literals_coded_only_where_that_pays():
    """float32 steps of 1e-3: the two low planes are nearly random (a frame each, literals
    stored raw: about the plane's size), the carry plane sparse (a bitmap frame and a frame
    of its nonzero bytes, far smaller), the top plane mostly zeros (coded)."""
    from snapops.formats.zstdframe import frame_sizes

    n = 200_000
    base, target = _pair(np.float32, n=n)
    blob = encode_residual(base, target, itemsize=4)
    head = read_header(blob)
    assert blob[4] == 2 and head.sparse == 0b100
    frames = frame_sizes(memoryview(blob)[HEADER.size:])
    carry = np.count_nonzero(_planes(base, target)[2 * n:3 * n])
    assert [declared for _, declared in frames] == [n, n, n // 8, carry, n]
    assert 0.1 * n < carry < 0.5 * n
    sizes = [size for size, _ in frames]
    assert sizes[0] > n and sizes[1] > 0.99 * n                   # raw (and a few headers)
    assert sizes[2] + sizes[3] < 0.4 * n and sizes[4] < 0.1 * n
    assert decode_residual(base, blob) == target


@pytest.mark.parametrize("frames,message", [
    (17, "more than 16 frames"), (3, "does not hold its declared length"),
])
def test_a_payload_of_too_many_or_too_few_frames_is_refused(frames, message):
    """16 frames at most (a plane each, two for a sparse one), their declared sizes adding up
    to the target."""
    base, target = _pair(np.float32, n=1000)
    planes = _planes(base, target).tobytes()
    cut = len(planes) // 16 if frames > 4 else len(planes) // 4
    parts = [planes[k * cut:(k + 1) * cut] for k in range(frames - 1)]
    parts.append(planes[(frames - 1) * cut:] if frames > 4 else b"")
    payload = b"".join(zstd.ZstdCompressor().compress(p) for p in parts)
    head = HEADER.pack(b"SNRS", 2, 4, 0, len(target), len(base),
                       hashlib.sha256(base).digest(), hashlib.sha256(target).digest(),
                       len(payload))
    with pytest.raises(FormatError, match=rf"\[residual\].*{message}"):
        decode_residual(base, head + payload)


def _sparse_plane(rng, count: int, density: float):
    """A plane of ``count`` bytes, about ``density`` of them not zero; its bitmap, values."""
    plane = np.where(rng.random(count) < density, rng.integers(1, 256, count), 0)
    plane = plane.astype(np.uint8)
    return plane, np.packbits(plane != 0, bitorder="little"), plane[plane != 0]


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 15, 16, 17, 33, 64, 200, 4099])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 1.0])
@pytest.mark.parametrize("itemsize", residual.ITEMSIZES)
def test_the_unshuffle_kernel_expands_sparse_planes_on_the_way(itemsize, density, count):
    """Each plane of every item size sparse in turn, then all but the last, against numpy:
    all-zero bitmaps (no values), counts that are not a multiple of 8 (a partial last bitmap
    byte) nor of the 16 items the kernel does at a time, a bit in the last, partial byte
    alone, the last values of a plane (read byte by byte: no load past them). A sparse
    plane's place in the planes holds garbage: it is not read."""
    rng = np.random.default_rng(1000 * itemsize + count + int(100 * density))
    choices = [[k] for k in range(itemsize)] + [list(range(itemsize - 1))]
    for sparse_planes in choices:
        planes = rng.integers(0, 256, (itemsize, count), dtype=np.uint8)
        expected_planes, sparse = planes.copy(), []
        for k in sparse_planes:
            plane, bitmap, values = _sparse_plane(rng, count, density)
            if count % 8 and k == sparse_planes[-1] and density == 0.0:
                plane[-1] = 0xA5
                bitmap, values = np.packbits(plane != 0, bitorder="little"), plane[-1:]
            expected_planes[k] = plane
            sparse.append((k, bitmap, values))
        items = rng.integers(0, 256, count * itemsize, dtype=np.uint8)
        expected = items ^ expected_planes.T.reshape(-1)
        unshuffle_xor(items, planes.reshape(-1), itemsize, sparse)
        assert np.array_equal(items, expected), sparse_planes


def _refused(case: str):
    """Arguments of unshuffle_xor (13 items of 4 bytes, plane 1 sparse with three bits set)
    made wrong as ``case`` says."""
    bitmap, values = np.array([0b1001, 0b10000], np.uint8), np.array([1, 2, 3], np.uint8)
    items, planes = np.arange(52, dtype=np.uint8), np.zeros(52, np.uint8)
    sparse = [(1, bitmap, values)]
    if case == "plane past the item":
        sparse = [(4, bitmap, values)]
    elif case == "plane below 0":
        sparse = [(-1, bitmap, values)]
    elif case == "a plane twice":
        sparse = [(1, bitmap, values), (1, bitmap, values)]
    elif case == "not a triple":
        sparse = [(1, bitmap)]
    elif case == "not a sequence":
        sparse = 7
    elif case == "bitmap a byte short":
        sparse = [(1, bitmap[:1], values)]
    elif case == "bitmap a byte long":
        sparse = [(1, np.append(bitmap, np.uint8(0)), values)]
    elif case == "a bit past the items":
        bitmap[1] |= 0b100000
        sparse = [(1, bitmap, np.append(values, np.uint8(4)))]
    elif case == "a value too few":
        sparse = [(1, bitmap, values[:2])]
    elif case == "a value too many":
        sparse = [(1, bitmap, np.append(values, np.uint8(4)))]
    elif case == "no value for the first bit":
        sparse = [(1, bitmap, values[:0])]
    return items, planes, 4, sparse


@pytest.mark.parametrize("case, error, message, touched", [
    ("plane past the item", ValueError, "sparse plane 4: not a plane of 4", False),
    ("plane below 0", ValueError, "sparse plane -1: not a plane of 4", False),
    ("a plane twice", ValueError, "sparse plane 1: .*named twice", False),
    ("not a triple", TypeError, r"sequence of \(plane, bitmap, values\)", False),
    ("not a sequence", TypeError, r"sequence of \(plane, bitmap, values\)", False),
    ("bitmap a byte short", ValueError, "13 items need a bitmap of 2 bytes, got 1", False),
    ("bitmap a byte long", ValueError, "13 items need a bitmap of 2 bytes, got 3", False),
    ("a bit past the items", ValueError, "sparse plane 1: the bitmap sets bits past its 13",
     False),
    ("a value too few", ValueError, r"sparse plane 1: .* as many bits as there are values "
     r"\(2\)", True),
    ("a value too many", ValueError, r"as there are values \(4\)", True),
    ("no value for the first bit", ValueError, r"as there are values \(0\)", True),
])
def test_the_unshuffle_kernel_refuses_sparse_planes_that_do_not_fit(case, error, message,
                                                                     touched):
    """Shapes (a bitmap's size, bits past the items) are refused before a byte is touched;
    a bitmap whose bits are not as many as the values is found on the way (never reading
    past the values), and the items are then undefined."""
    items, planes, itemsize, sparse = _refused(case)
    before = items.copy()
    with pytest.raises(error, match=message):
        unshuffle_xor(items, planes, itemsize, sparse)
    if not touched:
        assert np.array_equal(items, before)
    fine = _refused("none")
    unshuffle_xor(*fine)
    assert fine[0].reshape(-1, 4)[[0, 3, 12], 1].tolist() == [1 ^ 1, 13 ^ 2, 49 ^ 3]


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 4099])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 1.0])
def test_the_expand_kernel_puts_each_value_where_its_bit_says(count, density):
    """The C kernel (16 bytes at a time, then byte by byte near the end of the plane or of
    the values) against numpy; one value too few or too many, or a bit past the plane's end,
    is a ValueError and nothing is read beyond the values."""
    rng = np.random.default_rng(count + int(density * 10))
    plane = np.where(rng.random(count) < density, rng.integers(1, 256, count), 0)
    plane = plane.astype(np.uint8)
    bitmap = np.packbits(plane != 0, bitorder="little")
    values = plane[plane != 0]
    out = np.full(count, 7, np.uint8)
    expand_nonzero(out, bitmap, values)
    assert np.array_equal(out, plane)
    wrong = [(bitmap, np.append(values, np.uint8(1)))]
    if len(values):
        wrong.append((bitmap, values[:-1].copy()))
    if count % 8:
        past = bitmap.copy()
        past[-1] |= 0x80
        wrong.append((past, np.append(values, np.uint8(1))))
    for bits, vals in wrong:
        with pytest.raises(ValueError, match="does not describe"):
            expand_nonzero(np.empty(count, np.uint8), bits, vals)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 4099])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 1.0])
def test_the_compact_kernel_is_numpys_bitmap_and_mask_even_in_place(count, density):
    rng = np.random.default_rng(count + int(density * 10))
    plane = np.where(rng.random(count) < density, rng.integers(1, 256, count), 0)
    plane = plane.astype(np.uint8)
    bitmap = np.full((count + 7) // 8, 0xA5, np.uint8)
    values = np.full(count, 0xEE, np.uint8)
    got = compact_nonzero(plane, bitmap, values)
    assert np.array_equal(bitmap, np.packbits(plane != 0, bitorder="little"))
    assert got == np.count_nonzero(plane) and np.array_equal(values[:got], plane[plane != 0])
    in_place = plane.copy()
    assert compact_nonzero(in_place, bitmap, in_place) == got
    assert np.array_equal(in_place[:got], plane[plane != 0])
    back = np.empty(count, np.uint8)
    expand_nonzero(back, bitmap, values[:got])
    assert np.array_equal(back, plane)
    with pytest.raises(ValueError, match="needs a bitmap of"):
        compact_nonzero(plane, np.empty(len(bitmap) + 1, np.uint8), values)
    if count:
        with pytest.raises(ValueError, match="room for"):
            compact_nonzero(plane, bitmap, values[:-1])


def _sparse_blob(base: bytes, target: bytes, *, flags: int = 0b100, version: int = 2,
                 bitmap_extra: bytes = b"", values_cut: int = 0, drop_frame: bool = False,
                 bit_past: bool = False, values_extra: bytes = b""):
    """A float32 residual built by hand: planes 0, 1 and 3 a frame each, plane 2 as its
    bitmap frame and its values frame (optionally damaged; ``bit_past``: a bit set past the
    plane's end, and a value for it)."""
    planes = _planes(base, target)
    n = len(target) // 4
    carry = planes[2 * n:3 * n]
    bitmap = np.packbits(carry != 0, bitorder="little")
    if bit_past:
        bitmap[-1] |= 0x80
        values_extra += b"\x01"
    bitmap = bitmap.tobytes() + bitmap_extra
    values = carry[carry != 0].tobytes()[values_cut:] + values_extra
    parts = [planes[:n], planes[n:2 * n], bitmap, values, planes[3 * n:]]
    if drop_frame:
        parts.pop()
    payload = b"".join(zstd.ZstdCompressor().compress(bytes(p)) for p in parts)
    return HEADER.pack(b"SNRS", version, 4, flags, len(target), len(base),
                       hashlib.sha256(base).digest(), hashlib.sha256(target).digest(),
                       len(payload)) + payload


@pytest.mark.parametrize("one_shot", [True, False])
def test_a_sparse_plane_decodes_one_shot_and_streamed(monkeypatch, one_shot):
    base, target = _pair(np.float32, n=4099)
    monkeypatch.setattr(residual, "ONE_SHOT", one_shot)
    assert decode_residual(base, _sparse_blob(base, target)) == target
    assert decode_residual(base, encode_residual(base, target, itemsize=4)) == target


@pytest.mark.parametrize("damage,message", [
    (dict(flags=0b1000), r"bad residual flags.*within 0x7.*got 0x8"),
    (dict(flags=0b100, version=1), r"bad residual flags.*within 0x0"),
    (dict(values_cut=1), r"bad sparse plane: sparse plane 2: the bitmap does not set as many"),
    (dict(values_extra=b"\x07"), r"bad sparse plane: sparse plane 2: the bitmap does not set"),
    (dict(bit_past=True), r"bad sparse plane: sparse plane 2: the bitmap sets bits past its "
                          r"4099 items"),
    (dict(bitmap_extra=b"\0"), r"frame does not fit its plane.*exactly 513 bytes.*514"),
    (dict(drop_frame=True), r"does not have a frame per plane.*5 frames.*4"),
])
@pytest.mark.parametrize("one_shot", [True, False])
def test_a_damaged_sparse_plane_is_refused(monkeypatch, damage, message, one_shot):
    base, target = _pair(np.float32, n=4099)
    monkeypatch.setattr(residual, "ONE_SHOT", one_shot)
    if not one_shot and ("frame" in message or "values_cut" in damage or "values_extra" in
                         damage):
        message = r"\[residual\]"                 # streamed: frames are not walked
    with pytest.raises(FormatError, match=message):
        decode_residual(base, _sparse_blob(base, target, **damage))


@pytest.mark.parametrize("one_shot, message", [
    (True, r"frame does not fit its plane.*at most 4099 bytes.*4104 bytes"),
    (False, r"bad sparse plane: its bitmap sets more bits than the plane has bytes.*at most "
            r"4099 bits.*4104"),
])
def test_a_bitmap_of_more_bits_than_its_plane_has_bytes_is_refused(monkeypatch, one_shot,
                                                                   message):
    """Every bit set, past the plane's end too, and a value for each: more values than the
    plane's place holds. Refused before they are decoded (one-shot: by the values frame's
    declared size; streamed: by the bitmap's count), so none is written past that place."""
    base, target = _pair(np.float32, n=4099)
    monkeypatch.setattr(residual, "ONE_SHOT", one_shot)
    blob = _sparse_blob(base, target)
    planes = _planes(base, target)
    n = len(target) // 4
    parts = [planes[:n], planes[n:2 * n], b"\xff" * 513, b"\x01" * 513 * 8, planes[3 * n:]]
    payload = b"".join(zstd.ZstdCompressor().compress(bytes(p)) for p in parts)
    head = bytearray(blob[:HEADER.size])
    struct.pack_into("<Q", head, HEADER.size - 8, len(payload))
    with pytest.raises(FormatError, match=message):
        decode_residual(base, bytes(head) + payload)


def test_a_version_1_residual_of_one_frame_still_decodes():
    base, target = _pair(np.float32, n=30_001)
    planes = _planes(base, target)
    payload = zstd.ZstdCompressor(level=3).compress(planes.tobytes())
    head = HEADER.pack(b"SNRS", 1, 4, 0, len(target), len(base),
                       hashlib.sha256(base).digest(), hashlib.sha256(target).digest(),
                       len(payload))
    assert decode_residual(base, head + payload) == target
    with pytest.raises(FormatError, match=r"unsupported residual version.*got version 3"):
        decode_residual(base, head[:4] + b"\x03" + head[5:] + payload)


@pytest.mark.parametrize("base_len,target_len", [(40_000, 40_000), (40_003, 40_000),
                                                 (25_001, 40_002), (0, 40_001), (40_000, 3)])
def test_planes_stream_in_chunks_as_the_layout_says(monkeypatch, base_len, target_len):
    """Written a chunk at a time (small chunks here), a residual still holds the documented
    layout (numpy's transpose of target XOR zero-padded base), decodes to its target, and is
    the same bytes every time."""
    monkeypatch.setattr(residual, "CHUNK_ITEMS", 1000)
    rng = np.random.default_rng(base_len + target_len)
    base = rng.integers(0, 256, base_len, dtype=np.uint8).tobytes()
    target = rng.integers(0, 256, target_len, dtype=np.uint8).tobytes()
    x = np.frombuffer(target, np.uint8).copy()
    n = min(len(base), len(x))
    x[:n] ^= np.frombuffer(base, np.uint8, count=n)
    m = len(x) // 4 * 4
    expected = np.concatenate([x[:m].reshape(-1, 4).T.ravel(), x[m:]])
    blob = encode_residual(base, target, itemsize=4)
    assert residual.residual_planes(blob)[1].tobytes() == expected.tobytes()
    assert decode_residual(base, blob) == target
    assert encode_residual(base, target, itemsize=4) == blob


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address``."""
    mapping = None
    with open("/proc/self/smaps", encoding="ascii") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                mapping = lo <= address < hi
            elif head == "VmFlags:" and mapping:
                return line.split()[1:]
    raise AssertionError("no such mapping")


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage"),
                    reason="a kernel without transparent huge pages refuses the advice")
def test_a_rebuilt_shard_s_pages_are_asked_in_huge_folios(tmp_path):
    import ctypes
    import mmap

    from snapops.formats._alloc import ask_huge_pages

    with open(tmp_path / "shard", "xb+") as f:
        f.truncate(4 << 20)
        pages = mmap.mmap(f.fileno(), 4 << 20)
        address = ctypes.addressof(ctypes.c_char.from_buffer(pages))
        assert "hg" not in _vm_flags(address)
        assert ask_huge_pages(pages)
        assert "hg" in _vm_flags(address)           # MADV_HUGEPAGE in effect
        pages.close()


def test_a_writer_is_stopped_by_its_first_write_past_max_size(tmp_path):
    """A residual that will not be kept is not computed to its end."""
    store = ObjectStore(tmp_path / "cache")
    done = []

    def write(f):
        for _ in range(100):
            done.append(f.write(bytes(1000)))

    assert store.put_written(write, max_size=5_500) is None
    assert done == [1000] * 5                   # the sixth write ended at 6,000 bytes
    assert list(store.root.iterdir()) == []
    assert store.put_written(write, max_size=None) is not None and len(done) == 105


@pytest.mark.parametrize("durable", [None, False])
def test_a_residual_too_large_for_the_store_is_not_added(tmp_path, durable):
    """Durable or not (the daemon's residuals are not fsync'd), an object is whole under its
    digest or absent, and nothing else is left in the store."""
    store = ObjectStore(tmp_path / "cache")
    rng = np.random.default_rng(3)
    base, target = (rng.integers(0, 256, 10_000, dtype=np.uint8).tobytes() for _ in range(2))
    write = lambda f: residual.write_residual(base, target, f, itemsize=4)  # noqa: E731
    assert store.put_written(write, max_size=5_000, durable=durable) is None   # no gain
    assert [p.name for p in store.root.iterdir()] == []
    sha, size = store.put_written(write, durable=durable)
    assert store.path(sha).read_bytes() == encode_residual(base, target, itemsize=4)
    assert hashlib.sha256(store.path(sha).read_bytes()).hexdigest() == sha
    assert [p.name for p in store.root.iterdir()] == [sha] and size > 10_000
