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

import hashlib
import struct
import threading
from dataclasses import dataclass

import numpy as np
import zstandard as zstd
from snapops.formats.errors import FormatError
from snapops.formats.limits import DEFAULT_LIMITS, DeclaredLimits, check_declared

MAGIC = b"SNRS"
VERSION = 1
# magic, version, itemsize, flags, target length, base length, base sha256, target sha256,
# payload length
HEADER = struct.Struct("<4sBBHQQ32s32sQ")
ITEMSIZES = (1, 2, 4, 8)
LEVEL = 1          # level 3 is 1.5x slower here for the same size (f32 0.542x, bf16 +1%)
THREADS = 2
_local = threading.local()


@dataclass(frozen=True)
class ResidualHeader:
    itemsize: int
    target_length: int
    base_length: int
    base_sha256: str
    target_sha256: str
    payload_length: int


def xor_planes(base: bytes | memoryview, target: bytes | memoryview,
               itemsize: int) -> np.ndarray:
    """The byte planes of ``target`` XOR ``base`` (a shorter base counts as zeros, a longer
    one is cut): all first bytes of each ``itemsize`` item, then all second bytes, ...; a tail
    shorter than one item stays at the end. A contiguous XOR, then one strided copy per plane
    (a transposed ``ravel`` is several times slower, and XOR on two strided inputs slower
    than the two passes).

    >>> xor_planes(bytes(9), bytes(range(9)), 4).tolist()
    [0, 4, 1, 5, 2, 6, 3, 7, 8]
    """
    data = np.frombuffer(target, np.uint8).copy()
    n = min(len(base), len(data))
    data[:n] ^= np.frombuffer(base, np.uint8, count=n)
    whole = len(data) // itemsize * itemsize
    out = np.empty(len(data), np.uint8)
    planes = out[:whole].reshape(itemsize, -1)
    items = data[:whole].reshape(-1, itemsize)
    for k in range(itemsize):
        planes[k] = items[:, k]
    out[whole:] = data[whole:]
    return out


def _compressor() -> zstd.ZstdCompressor:
    """This thread's compressor: reused, so its worker threads are started once."""
    if not hasattr(_local, "compressor"):
        _local.compressor = zstd.ZstdCompressor(level=LEVEL, threads=THREADS,
                                                write_content_size=True)
    return _local.compressor


def encode_residual(base: bytes | memoryview, target: bytes | memoryview, *, itemsize: int,
                    base_sha256: str | None = None, target_sha256: str | None = None) -> bytes:
    """The residual that turns ``base`` into ``target``; ``itemsize`` is the width of the
    numbers in the file (bytes per element of its dominant dtype). A caller that already
    knows the SHA-256 of either (hex) passes it and saves a pass over the bytes."""
    if itemsize not in ITEMSIZES:
        raise ValueError(f"itemsize must be one of {ITEMSIZES}, got {itemsize}")
    planes = xor_planes(base, target, itemsize)
    payload = _compressor().compress(planes)
    head = HEADER.pack(MAGIC, VERSION, itemsize, 0, len(target), len(base),
                       bytes.fromhex(base_sha256 or hashlib.sha256(base).hexdigest()),
                       bytes.fromhex(target_sha256 or hashlib.sha256(target).hexdigest()),
                       len(payload))
    return head + payload


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
    if version != VERSION or flags != 0:
        raise FormatError("unsupported residual version", path=path, offset=4,
                          check="residual", expected=f"version {VERSION}, flags 0",
                          got=f"version {version}, flags {flags}")
    if itemsize not in ITEMSIZES:
        raise FormatError("bad residual item size", path=path, offset=5, check="residual",
                          expected=f"one of {ITEMSIZES}", got=str(itemsize))
    if HEADER.size + p_len != total:
        raise FormatError("residual payload length differs from the header", path=path,
                          offset=HEADER.size - 8, check="residual",
                          expected=f"{HEADER.size + p_len} bytes in all", got=f"{total}")
    return ResidualHeader(itemsize, t_len, b_len, b_sha.hex(), t_sha.hex(), p_len)


def residual_planes(blob: bytes | memoryview, *, path: str = "residual",
                    limits: DeclaredLimits = DEFAULT_LIMITS) -> tuple[ResidualHeader, np.ndarray]:
    """The checked header of a residual and its decompressed byte planes (not yet applied)."""
    head = read_header(blob, path)
    check_declared("residual target", head.target_length, limits, path)
    return head, _decompress(memoryview(blob)[HEADER.size:], head.target_length, path)


def apply_planes(base: np.ndarray, head: ResidualHeader, planes: np.ndarray) -> np.ndarray:
    """The target of a residual from its ``base`` (a writable uint8 array, changed in place
    when it has the target's length) and its planes: the base fitted to the target's length
    (cut, or padded with zeros) XOR the unshuffled planes, one strided XOR per plane."""
    if len(base) != head.target_length:
        fitted = np.zeros(head.target_length, np.uint8)
        n = min(len(base), head.target_length)
        fitted[:n] = base[:n]
        base = fitted
    size = head.itemsize
    whole = len(base) // size * size
    items = base[:whole].reshape(-1, size)
    rows = planes[:whole].reshape(size, -1)
    for k in range(size):
        np.bitwise_xor(items[:, k], rows[k], out=items[:, k])
    base[whole:] ^= planes[whole:]
    return base


def decode_residual(base: bytes | memoryview, blob: bytes | memoryview, *,
                    path: str = "residual", limits: DeclaredLimits = DEFAULT_LIMITS) -> bytes:
    """``target`` from ``base`` and its residual ``blob``; FormatError when ``blob`` is not a
    residual of ``base`` or does not reproduce the target it names."""
    head, planes = residual_planes(blob, path=path, limits=limits)
    if len(base) != head.base_length or hashlib.sha256(base).hexdigest() != head.base_sha256:
        raise FormatError("residual applied to the wrong base", path=path, offset=24,
                          check="residual-base", expected=f"base sha256={head.base_sha256}",
                          got=f"sha256={hashlib.sha256(base).hexdigest()}")
    out = apply_planes(np.frombuffer(base, np.uint8).copy(), head, planes).tobytes()
    got = hashlib.sha256(out).hexdigest()
    if got != head.target_sha256:
        raise FormatError("residual does not reproduce its target", path=path,
                          check="residual-digest", expected=f"sha256={head.target_sha256}",
                          got=f"sha256={got}")
    return out


def _decompress(payload: memoryview, length: int, path: str) -> np.ndarray:
    """Exactly ``length`` bytes from one zstd frame that declares that length (the encoder
    always writes it), so nothing beyond it is ever allocated."""
    try:
        declared = zstd.frame_content_size(payload)
        if declared == length:
            out = zstd.ZstdDecompressor().decompress(payload, max_output_size=length)
    except zstd.ZstdError as exc:
        raise FormatError(f"residual payload is not valid zstd: {exc}", path=path,
                          offset=HEADER.size, check="residual") from None
    if declared > length:
        raise FormatError("residual payload expands beyond its declared length", path=path,
                          offset=HEADER.size, check="residual", expected=f"{length} bytes",
                          got=f"{declared} bytes")
    if declared != length or len(out) != length:
        raise FormatError("residual payload does not hold its declared length", path=path,
                          offset=HEADER.size, check="residual", expected=f"{length} bytes",
                          got="unknown" if declared < 0 else f"{declared} bytes")
    return np.frombuffer(out, np.uint8)
