"""Writing: follow the plan from ``_layout``, streaming the payload into an atomic file.

The CRC-32Cs are computed first (from the arrays' memory), so every byte is written once, in
file order, and the file's SHA-256 is computed on the way: the header (slot A generation 1 and
slot B generation 0, both pointing at the same payload and block, as the peer writes a fresh
file), the payload (straight from the arrays' memory), then the PCMB block at the next 16-byte
boundary. The file appears under its name only when complete (temp file, fsync, rename).
"""

from __future__ import annotations

import os
from typing import Any

from ..atomic import atomic_write_digest
from ..errors import DataError
from ..integrity import crc32c
from ..model import Snapshot
from . import _spec as S
from ._block import pack_block
from ._codec import encode_metadata
from ._header import Slot, pack_header
from ._layout import plan_layout

PIECE = 64 << 20            # bytes per write call


def save(snapshot: Snapshot, path: str | os.PathLike, *, layout: str = "auto",
         payload_uuid: Any = None, checksum: bool = True) -> dict:
    """Write ``snapshot`` as a PyCauset v1 container; returns a short summary with the file's
    SHA-256."""
    plan = plan_layout(snapshot, layout)
    encode_metadata(plan.metadata(None, "0" * 32))     # refuse bad meta before any I/O
    payload_offset = S.HEADER_BYTES
    crcs = [_crc(buf) for buf in plan.buffers] if checksum else None
    metadata = encode_metadata(plan.metadata(crcs, payload_uuid))
    if len(metadata) > S.MAX_METADATA_PAYLOAD:
        raise DataError(f"metadata encodes to {len(metadata)} bytes; the limit is "
                        f"{S.MAX_METADATA_PAYLOAD}")
    metadata_offset = S.align(payload_offset + plan.payload_length, S.METADATA_ALIGN)
    pointers = (payload_offset, plan.payload_length, metadata_offset,
                S.BLOCK_HEADER_SIZE + len(metadata))
    with atomic_write_digest(path, stable=True) as f:     # views of the arrays, fresh bytes
        f.write(pack_header(Slot("A", 1, *pointers), Slot("B", 0, *pointers)))
        for entry, buf in zip(plan.entries, plan.buffers):
            _pad_to(f, payload_offset + entry.offset)
            _write_piecewise(f, buf)
        _pad_to(f, metadata_offset)
        f.write(pack_block(metadata))
    return {"layout": plan.kind, "arrays": len(plan.entries), "file_size": f.size,
            "payload_offset": payload_offset, "payload_length": plan.payload_length,
            "metadata_offset": metadata_offset, "sha256": f.hexdigest()}


def _crc(buf: memoryview) -> int:
    crc = 0
    for start in range(0, len(buf), PIECE):
        crc = crc32c(buf[start:start + PIECE], crc)
    return crc


def _write_piecewise(f, buf: memoryview) -> None:
    for start in range(0, len(buf), PIECE):
        f.write(buf[start:start + PIECE])


def _pad_to(f, offset: int) -> None:
    gap = offset - f.tell()
    if gap < 0:
        raise AssertionError(f"layout overrun: at {f.tell()}, next extent at {offset}")
    if gap:
        f.write(bytes(gap))
