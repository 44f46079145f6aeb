"""AERO v0.1 constants: struct layouts, flags, FourCCs, the dtype enum and the limits table.

Everything a reader or writer needs to agree on lives here, and nothing else does. The values
follow the format reference, docs/formats/aero.md (AERO v0.1 as its reference implementation,
bhuvanprakash/Aero at f1d395d, writes it, with snapops' decisions).
"""

from __future__ import annotations

import struct
from enum import IntFlag

import ml_dtypes
import numpy as np

MAGIC = b"AERO"
VERSION = (0, 1)

HEADER = struct.Struct("<4sHHIQQQQQ16s28s")   # magic, major, minor, header_size, toc_off, toc_len,
#                                              st_off, st_len, file_flags, uuid, reserved
TOC_HEADER = struct.Struct("<IIQ")             # entry_count, reserved0, reserved1
TOC_ENTRY = struct.Struct("<4sIQQQIIQ32s")     # fourcc, flags, offset, length, ulen,
#                                              name_off, name_len, reserved0, blake3_256
HEADER_SIZE = HEADER.size                      # 96
TOC_HEADER_SIZE = TOC_HEADER.size              # 16
TOC_ENTRY_SIZE = TOC_ENTRY.size                # 80
HASH_FIELD = slice(TOC_ENTRY_SIZE - 32, TOC_ENTRY_SIZE)   # the blake3 field inside an entry
CHUNK_ALIGN = 16
STRING_TABLE_ALIGN = 8
# snapops places each tensor at a 64-byte aligned offset inside its shard (cache-line aligned
# views); the spec leaves data_off free, and the reference packs tensors back to back.
TENSOR_ALIGN = 64


class ChunkFlags(IntFlag):
    COMPRESSED_ZSTD = 0x0001
    MMAP_CRITICAL = 0x0002
    INDEX = 0x0004
    OPTIONAL = 0x0008


KNOWN_FLAGS = 0x000F

IHSH, MJSN, MMSG, PHSH, TIDX, WTSH = b"IHSH", b"MJSN", b"MMSG", b"PHSH", b"TIDX", b"WTSH"
NEVER_COMPRESSED = frozenset({IHSH, PHSH, WTSH})
METADATA = frozenset({MJSN, MMSG, TIDX, IHSH, PHSH})

NAME_IHSH = "control.integrity"
NAME_MJSN = "meta.json"
NAME_MMSG = "manifest"
NAME_TIDX = "tensors"
IHSH_PAYLOAD_SIZE = 256
PHSH_PAGE_SIZE_DEFAULT = 4 << 20
DEFAULT_SHARD_MAX = 2 << 30        # as the reference writer
DEFAULT_ZSTD_LEVEL = 6             # as the reference writer


def shard_name(shard_id: int) -> str:
    return f"weights.shard{shard_id}"


def phsh_name(shard_id: int) -> str:
    return f"weights.shard{shard_id}.phsh"


# ---- limits (spec "Limits" table, enforced on read and write) --------------------------------
MAX_ENTRY_COUNT = 1_000_000
MAX_STRING_TABLE = 512 * 1024 * 1024
MAX_METADATA_ULEN = 2 * 1024 * 1024 * 1024
# snapops' own bounds where the spec has none (a numpy array has at most 64 dimensions).
MAX_NDIM = 64

# ---- dtype enum (u16) --------------------------------------------------------------------------
DTYPE_PACKED = 0x8000
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES: dict[int, tuple[str, np.dtype]] = {
    0: ("f16", np.dtype("<f2")),
    1: ("f32", np.dtype("<f4")),
    2: ("bf16", BF16),
    3: ("f64", np.dtype("<f8")),
    4: ("i8", np.dtype("i1")),
    5: ("u8", np.dtype("u1")),
    6: ("i16", np.dtype("<i2")),
    7: ("u16", np.dtype("<u2")),
    8: ("i32", np.dtype("<i4")),
    9: ("u32", np.dtype("<u4")),
    10: ("i64", np.dtype("<i8")),
    11: ("u64", np.dtype("<u8")),
    12: ("bool", np.dtype("?")),
}
DTYPE_NAMES = {code: name for code, (name, _) in DTYPES.items()} | {DTYPE_PACKED: "packed"}


def dtype_code(dtype: np.dtype) -> int | None:
    """The enum value of a numpy dtype (any byte order), or None when AERO has none."""
    if dtype == BF16:
        return 2
    if dtype.kind == "V" or dtype.fields is not None or dtype.subdtype is not None:
        return None
    plain = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    for code, (_, candidate) in DTYPES.items():
        if code != 2 and plain == candidate:
            return code
    return None


# snapops keeps a packed (0x8000) tensor as its raw bytes (uint8, 1-D) and remembers its logical
# shape and codec fields in Snapshot.meta under this key, as one JSON object per tensor name.
PACKED_META_KEY = "aero.packed"
