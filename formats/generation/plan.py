"""The shard plan of a generation: which arrays (or row ranges of them) go into which shard file.

Arrays are packed in byte-wise name order into shards of at most ``shard_max`` raw bytes; an
array larger than that is split by row ranges, one shard per range. Paths (``shards/NNNN.ext``)
depend only on the state's layout, so they are stable across generations: an unchanged shard is
not rewritten and git stores nothing new for it.

>>> plan = plan_shards({"a": np.zeros((4, 2), np.float32)}, shard_max=16, ext=".aero")
>>> [(s.path, [(p.name, p.box) for p in s.pieces]) for s in plan]
[('shards/0000.aero', [('a', ((0, 2), (0, 2)))]), ('shards/0001.aero', [('a', ((2, 4), (0, 2)))])]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import blake3
import numpy as np

from snapops.formats.errors import DataError


@dataclass(frozen=True)
class Piece:
    """Array ``name``'s elements in ``box`` (per dimension ``(start, stop)``)."""

    name: str
    box: tuple[tuple[int, int], ...]
    whole: bool = True


@dataclass
class ShardPlan:
    path: str
    pieces: list[Piece] = field(default_factory=list)


def _sort_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def plan_shards(arrays: dict[str, np.ndarray], shard_max: int, ext: str) -> list[ShardPlan]:
    """Shards in name order; arrays over ``shard_max`` bytes with more than one row are split."""
    if shard_max < 1:
        raise DataError(f"shard_max must be >= 1, got {shard_max}")
    shards: list[ShardPlan] = []
    current = ShardPlan("")
    size = 0

    def close() -> None:
        nonlocal current, size
        if current.pieces:
            current.path = f"shards/{len(shards):04d}{ext}"
            shards.append(current)
        current, size = ShardPlan(""), 0

    for name in sorted(arrays, key=_sort_key):
        array = arrays[name]
        full = tuple((0, d) for d in array.shape)
        if array.nbytes > shard_max and array.ndim >= 1 and array.shape[0] > 1:
            close()
            row = max(1, array.nbytes // array.shape[0])
            per = max(1, shard_max // row)
            for start in range(0, array.shape[0], per):
                stop = min(start + per, array.shape[0])
                current.pieces.append(Piece(name, ((start, stop),) + full[1:], whole=False))
                close()
            continue
        if current.pieces and size + array.nbytes > shard_max:
            close()
        current.pieces.append(Piece(name, full))
        size += array.nbytes
    close()
    return shards


def piece_array(arrays: dict[str, np.ndarray], piece: Piece) -> np.ndarray:
    array = arrays[piece.name]
    if piece.whole:
        return array
    (start, stop), *_ = piece.box
    return array[start:stop]


def content_digest(arrays: dict[str, np.ndarray]) -> str:
    """BLAKE3 over names, dtypes, shapes and bytes in name order (multithreaded when large):
    equal digests mean a shard need not be rewritten."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for name in sorted(arrays, key=_sort_key):
        array = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode("utf-8", "surrogatepass"))
        h.update(array.reshape(-1).view(np.uint8) if array.size else b"")
    return h.hexdigest()
