"""The shard plan of a generation: which arrays (or row ranges of them) go into which shard file,
and the layout rules for arrays that training ranks hold in pieces.

Arrays are packed in byte-wise name order into shards of at most ``shard_max`` raw bytes; an
array larger than that is split by row ranges, one shard per range. Paths (``shards/NNNN.ext``;
``shards/r<rank>/NNNN.ext`` for the pieces of rank ``rank`` in a multi-rank run) depend only on
the state's layout, so they are stable across generations: an unchanged shard is not rewritten
and git stores nothing new for it.

A rank holds either whole arrays or :class:`Shard` s (a box of a global array, as PyTorch DCP
describes one: global shape and offsets). :func:`check_layout` decides whether the pieces the
ranks of a generation sent make whole arrays: every piece inside the global shape, pieces of
one array with one dtype and one global shape, pairwise disjoint, covering every element.

>>> plan = plan_shards({"a": np.zeros((4, 2), np.float32)}, shard_max=16, ext=".aero")
>>> [(s.path, [(p.name, p.box) for p in s.pieces]) for s in plan]
[('shards/0000.aero', [('a', ((0, 2), (0, 2)))]), ('shards/0001.aero', [('a', ((2, 4), (0, 2)))])]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np

from snapops.formats.errors import DataError

Box = tuple[tuple[int, int], ...]


class LayoutError(DataError):
    """The pieces the ranks sent do not make whole arrays (overlap, hole, disagreement)."""


@dataclass(frozen=True)
class Shard:
    """The piece of a global array that one rank holds: ``local`` (a numpy array or a torch
    tensor) is the box starting at ``offsets`` of an array of ``global_shape``.

    >>> Shard(np.ones((2, 4)), global_shape=(8, 4), offsets=(2, 0)).box
    ((2, 4), (0, 4))
    """

    local: Any
    global_shape: tuple[int, ...] = field(kw_only=True)
    offsets: tuple[int, ...] = field(kw_only=True)

    def __post_init__(self) -> None:
        shape = _dims(self.global_shape, "global_shape")
        offsets = _dims(self.offsets, "offsets")
        local = getattr(self.local, "shape", None)
        if not isinstance(local, tuple) or not all(isinstance(d, (int, np.integer))
                                                   for d in local):
            raise DataError(f"Shard: local: expected a numpy array or a torch tensor, got "
                            f"{type(self.local).__name__}")
        local = tuple(int(d) for d in local)
        if not len(shape) == len(offsets) == len(local):
            raise DataError(f"Shard: local shape {local}, global_shape {shape} and offsets "
                            f"{offsets} must have the same number of dimensions")
        if any(o + n > d for o, n, d in zip(offsets, local, shape)):
            raise DataError(f"Shard: local shape {local} at offsets {offsets} does not fit in "
                            f"global_shape {shape}")
        object.__setattr__(self, "global_shape", shape)
        object.__setattr__(self, "offsets", offsets)

    @property
    def box(self) -> Box:
        return tuple((o, o + int(n)) for o, n in zip(self.offsets, self.local.shape))


def _dims(values, what: str) -> tuple[int, ...]:
    """A tuple or list of real integers >= 0 (Python or numpy ints; never a bool, a float or a
    string, which ``int()`` would quietly read as something else)."""
    if not isinstance(values, (tuple, list)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            for v in values):
        raise DataError(f"Shard: {what}: expected a sequence of integers (tuple or list), got "
                        f"{_short(values)}")
    dims = tuple(int(v) for v in values)
    if any(d < 0 for d in dims):
        raise DataError(f"Shard: {what}: expected integers >= 0, got {_short(values)}")
    return dims


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class RankBox:
    """One rank's box of global array ``name`` (what :func:`check_layout` judges)."""

    name: str
    rank: int | None
    dtype: str                      # logical dtype name (``bf16`` ...)
    shape: tuple[int, ...]          # the global shape the rank declared
    box: Box


def check_layout(boxes: list[RankBox]) -> None:
    """LayoutError naming the array and the ranks unless, per array, the boxes agree on dtype
    and global shape, lie inside it, and tile it exactly (no overlap, no hole)."""
    by_name: dict[str, list[RankBox]] = {}
    for item in boxes:
        by_name.setdefault(item.name, []).append(item)
    for name, items in by_name.items():
        first = items[0]
        for item in items[1:]:
            if (item.dtype, item.shape) != (first.dtype, first.shape):
                raise LayoutError(
                    f"array {name}: rank {item.rank} declares {item.dtype} {list(item.shape)} "
                    f"but rank {first.rank} {first.dtype} {list(first.shape)}")
        for item in items:
            if len(item.box) != len(first.shape) or any(
                    not 0 <= lo <= hi <= d for (lo, hi), d in zip(item.box, first.shape)):
                raise LayoutError(f"array {name}: rank {item.rank}'s box {_text(item.box)} lies "
                                f"outside the global shape {list(first.shape)}")
        _check_disjoint(name, items)
        covered = sum(math.prod(hi - lo for lo, hi in item.box) for item in items)
        total = math.prod(first.shape)
        if covered != total:
            ranks = sorted({-1 if i.rank is None else i.rank for i in items})
            raise LayoutError(f"array {name}: the boxes of ranks {ranks} cover {covered} of its "
                            f"{total} elements (a rank's piece is missing or boxes leave a hole)")


def _check_disjoint(name: str, items: list[RankBox]) -> None:
    """A sweep over the first dimension: row splits cost O(n log n)."""
    solid = sorted((i for i in items if i.box and all(lo < hi for lo, hi in i.box)),
                   key=lambda i: i.box)
    active: list[RankBox] = []
    for item in solid:
        active = [a for a in active if a.box[0][1] > item.box[0][0]]
        for other in active:
            if all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(other.box, item.box)):
                raise LayoutError(f"array {name}: the boxes of ranks {other.rank} "
                                f"({_text(other.box)}) and {item.rank} ({_text(item.box)}) "
                                "overlap")
        active.append(item)
    if any(not i.box for i in items) and len(items) > 1:  # 0-d arrays: one holder only
        raise LayoutError(f"array {name}: ranks {[i.rank for i in items]} all hold this "
                        "0-d array; exactly one rank may")


def _text(box: Box) -> str:
    return ",".join(f"{lo}:{hi}" for lo, hi in box) or "()"


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


def plan_shards(arrays: dict[str, np.ndarray], shard_max: int, ext: str,
                prefix: str = "shards/") -> list[ShardPlan]:
    """Shards in name order; arrays over ``shard_max`` bytes with more than one row are split.
    Paths are ``<prefix>NNNN<ext>``."""
    if shard_max < 1:
        raise DataError(f"shard_max must be >= 1, got {shard_max}")
    shards: list[ShardPlan] = []
    current = ShardPlan("")
    size = 0

    def close() -> None:
        nonlocal current, size
        if current.pieces:
            current.path = f"{prefix}{len(shards):04d}{ext}"
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


def content_digest(arrays: dict[str, np.ndarray], threads: int = blake3.blake3.AUTO) -> str:
    """BLAKE3 over names, dtypes, shapes and bytes in name order (on ``threads`` threads,
    default as many as help): equal digests mean a shard need not be rewritten, and a
    restore's arrays are the sealed ones."""
    h = blake3.blake3(max_threads=threads)
    for name in sorted(arrays, key=_sort_key):
        array = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode("utf-8", "surrogatepass"))
        h.update(array.reshape(-1).view(np.uint8) if array.size else b"")
    return h.hexdigest()
