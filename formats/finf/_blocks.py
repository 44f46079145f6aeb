"""Blocks: the 46-byte header (magic, header_size, allocated, used, checksum, encoding), the walk
from the first block to the end of the file, checksums and decoding.

Everything here is a pure function of a buffer (the mmap, or bytes). Every length is checked
against the buffer before it is used, so an absurd size costs nothing; a zstd block is only
decoded when its claimed output is one zstd could produce from the stored bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator

import zstandard

from ..errors import ChecksumError, FormatError, LimitError, TruncatedError, UnsupportedVersionError
from ..limits import zstd_decompressor
from . import _spec as S


@dataclass(frozen=True)
class Block:
    """One block's header, and where its data lies in the buffer."""

    index: int
    offset: int          # of the magic
    header_size: int
    allocated: int
    used: int
    checksum: int
    encoding: str

    @property
    def data_offset(self) -> int:
        return self.offset + S.BLOCK_PREFIX.size + self.header_size

    @property
    def end(self) -> int:
        return self.data_offset + self.allocated

    def to_dict(self) -> dict:
        return {"index": self.index, "offset": self.offset, "header_size": self.header_size,
                "data_offset": self.data_offset, "allocated": self.allocated, "used": self.used,
                "checksum": f"{self.checksum:016x}" if self.checksum else None,
                "encoding": self.encoding or "raw"}


def pack_header(allocated: int, used: int, checksum: int, encoding: str) -> bytes:
    """The 46 header bytes snapops writes (header_size 40)."""
    return (S.BLOCK_PREFIX.pack(S.BLOCK_MAGIC, S.HEADER_SIZE)
            + S.BLOCK_FIELDS.pack(allocated, used, checksum, encoding.encode("ascii")))


def md5_checksum(data) -> int:
    """First 8 bytes of the MD5 of ``data`` as a big-endian u64 (docs/formats/finf.md).

    0 means "unchecked" in the file, so the one-in-2**64 digest that starts with eight zero
    bytes is stored as 0 too and simply goes unchecked.
    """
    return int.from_bytes(hashlib.md5(data).digest()[:8], "big")


def _encoding(raw: bytes, at: int, index: int) -> str:
    text = raw.rstrip(b"\0")
    if b"\0" in text or any(b < 0x20 or b > 0x7E for b in text):
        raise FormatError("block encoding is not NUL-padded ASCII", offset=at, chunk=index,
                          expected="e.g. b'zstd' + NULs", got=raw)
    name = text.decode("ascii")
    if name not in S.ENCODINGS:
        raise UnsupportedVersionError("unknown block encoding", offset=at, chunk=index,
                                      expected="raw (empty) or zstd", got=name)
    return name


def parse_block(buf, offset: int, index: int) -> Block:
    """The block whose magic is at ``offset``; its data must lie inside ``buf``."""
    size = len(buf)
    if offset + S.BLOCK_PREFIX.size > size:
        raise TruncatedError("block header cut short", offset=offset, chunk=index,
                             expected=f"{S.BLOCK_PREFIX.size} bytes", got=f"{size - offset}")
    magic, header_size = S.BLOCK_PREFIX.unpack_from(buf, offset)
    if magic != S.BLOCK_MAGIC:
        raise FormatError("bad block magic", offset=offset, chunk=index,
                          expected="89 42 4c 4b", got=magic)
    if header_size < S.HEADER_SIZE:
        raise FormatError("block header_size too small", offset=offset + 4, chunk=index,
                          expected=f">= {S.HEADER_SIZE}", got=header_size)
    fields_at = offset + S.BLOCK_PREFIX.size
    if fields_at + header_size > size:
        raise TruncatedError("block header cut short", offset=offset, chunk=index,
                             expected=f"{header_size} header bytes", got=f"{size - fields_at}")
    allocated, used, checksum, encoding = S.BLOCK_FIELDS.unpack_from(buf, fields_at)
    if used > allocated:
        raise FormatError("block used_size exceeds allocated_size", offset=fields_at + 8,
                          chunk=index, expected=f"<= {allocated}", got=used)
    data_at = fields_at + header_size
    if allocated > size - data_at:
        raise TruncatedError("block runs past the end of the file", offset=fields_at,
                             chunk=index, expected=f"allocated_size <= {size - data_at}",
                             got=allocated)
    return Block(index, offset, header_size, allocated, used, checksum,
                 _encoding(encoding, fields_at + 24, index))


