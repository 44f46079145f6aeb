"""Per-array statistics recorded in the MANIFEST at save time, so a review of two generations can
be made from their MANIFESTs alone (no weights downloaded).

Over the finite values, in float64: L2 norm, min, max, mean; plus the NaN and Inf counts.
Computed in bounded chunks in a fixed order, so the same array always gives the same numbers.
An array held in pieces (one per training rank) gets the statistics of the global array: each
piece yields its :class:`Partial` (sum, sum of squares, min, max and the counts), partials are
combined exactly as they are (sums added, extremes compared, counts added; never means
averaged or norms added), in rank order, and only then turned into :class:`Stats`.

>>> import numpy as np
>>> array_stats(np.array([3.0, 4.0, np.nan, np.inf], np.float32))
Stats(norm=5.0, min=3.0, max=4.0, mean=3.5, nan=1, inf=1)
>>> finish(combine([partial_stats(np.array([3.0])), partial_stats(np.array([4.0]))]))
Stats(norm=5.0, min=3.0, max=4.0, mean=3.5, nan=0, inf=0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .manifest import Stats

CHUNK_ELEMS = 1 << 20


@dataclass(frozen=True)
class Partial:
    """The raw accumulators of one piece of an array: what combining needs, nothing derived."""

    total: float = 0.0
    squares: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    count: int = 0          # finite values
    nan: int = 0
    inf: int = 0


def array_stats(array: np.ndarray) -> Stats | None:
    """Statistics of a real-valued or integer array; None for other kinds (complex, bytes)."""
    part = partial_stats(array)
    return None if part is None else finish(part)


def partial_stats(array: np.ndarray) -> Partial | None:
    """The accumulators of ``array`` (None for dtypes without statistics).

    Each chunk is widened to float64 once; its extremes, taken first, are the statistics'
    own unless one is not finite: only such chunks pay for the finiteness mask (and a second
    look for their finite extremes). Squares are summed pairwise by numpy rather than by a BLAS
    dot, which would start its own threads beside the writer's.
    """
    flat = np.ascontiguousarray(array).reshape(-1)
    if not _numeric(flat.dtype):
        return None
    total = sq = 0.0
    lo, hi = math.inf, -math.inf
    finite_count = nan = inf = 0
    buffer = np.empty(min(CHUNK_ELEMS, flat.size), np.float64)
    for start in range(0, flat.size, CHUNK_ELEMS):
        piece = flat[start:start + CHUNK_ELEMS]
        chunk = buffer[:piece.size]
        np.copyto(chunk, piece, casting="unsafe")
        least, most = float(chunk.min()), float(chunk.max())
        if not (math.isfinite(least) and math.isfinite(most)):
            finite = np.isfinite(chunk)
            bad = int(chunk.size - np.count_nonzero(finite))
            nans = int(np.count_nonzero(np.isnan(chunk)))
            nan, inf = nan + nans, inf + bad - nans
            chunk = chunk[finite]
            if chunk.size:
                least, most = float(chunk.min()), float(chunk.max())
        if chunk.size:
            lo, hi = min(lo, least), max(hi, most)
            total += float(chunk.sum())
            sq += float(np.square(chunk, out=chunk).sum())
            finite_count += chunk.size
    return Partial(total, sq, lo, hi, finite_count, nan, inf)


def combine(parts: Iterable[Partial | None]) -> Partial | None:
    """One Partial for pieces given in a fixed order; None if any piece has no statistics."""
    total = sq = 0.0
    lo, hi = math.inf, -math.inf
    count = nan = inf = 0
    for part in parts:
        if part is None:
            return None
        total, sq = total + part.total, sq + part.squares
        lo, hi = min(lo, part.min), max(hi, part.max)
        count, nan, inf = count + part.count, nan + part.nan, inf + part.inf
    return Partial(total, sq, lo, hi, count, nan, inf)


def finish(part: Partial) -> Stats:
    if not part.count:
        return Stats(0.0, math.nan, math.nan, math.nan, part.nan, part.inf)
    return Stats(math.sqrt(part.squares), part.min, part.max, part.total / part.count,
                 part.nan, part.inf)


def _numeric(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf" or dtype.name == "bfloat16"
