"""Plan, then sink: every offset, size and padding byte of an AERO file, decided in one place.

Nothing here touches a file or hashes a byte. The writer streams payloads to the offsets a
:class:`FilePlan` gives, then asks :func:`pack_control` for the header + TOC + string table.

File order (TOC order is the same, so offsets grow with the TOC index)::

    header | TOC | string table | IHSH | WTSH0 [PHSH0] | WTSH1 [PHSH1] ... | MJSN | MMSG | TIDX

The metadata chunks go last because TIDX carries the tensor hashes, known only once the weights
have been streamed; everything before them has a size known in advance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import msgpack

from ..errors import DataError, LimitError
from . import _spec as S


def align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor goes: its TIDX entry without the hash."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    data_off: int
    data_len: int
    extra: tuple[tuple[str, object], ...] = ()   # quant_id / quant_params of packed tensors


@dataclass(frozen=True)
class ShardPlan:
    shard_id: int
    size: int
    slots: tuple[int, ...]          # indices into the slot list, in data_off order


def plan_tensors(
    specs: Sequence[tuple[str, int, tuple[int, ...], int, tuple]],
    shard_max: int,
    *,
    first_shard: int = 0,
) -> tuple[list[TensorSlot], list[ShardPlan]]:
    """Assign ``(name, dtype, shape, nbytes, extra)`` specs to shards, in the order given.

    A tensor joins the current shard unless that would take the shard past ``shard_max``; an
    empty shard accepts any tensor (so a tensor bigger than the cap gets a shard of its own).
    Tensors start at 64-byte aligned offsets; empty tensors take no room and need no alignment.

    >>> slots, shards = plan_tensors([("a", 1, (3,), 12, ()), ("b", 1, (2,), 8, ())], 1 << 20)
    >>> [(s.shard_id, s.data_off) for s in slots], shards[0].size
    ([(0, 0), (0, 64)], 72)
    """
    if shard_max < 1:
        raise DataError(f"shard_max must be >= 1, got {shard_max}")
    slots: list[TensorSlot] = []
    shards: list[ShardPlan] = []
    members: list[int] = []
    end = 0
    shard_id = first_shard

    def close() -> None:
        nonlocal members, end, shard_id
        shards.append(ShardPlan(shard_id, end, tuple(members)))
        shard_id, members, end = shard_id + 1, [], 0

    for name, dtype, shape, nbytes, extra in specs:
        start = align(end, S.TENSOR_ALIGN) if nbytes else end
        if members and start + nbytes > shard_max:
            close()
            start = 0
        members.append(len(slots))
        slots.append(TensorSlot(name, dtype, tuple(shape), shard_id, start, nbytes, tuple(extra)))
        end = start + nbytes
    if members:
        close()
    return slots, shards


@dataclass(frozen=True)
class ChunkSpec:
    fourcc: bytes
    name: str
    flags: int
    length: int        # stored bytes
    ulen: int          # uncompressed bytes


@dataclass(frozen=True)
class FilePlan:
    chunks: tuple[ChunkSpec, ...]
    names: tuple[tuple[int, int], ...]   # (name_off, name_len) per chunk
    string_table: bytes
    toc_offset: int
    toc_length: int
    st_offset: int
    payloads_start: int
    offsets: tuple[int, ...]
    file_size: int

    def index(self, fourcc: bytes, name: str) -> int:
        for i, chunk in enumerate(self.chunks):
            if chunk.fourcc == fourcc and chunk.name == name:
                return i
        raise KeyError((fourcc, name))


def plan_file(chunks: Sequence[ChunkSpec]) -> FilePlan:
    """Offsets of the control region and of every payload (each at a 16-byte boundary)."""
    if len(chunks) > S.MAX_ENTRY_COUNT:
        raise LimitError("too many chunks", expected=f"<= {S.MAX_ENTRY_COUNT}", got=len(chunks))
    table = bytearray()
    names = []
    for chunk in chunks:
        raw = chunk.name.encode("utf-8")
        names.append((len(table), len(raw)))
        table += raw + b"\0"
    table += bytes(align(len(table), S.STRING_TABLE_ALIGN) - len(table))
    if len(table) > S.MAX_STRING_TABLE:
        raise LimitError("string table too large", expected=f"<= {S.MAX_STRING_TABLE} bytes",
                         got=len(table))
    toc_offset = S.HEADER_SIZE
    toc_length = S.TOC_HEADER_SIZE + len(chunks) * S.TOC_ENTRY_SIZE
    st_offset = align(toc_offset + toc_length, S.STRING_TABLE_ALIGN)
    payloads_start = align(st_offset + len(table), S.CHUNK_ALIGN)
    offsets = []
    cursor = payloads_start
    for chunk in chunks:
        cursor = align(cursor, S.CHUNK_ALIGN)
        offsets.append(cursor)
        cursor += chunk.length
    return FilePlan(tuple(chunks), tuple(names), bytes(table), toc_offset, toc_length, st_offset,
                    payloads_start, tuple(offsets), cursor)


def pack_control(plan: FilePlan, hashes: Sequence[bytes], uuid: bytes) -> bytearray:
    """Header + TOC + string table + zero padding: the bytes ``[0, payloads_start)``."""
    out = bytearray(plan.payloads_start)
    S.HEADER.pack_into(out, 0, S.MAGIC, *S.VERSION, S.HEADER_SIZE, plan.toc_offset,
                       plan.toc_length, plan.st_offset, len(plan.string_table), 0, uuid, bytes(28))
    S.TOC_HEADER.pack_into(out, plan.toc_offset, len(plan.chunks), 0, 0)
    base = plan.toc_offset + S.TOC_HEADER_SIZE
    for i, chunk in enumerate(plan.chunks):
        name_off, name_len = plan.names[i]
        S.TOC_ENTRY.pack_into(out, base + i * S.TOC_ENTRY_SIZE, chunk.fourcc, chunk.flags,
                              plan.offsets[i], chunk.length, chunk.ulen, name_off, name_len, 0,
                              hashes[i])
    out[plan.st_offset:plan.st_offset + len(plan.string_table)] = plan.string_table
    return out


def zero_toc_hashes(control: bytes | bytearray | memoryview, toc_offset: int,
                    count: int) -> bytearray:
    """The control region as IHSH hashes it: every TOC entry's blake3 field zeroed (AIP-0001)."""
    out = bytearray(control)
    base = toc_offset + S.TOC_HEADER_SIZE
    for i in range(count):
        entry = base + i * S.TOC_ENTRY_SIZE
        out[entry + S.HASH_FIELD.start:entry + S.HASH_FIELD.stop] = bytes(32)
    return out


def ihsh_payload(digest: bytes, payloads_start: int) -> bytes:
    """The IHSH msgpack map, zero-padded to its fixed 256 bytes."""
    packed = msgpack.packb({"algo": "blake3-256", "covered_ranges": [[0, payloads_start]],
                            "digest": digest}, use_bin_type=True)
    return packed.ljust(S.IHSH_PAYLOAD_SIZE, b"\0")


def phsh_payload(shard: str, page_size: int, digests: Sequence[bytes]) -> bytes:
    return msgpack.packb({"shard_name": shard, "page_size": page_size, "digests": list(digests)},
                         use_bin_type=True)


def page_count(size: int, page_size: int) -> int:
    return -(-size // page_size)


def phsh_length(shard: str, page_size: int, size: int) -> int:
    """The exact PHSH payload size, known before any page is hashed (digests are fixed-size)."""
    return len(phsh_payload(shard, page_size, [bytes(32)] * page_count(size, page_size)))