def iter_blocks(buf, first: int | None, limits: S.Limits = S.DEFAULT_LIMITS) -> Iterator[Block]:
    """Blocks from ``first`` on, each right after the previous one's allocated space, up to the
    end of the buffer. Bytes after the last block that are not a block are an error."""
    if first is None:
        return
    offset, index, size = first, 0, len(buf)
    while offset < size:
        if index >= limits.max_blocks:
            raise LimitError("too many blocks", offset=offset, expected=f"<= {limits.max_blocks}",
                             got=f"more than {index}")
        block = parse_block(buf, offset, index)
        yield block
        offset, index = block.end, index + 1


def stored(buf, block: Block) -> memoryview:
    """The block's used bytes as stored (a view, no copy)."""
    with memoryview(buf) as whole:
        return whole[block.data_offset:block.data_offset + block.used]


def check_checksum(buf, block: Block) -> bool:
    """True when the block carries a checksum and it matches; False when it carries none."""
    if not block.checksum:
        return False
    with stored(buf, block) as data:
        got = md5_checksum(data)
    if got != block.checksum:
        raise ChecksumError("block checksum mismatch", offset=block.offset, chunk=block.index,
                            expected=f"{block.checksum:016x}", got=f"{got:016x}")
    return True


def zstd_bound(stored_len: int) -> int:
    """The most output zstd can produce from ``stored_len`` bytes (RLE blocks: 4 B -> 128 KiB)."""
    return stored_len * S.ZSTD_MAX_RATIO + S.ZSTD_FRAME_SLACK


def decode(buf, block: Block, need: int) -> memoryview | bytes:
    """The block's content: a view for raw blocks, decompressed bytes for zstd blocks.

    ``need`` is how many content bytes the tree's arrays read from it; fewer is an error.
    """
    data = stored(buf, block)
    if block.encoding == S.ENCODING_RAW:
        out: memoryview | bytes = data
    else:
        out = _decompress(data, block, need)
    if len(out) < need:
        raise FormatError("block holds fewer bytes than its arrays need", offset=block.offset,
                          chunk=block.index, expected=f">= {need} bytes", got=len(out),
                          check="extents")
    return out


def _decompress(data: memoryview, block: Block, need: int) -> bytes:
    bound = zstd_bound(len(data))
    where = dict(offset=block.data_offset, chunk=block.index)
    if need > bound:
        raise FormatError("zstd block cannot hold what its arrays claim", **where,
                          expected=f"<= {bound} bytes from {len(data)} stored", got=need,
                          check="zstd")
    try:
        declared = zstandard.frame_content_size(data)
        if declared > bound:
            raise FormatError("zstd frame claims more output than it can hold", **where,
                              expected=f"<= {bound}", got=declared, check="zstd")
        if 0 <= declared < need:
            raise FormatError("zstd frame smaller than its arrays", **where,
                              expected=f">= {need}", got=declared, check="zstd")
        inflater = zstd_decompressor().decompressobj()
        out = inflater.decompress(data)
    except zstandard.ZstdError as exc:
        raise FormatError(f"zstd: {exc}", **where, expected="a zstd frame",
                          got=bytes(data[:8]), check="zstd") from exc
    except MemoryError as exc:
        raise LimitError("zstd block too large to decode", **where, expected="less output",
                         got="MemoryError") from exc
    if not inflater.eof:
        raise TruncatedError("zstd frame cut short", **where, expected="a complete frame",
                             got=f"{len(out)} bytes so far")
    if inflater.unused_data:
        raise FormatError("bytes after the zstd frame", **where, expected="one frame",
                          got=f"{len(inflater.unused_data)} trailing bytes", check="zstd")
    if declared >= 0 and len(out) != declared:
        raise FormatError("zstd frame size differs from its header", **where,
                          expected=str(declared), got=len(out), check="zstd")
    return out


def encode_zstd(data, level: int) -> bytes:
    return zstandard.ZstdCompressor(level=level).compress(data)
