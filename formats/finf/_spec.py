"""FINF 0.1.0 constants: header line, tag prefix, block header, dtypes, and snapops' limits.

Where FINF 0.1.0 leaves them open, snapops decides (docs/formats/finf.md): ``header_size`` is 40 (three u64
and a 16-byte encoding field), the checksum is the first 8 bytes of the MD5 of the used bytes
as a big-endian u64 (0 = unchecked) and the encoding is NUL-padded ASCII ("" raw, "zstd").
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

VERSION = (0, 1, 0)
VERSION_TEXT = "0.1.0"
HEADER_LINE = b"%FINF 0.1.0\n"
# <FINF_TOKEN> <SPACE> major.minor.micro <NEWLINE>: UNIX or DOS line ending.
HEADER_RE = re.compile(rb"%FINF ([0-9]+)\.([0-9]+)\.([0-9]+)(\r?\n)")
MAX_HEADER_LINE = 64

YAML_DIRECTIVE_RE = re.compile(rb"%YAML 1\.1\r?\n")
# The end of the tree: "..." on its own line (FINF 0.1.0 gives \r?\n...\r?\n; a tree file may
# also end right after the marker).
TREE_END_RE = re.compile(rb"\r?\n\.\.\.(?:\r?\n|\Z)")

TAG_PREFIX = "tag:stsci.edu:finf/0.1.0/"
ROOT_TAGS = frozenset({TAG_PREFIX + "finf", TAG_PREFIX + "core/finf"})
NDARRAY_TAGS = frozenset({TAG_PREFIX + "ndarray", TAG_PREFIX + "core/ndarray"})
ROOT_TAG = TAG_PREFIX + "finf"
NDARRAY_TAG = TAG_PREFIX + "ndarray"

# ---- blocks -----------------------------------------------------------------------------------
BLOCK_MAGIC = b"\x89BLK"
HEADER_SIZE = 40                       # what snapops writes (and the least it reads)
BLOCK_PREFIX = struct.Struct(">4sH")   # magic, header_size
BLOCK_FIELDS = struct.Struct(">QQQ16s")  # allocated, used, checksum, encoding
BLOCK_HEADER_BYTES = BLOCK_PREFIX.size + HEADER_SIZE   # 46
ENCODING_RAW = ""
ENCODING_ZSTD = "zstd"
ENCODINGS = (ENCODING_RAW, ENCODING_ZSTD)
# An RLE block of zstd turns 4 input bytes into at most 128 KiB: a block that claims more
# output than that ratio allows cannot be honest (checked before anything is allocated).
ZSTD_MAX_RATIO = 1 << 15
ZSTD_FRAME_SLACK = 1 << 10

# ---- ndarray ----------------------------------------------------------------------------------
DTYPES = {
    "int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2",
    "int32": "i4", "uint32": "u4", "int64": "i8", "uint64": "u8",
    "float32": "f4", "float64": "f8",
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
BYTEORDERS = {"little": "<", "big": ">"}
MAX_NDIM = 64            # numpy's own bound
# ndarray keys snapops reads; other ASDF-era keys are refused as unsupported variants.
UNSUPPORTED_NDARRAY_KEYS = ("strides", "mask", "data")

DEFAULT_ALIGN = 64           # block data starts at a multiple of this
DEFAULT_RESERVE = 4096       # unused bytes left after the tree for in-place edits


@dataclass(frozen=True)
class Limits:
    """Bounds applied before anything is allocated or expanded (snapops' own, not the spec's).

    ``max_tree_bytes`` bounds the text between the header and the end marker;
    ``max_nodes`` the YAML nodes composed; ``max_expanded`` the nodes the tree would have
    with every alias expanded (billion laughs stop here, before any expansion);
    ``max_aliases`` the alias events; ``max_depth`` the nesting of collections;
    ``max_blocks`` the number of blocks walked.
    """

    max_tree_bytes: int = 32 << 20
    max_nodes: int = 1_000_000
    max_expanded: int = 1_000_000
    max_aliases: int = 10_000
    max_depth: int = 64
    max_blocks: int = 1_000_000


DEFAULT_LIMITS = Limits()
