"""The write plan: one pure function decides every offset and every gap; writers consume it.

A file snapops writes is: the header line, the tree, ``reserve`` or more bytes of unused space
(spaces, room for the tree to grow in place), then the blocks. Every block's data starts at a
multiple of ``align``; the gap before the next block is the unused tail of the previous block's
allocated space (``allocated - used``). The last block has no unused tail. A file without a
tree (one block of an exploded file) has its block right after the header.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DataError
from . import _spec as S


@dataclass(frozen=True)
class BlockSlot:
    offset: int       # of the magic
    used: int
    allocated: int

    @property
    def data_offset(self) -> int:
        return self.offset + S.BLOCK_HEADER_BYTES


@dataclass(frozen=True)
class Plan:
    tree_offset: int
    tree_len: int
    pad: int                        # unused bytes between the tree and the first block
    blocks: tuple[BlockSlot, ...]
    size: int
    sha256: str | None = None       # of the written file, once written


def align_up(value: int, align: int) -> int:
    return -(-value // align) * align


def plan_layout(tree_len: int, used: list[int], *, align: int = S.DEFAULT_ALIGN,
                reserve: int = S.DEFAULT_RESERVE) -> Plan:
    """Offsets for a tree of ``tree_len`` bytes followed by blocks of ``used`` bytes each.

    Example::

        p = plan_layout(100, [10, 20], align=64, reserve=0)
        [b.data_offset % 64 for b in p.blocks], p.blocks[0].allocated
        # -> ([0, 0], 64)
    """
    if align < 1 or align & (align - 1):
        raise DataError(f"align must be a power of two, got {align}")
    if reserve < 0:
        raise DataError(f"reserve must be >= 0, got {reserve}")
    tree_offset = len(S.HEADER_LINE)
    end = tree_offset + tree_len
    if not used:
        return Plan(tree_offset, tree_len, 0, (), end)
    if tree_len:
        first = align_up(end + reserve + S.BLOCK_HEADER_BYTES, align) - S.BLOCK_HEADER_BYTES
    else:
        first = end          # docs/formats/finf.md: no tree, no padding
    slots, offset = [], first
    for i, n in enumerate(used):
        data_end = offset + S.BLOCK_HEADER_BYTES + n
        if i + 1 < len(used):
            nxt = align_up(data_end + S.BLOCK_HEADER_BYTES, align) - S.BLOCK_HEADER_BYTES
        else:
            nxt = data_end
        slots.append(BlockSlot(offset, n, nxt - offset - S.BLOCK_HEADER_BYTES))
        offset = nxt
    return Plan(tree_offset, tree_len, first - end, tuple(slots), offset)
