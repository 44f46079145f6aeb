"""PyCauset v1 constants: structs, alignments, metadata tags, dtype tables and snapops' limits.

Everything here follows the format reference, docs/formats/pycauset.md (peer: PyPI
``pycauset==0.6.1``), including the limits and the
``snapops.arrays/v1`` payload layout, which are snapops' own (see ``_layout``).
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np

# ---- fixed header (4096 bytes): preamble, slot A, slot B, zeros -------------------------------
MAGIC = b"PYCAUSET"
FORMAT_VERSION = 1
ENDIAN_LITTLE = 1
HEADER_BYTES = 4096
PREAMBLE = struct.Struct("<8sIBHB")                 # magic, version, endian, header_bytes, rsv
SLOT_SIZE = 128
SLOT_OFFSETS = {"A": 16, "B": 16 + SLOT_SIZE}
SLOT_FIELDS = struct.Struct("<7Q")                  # the 56 bytes the slot CRC covers
SLOT = struct.Struct("<7QI68s")
PAYLOAD_ALIGN = 4096
METADATA_ALIGN = 16

# ---- PCMB metadata block -----------------------------------------------------------------------
BLOCK_MAGIC = b"PCMB"
BLOCK_VERSION = 1
ENCODING_VERSION = 1
BLOCK_HEADER = struct.Struct("<4sIIIQII")           # magic, version, encoding, rsv0, len, crc, rsv1
BLOCK_HEADER_SIZE = BLOCK_HEADER.size               # 32

# ---- typed metadata encoding v1 ------------------------------------------------------------------
T_BOOL, T_I64, T_U64, T_F64, T_STR, T_BYTES, T_ARRAY, T_MAP = range(1, 9)

# ---- snapops' bounds (checked before anything is allocated) --------------------------------------
MAX_METADATA_PAYLOAD = 16 << 20     # bytes of encoded metadata in one PCMB block
MAX_DEPTH = 32                      # nesting of arrays/maps in the metadata
MAX_VALUES = 1 << 20                # values decoded from one metadata block
MAX_ARRAYS = 1 << 16                # arrays in one snapops.arrays/v1 layout
MAX_NDIM = 64                       # numpy's own limit
MAX_DIM = 1 << 48                   # one dimension (numpy needs the element count in an intp)
MAX_NAME_BYTES = 4096               # UTF-8 bytes of one array name

# ---- identity metadata ---------------------------------------------------------------------------
RAW_DENSE = "raw_dense"
ARRAYS_KIND = "snapops.arrays/v1"
ARRAYS_ALIGN = 64                   # each array starts 64-byte aligned inside the payload
ARRAYS_MATRIX_TYPE = "SNAPOPS_ARRAYS"
ARRAYS_DATA_TYPE = "MIXED"
DEFAULT_NAME = "matrix"             # the array name of a peer file (the peer stores none)
# Keys update_metadata refuses to change: they decide how the payload bytes are read.
IDENTITY_KEYS = frozenset({"rows", "cols", "matrix_type", "data_type", "payload_layout",
                           "payload_uuid", "view"})

# Peer data_type <-> numpy dtype for raw_dense payloads (row-major, little-endian).
PEER_DTYPES: dict[str, np.dtype] = {
    "FLOAT16": np.dtype("<f2"), "FLOAT32": np.dtype("<f4"), "FLOAT64": np.dtype("<f8"),
    "COMPLEX_FLOAT32": np.dtype("<c8"), "COMPLEX_FLOAT64": np.dtype("<c16"),
    "INT8": np.dtype("i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
}
PEER_DATA_TYPE = {dtype: name for name, dtype in PEER_DTYPES.items()}
PEER_MATRIX_TYPES = ("DENSE_FLOAT", "INTEGER")      # 2-D raw_dense; "VECTOR" is 1-D

# dtype names of the snapops.arrays/v1 layout.
ARRAY_DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype("?"), "int8": np.dtype("i1"), "uint8": np.dtype("u1"),
    "int16": np.dtype("<i2"), "uint16": np.dtype("<u2"), "int32": np.dtype("<i4"),
    "uint32": np.dtype("<u4"), "int64": np.dtype("<i8"), "uint64": np.dtype("<u8"),
    "float16": np.dtype("<f2"), "float32": np.dtype("<f4"), "float64": np.dtype("<f8"),
    "complex64": np.dtype("<c8"), "complex128": np.dtype("<c16"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
ARRAY_DTYPE_NAME = {dtype: name for name, dtype in ARRAY_DTYPES.items()}


def dtype_name(dtype: np.dtype) -> str | None:
    """The snapops.arrays/v1 name of ``dtype`` (any byte order), or None."""
    return ARRAY_DTYPE_NAME.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)


def peer_data_type(dtype: np.dtype) -> str | None:
    """The peer's ``data_type`` for ``dtype`` (any byte order), or None."""
    return PEER_DATA_TYPE.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)


def align(value: int, to: int) -> int:
    return (value + to - 1) // to * to
