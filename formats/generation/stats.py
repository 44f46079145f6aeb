"""Per-array statistics recorded in the MANIFEST at save time, so a review of two generations can
be made from their MANIFESTs alone (no weights downloaded).

Over the finite values, in float64: L2 norm, min, max, mean; plus the NaN and Inf counts.
Computed in bounded chunks in a fixed order, so the same array always gives the same numbers.

>>> import numpy as np
>>> array_stats(np.array([3.0, 4.0, np.nan, np.inf], np.float32))
Stats(norm=5.0, min=3.0, max=4.0, mean=3.5, nan=1, inf=1)
"""

from __future__ import annotations

import math

import numpy as np

from .manifest import Stats

CHUNK_ELEMS = 1 << 20


def array_stats(array: np.ndarray) -> Stats | None:
    """Statistics of a real-valued or integer array; None for other kinds (complex, bytes)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if not _numeric(flat.dtype):
        return None
    total = sq = 0.0
    lo, hi = math.inf, -math.inf
    finite_count = nan = inf = 0
    for start in range(0, flat.size, CHUNK_ELEMS):
        chunk = flat[start:start + CHUNK_ELEMS].astype(np.float64)
        finite = np.isfinite(chunk)
        if not finite.all():
            bad = int(chunk.size - np.count_nonzero(finite))
            nans = int(np.count_nonzero(np.isnan(chunk)))
            nan, inf = nan + nans, inf + bad - nans
            chunk = chunk[finite]
        if chunk.size:
            total += float(chunk.sum())
            sq += float(np.dot(chunk, chunk))
            lo, hi = min(lo, float(chunk.min())), max(hi, float(chunk.max()))
            finite_count += chunk.size
    if not finite_count:
        return Stats(0.0, math.nan, math.nan, math.nan, nan, inf)
    return Stats(math.sqrt(sq), lo, hi, total / finite_count, nan, inf)


def _numeric(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf" or dtype.name == "bfloat16"
