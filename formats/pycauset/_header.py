"""The 4096-byte header: preamble, slots A and B, and the active-slot rule.

Pure functions of a buffer (the mmap or any bytes) and the file size. A slot is *valid* when its
CRC32 matches, its offsets are aligned (payload 4096, metadata 16), both regions lie after the
header and inside the file. The active slot is the valid one with the higher generation; on a
tie slot A wins (docs/formats/pycauset.md; ``pycauset.load`` 0.6.1 agrees). Checks the spec lists
as "must be 0" (reserved bytes, the v1 hot region) are applied to the chosen slot only, so
snapops picks the same slot as the peer and then fails deterministically instead of silently
falling back to older metadata.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from ..errors import FormatError, LimitError, TruncatedError, UnsupportedVersionError
from . import _spec as S


@dataclass(frozen=True)
class Slot:
    """One header slot as stored; ``crc_ok`` compares the stored CRC32 with the computed one."""

    name: str
    generation: int
    payload_offset: int
    payload_length: int
    metadata_offset: int
    metadata_length: int
    hot_offset: int = 0
    hot_length: int = 0
    crc32: int | None = None            # None: computed by pack()
    crc_ok: bool = True
    reserved: bytes = bytes(68)

    @property
    def offset(self) -> int:
        return S.SLOT_OFFSETS[self.name]

    def fields(self) -> tuple[int, ...]:
        return (self.generation, self.payload_offset, self.payload_length, self.metadata_offset,
                self.metadata_length, self.hot_offset, self.hot_length)

    def stored_crc(self) -> int:
        if self.crc32 is not None:
            return self.crc32
        return zlib.crc32(S.SLOT_FIELDS.pack(*self.fields()))

    def pack(self) -> bytes:
        """The 128 slot bytes with a fresh CRC32 and zero reserved bytes."""
        head = S.SLOT_FIELDS.pack(*self.fields())
        return S.SLOT.pack(*self.fields(), zlib.crc32(head), bytes(68))

    def problems(self, file_size: int) -> list[str]:
        """Why this slot is not valid for a file of ``file_size`` bytes (empty: valid)."""
        out = []
        if not self.crc_ok:
            out.append("slot_crc32 does not match")
        if self.payload_offset % S.PAYLOAD_ALIGN:
            out.append(f"payload_offset {self.payload_offset} is not 4096-aligned")
        if self.metadata_offset % S.METADATA_ALIGN:
            out.append(f"metadata_offset {self.metadata_offset} is not 16-aligned")
        if self.payload_offset < S.HEADER_BYTES or self.metadata_offset < S.HEADER_BYTES:
            out.append("payload or metadata inside the 4096-byte header")
        if self.payload_offset + self.payload_length > file_size:
            out.append(f"payload ends at {self.payload_offset + self.payload_length}, "
                       f"past the end of the file ({file_size})")
        if self.metadata_offset + self.metadata_length > file_size:
            out.append(f"metadata ends at {self.metadata_offset + self.metadata_length}, "
                       f"past the end of the file ({file_size})")
        return out

    def to_dict(self, file_size: int) -> dict:
        problems = self.problems(file_size)
        return {"name": self.name, "generation": self.generation,
                "payload_offset": self.payload_offset, "payload_length": self.payload_length,
                "metadata_offset": self.metadata_offset,
                "metadata_length": self.metadata_length, "hot_offset": self.hot_offset,
                "hot_length": self.hot_length, "crc32": f"{self.stored_crc():08x}",
                "crc_ok": self.crc_ok, "valid": not problems, "problems": problems}


def pack_preamble() -> bytes:
    return S.PREAMBLE.pack(S.MAGIC, S.FORMAT_VERSION, S.ENDIAN_LITTLE, S.HEADER_BYTES, 0)


def pack_header(slot_a: Slot, slot_b: Slot) -> bytes:
    """The whole 4096-byte header."""
    head = pack_preamble() + slot_a.pack() + slot_b.pack()
    return head + bytes(S.HEADER_BYTES - len(head))


def check_preamble(buf) -> None:
    """Magic, version, endian marker, header size and the reserved byte of ``buf[:16]``."""
    size = len(buf)
    if size < len(S.MAGIC) or bytes(buf[:8]) != S.MAGIC:
        raise FormatError("not a PyCauset container", offset=0, expected="magic b'PYCAUSET'",
                          got=bytes(buf[:8]), check="preamble")
    if size < S.HEADER_BYTES:
        raise TruncatedError("file shorter than the 4096-byte header", offset=0,
                             expected=f">= {S.HEADER_BYTES} bytes", got=f"{size} bytes")
    _, version, endian, header_bytes, reserved = S.PREAMBLE.unpack_from(buf, 0)
    if version != S.FORMAT_VERSION:
        raise UnsupportedVersionError("unsupported format_version", offset=8, expected="1",
                                      got=version)
    if endian != S.ENDIAN_LITTLE:
        raise UnsupportedVersionError("unsupported endian marker", offset=12,
                                      expected="1 (little-endian)", got=endian)
    if header_bytes != S.HEADER_BYTES:
        raise UnsupportedVersionError("unsupported header_bytes", offset=13, expected="4096",
                                      got=header_bytes)
    if reserved:
        raise FormatError("preamble reserved0 is not zero", offset=15, expected="0",
                          got=reserved, check="preamble")


def read_slot(buf, name: str) -> Slot:
    at = S.SLOT_OFFSETS[name]
    *fields, crc, reserved = S.SLOT.unpack_from(buf, at)
    actual = zlib.crc32(memoryview(buf)[at:at + S.SLOT_FIELDS.size])
    return Slot(name, *fields, crc32=crc, crc_ok=crc == actual, reserved=reserved)


def read_slots(buf) -> tuple[Slot, Slot]:
    return read_slot(buf, "A"), read_slot(buf, "B")


def choose_active(slots: tuple[Slot, Slot], file_size: int) -> Slot:
    """The valid slot with the highest generation (A on a tie), checked strictly."""
    valid = [s for s in slots if not s.problems(file_size)]
    if not valid:
        reasons = "; ".join(f"{s.name}: {', '.join(s.problems(file_size))}" for s in slots)
        raise FormatError("no valid header slot", offset=S.SLOT_OFFSETS["A"],
                          expected="a slot with a good CRC and in-range, aligned offsets",
                          got=reasons, check="slots")
    active = valid[0] if len(valid) == 1 or valid[0].generation >= valid[1].generation \
        else valid[1]
    check_active(active)
    return active


def check_active(slot: Slot) -> None:
    """What v1 requires of the slot in use beyond validity."""
    at = slot.offset
    if any(slot.reserved):
        raise FormatError(f"slot {slot.name}: slot_reserved is not zero", offset=at + 60,
                          expected="68 zero bytes", got=slot.reserved.hex(), check="slots")
    if slot.hot_offset or slot.hot_length:
        raise UnsupportedVersionError(f"slot {slot.name}: hot region in a v1 file", offset=at + 40,
                                      expected="hot_offset = hot_length = 0",
                                      got=(slot.hot_offset, slot.hot_length))
    payload_end = slot.payload_offset + slot.payload_length
    if slot.metadata_offset < payload_end:
        raise FormatError(f"slot {slot.name}: metadata block overlaps the payload",
                          offset=at + 24, expected=f"metadata_offset >= {payload_end}",
                          got=slot.metadata_offset, check="slots")
    if not S.BLOCK_HEADER_SIZE <= slot.metadata_length <= \
            S.BLOCK_HEADER_SIZE + S.MAX_METADATA_PAYLOAD:
        cls = LimitError if slot.metadata_length > S.BLOCK_HEADER_SIZE else FormatError
        raise cls(f"slot {slot.name}: metadata_length out of bounds", offset=at + 32,
                  expected=f"32..{S.BLOCK_HEADER_SIZE + S.MAX_METADATA_PAYLOAD}",
                  got=slot.metadata_length, check="limit" if cls is LimitError else "slots")
