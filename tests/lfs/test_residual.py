"""Residuals round-trip exactly and refuse the wrong base, corruption and bombs."""

from __future__ import annotations

import hashlib
import struct

import ml_dtypes
import numpy as np
import pytest
import zstandard as zstd
from snapops.formats._kernels import unshuffle_xor
from snapops.formats.errors import FormatError, LimitError
from snapops.formats.generation import residual
from snapops.formats.generation.residual import (
    HEADER,
    ResidualHeader,
    apply_planes,
    decode_residual,
    decompress_planes,
    encode_residual,
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
    assert apply_planes(np.zeros(10, np.uint8), head, planes).tolist() == data.tolist()



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
    assert np.array_equal(apply_planes(base, head, planes), expected)

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
    base, target = _pair(np.float32, n=1000)
    blob = encode_residual(base, target, itemsize=4)
    head = read_header(blob)
    out = np.full(head.target_length + 10, 7, np.uint8)
    f = tmp_path / "r"
    f.write_bytes(blob)
    with open(f, "rb") as stream:
        stream.seek(HEADER.size)
        planes = decompress_planes(stream, head, out)
    assert planes.base is out or planes.base is out.base
    assert planes.tobytes() == _planes(base, target).tobytes()
    assert out[head.target_length:].tolist() == [7] * 10          # nothing past the planes
    payload = zstd.ZstdCompressor(write_content_size=False).compress(b"\0" * 100)
    with pytest.raises(FormatError, match="frame at byte 0 declares no content size"):
        decompress_planes(payload, ResidualHeader(4, 100, 0, "", "", 0), np.empty(100, np.uint8))


def test_a_plane_per_frame_its_literals_coded_only_where_that_pays():
    """float32 steps of 1e-3: the two low planes are nearly random (literals stored raw: each
    frame about its plane's size), the carry and top planes mostly zeros (coded: far
    smaller); the frames' contents are the planes in order."""
    from snapops.formats.zstdframe import frame_sizes

    base, target = _pair(np.float32, n=200_000)
    blob = encode_residual(base, target, itemsize=4)
    frames = frame_sizes(memoryview(blob)[HEADER.size:])
    assert [declared for _, declared in frames] == [200_000] * 4
    sizes = [size for size, _ in frames]
    assert sizes[0] > 200_000 and sizes[1] > 0.99 * 200_000       # raw (and a few headers)
    assert sizes[2] < 0.6 * 200_000 and sizes[3] < 0.1 * 200_000
    assert blob[4] == 2


@pytest.mark.parametrize("frames,message", [
    (9, "more than 8 frames"), (3, "does not hold its declared length"),
])
def test_a_payload_of_too_many_or_too_few_frames_is_refused(frames, message):
    """Eight frames at most (a plane each), their declared sizes adding up to the target."""
    base, target = _pair(np.float32, n=1000)
    planes = _planes(base, target).tobytes()
    cut = len(planes) // 8 if frames > 4 else len(planes) // 4
    parts = [planes[k * cut:(k + 1) * cut] for k in range(frames - 1)]
    parts.append(planes[(frames - 1) * cut:] if frames > 4 else b"")
    payload = b"".join(zstd.ZstdCompressor().compress(p) for p in parts)
    head = HEADER.pack(b"SNRS", 2, 4, 0, len(target), len(base),
                       hashlib.sha256(base).digest(), hashlib.sha256(target).digest(),
                       len(payload))
    with pytest.raises(FormatError, match=rf"\[residual\].*{message}"):
        decode_residual(base, head + payload)


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
