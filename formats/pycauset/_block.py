"""PCMB metadata blocks: a 32-byte frame (magic, versions, length, CRC32) and the payload.

``metadata_length`` in a slot covers the frame and the payload (32 + payload_length).
"""

from __future__ import annotations

import zlib

from ..errors import ChecksumError, FormatError, UnsupportedVersionError
from . import _spec as S


def pack_block(payload: bytes) -> bytes:
    """The framed block for an encoded metadata ``payload``."""
    header = S.BLOCK_HEADER.pack(S.BLOCK_MAGIC, S.BLOCK_VERSION, S.ENCODING_VERSION, 0,
                                 len(payload), zlib.crc32(payload), 0)
    return header + payload


def block_payload(buf, offset: int, length: int, *, base: int | None = None) -> memoryview:
    """Check the block at ``buf[offset:offset+length]`` and return its payload (a view).

    The caller has already checked that the range lies inside ``buf`` and is bounded.
    ``base`` is the block's file offset when ``buf`` holds only the block (for messages).
    """
    try:
        return _block_payload(buf, offset, length)
    except FormatError as exc:
        if base is not None and exc.offset is not None:
            exc.offset += base - offset
            exc.args = (str(exc),)
        raise


def _block_payload(buf, offset: int, length: int) -> memoryview:
    if length < S.BLOCK_HEADER_SIZE:
        raise FormatError("metadata block shorter than its 32-byte frame", offset=offset,
                          expected=">= 32 bytes", got=length, check="pcmb")
    (magic, version, encoding, reserved0, payload_length, crc,
     reserved1) = S.BLOCK_HEADER.unpack_from(buf, offset)
    if magic != S.BLOCK_MAGIC:
        raise FormatError("metadata block magic mismatch", offset=offset, expected="b'PCMB'",
                          got=magic, check="pcmb")
    if version != S.BLOCK_VERSION:
        raise UnsupportedVersionError("unsupported metadata block_version", offset=offset + 4,
                                      expected="1", got=version)
    if encoding != S.ENCODING_VERSION:
        raise UnsupportedVersionError("unsupported metadata encoding_version", offset=offset + 8,
                                      expected="1", got=encoding)
    if reserved0 or reserved1:
        raise FormatError("metadata block reserved fields are not zero", offset=offset + 12,
                          expected="0, 0", got=(reserved0, reserved1), check="pcmb")
    if payload_length != length - S.BLOCK_HEADER_SIZE:
        raise FormatError("metadata block length disagrees with the slot", offset=offset + 16,
                          expected=f"payload_length {length - S.BLOCK_HEADER_SIZE}",
                          got=payload_length, check="pcmb")
    start = offset + S.BLOCK_HEADER_SIZE
    payload = memoryview(buf)[start:start + payload_length]
    actual = zlib.crc32(payload)
    if actual != crc:
        payload.release()
        raise ChecksumError("metadata payload does not match its CRC32", offset=offset + 24,
                            expected=f"{crc:08x}", got=f"{actual:08x}", check="pcmb_crc32")
    return payload
