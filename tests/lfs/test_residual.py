"""Residuals round-trip exactly and refuse the wrong base, corruption and bombs."""

from __future__ import annotations

import hashlib
import struct

import ml_dtypes
import numpy as np
import pytest
import zstandard as zstd
from snapops.formats.errors import FormatError, LimitError
from snapops.formats.generation.residual import (
    HEADER,
    ResidualHeader,
    apply_planes,
    decode_residual,
    encode_residual,
    read_header,
    xor_planes,
)
from snapops.formats.limits import DeclaredLimits


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
    planes = xor_planes(bytes(10), data.tobytes(), 4)      # XOR a zero base: the data
    assert planes.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 9]
    head = ResidualHeader(4, len(data), len(data), "", "", 0)
    assert apply_planes(np.zeros(10, np.uint8), head, planes).tolist() == data.tolist()


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
