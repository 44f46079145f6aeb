"""Compare two snapshots array by array, block by block, in bounded memory.

Plan, then run: ``plan_pair`` decides per array what to compare (blocks, dtype to compute in,
whether chunk digests can stand in for the bytes) and cuts the work into tasks of about
``BATCH_BYTES``; worker threads run ``block_stats`` on each task (numpy releases the GIL, so
both cores work); the main thread folds the per-block sums into one ``ArrayDiff`` per array.

Per block the sums are BLAS dot products in float32 or float64 (by dtype) and are added up in
float64, so array-level numbers carry about 1e-7 relative error for float32 arrays.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from snapops.formats.workers import HelperPool

from ._sources import ArraySource, Layout, SnapshotSource

# Raw bytes per task: every buffer of a task (decoded text, temporaries) stays under the
# 4 MiB mmap threshold set by tune_allocator, so it is reused from the heap instead of being
# fresh zeroed pages each time (that alone halved the throughput here).
BATCH_BYTES = 2 << 20


@dataclass
class BlockChange:
    """One changed block: ``kind`` 'rows' (rows [start, stop)) or 'flat' (elements)."""

    index: int
    kind: str
    start: int
    stop: int
    elements: int                # elements whose value (bits) changed
    max_abs: float | None        # max |B - A| in the block
    rel: float | None            # ||B - A|| / ||A|| over the block

    def label(self, name: str) -> str:
        where = f"[{self.start}:{self.stop}]"
        return f"{name}{where}" if self.kind == "rows" else f"{name}.flat{where}"


@dataclass
class ArrayDiff:
    """The comparison of one array. ``status``: added, removed, changed or unchanged."""

    name: str
    status: str
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    blocks: int = 0
    blocks_changed: int = 0
    elements: int = 0
    elements_changed: int = 0
    max_abs: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    norm_a: float | None = None
    norm_b: float | None = None
    rows_per_block: int | None = None
    block_elems: int = 0
    bytes: int = 0
    changes: list[BlockChange] = field(default_factory=list)
    block_rel: np.ndarray | None = field(default=None, repr=False)  # per block, 0 = unchanged
    notes: list[str] = field(default_factory=list)

    @property
    def shape_changed(self) -> bool:
        return self.status not in ("added", "removed") and self.shape_a != self.shape_b

    @property
    def dtype_changed(self) -> bool:
        return self.status not in ("added", "removed") and self.dtype_a != self.dtype_b

    def to_dict(self) -> dict:
        out = {k: _jsonable(getattr(self, k)) for k in (
            "name", "status", "dtype_a", "dtype_b", "shape_a", "shape_b", "blocks",
            "blocks_changed", "elements", "elements_changed", "max_abs", "rel_l2", "cosine",
            "norm_a", "norm_b", "rows_per_block", "block_elems", "bytes", "notes")}
        out["changes"] = [{k: _jsonable(v) for k, v in c.__dict__.items()} for c in self.changes]
        return out


@dataclass
class DiffReport:
    """Everything ``snapops diff`` shows; renderers live in ``_render``."""

    a: str
    b: str
    format_a: str
    format_b: str
    arrays: list[ArrayDiff]
    meta_changes: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {"added": 0, "removed": 0, "changed": 0, "unchanged": 0}
        for item in self.arrays:
            out[item.status] += 1
        out["blocks"] = sum(i.blocks for i in self.arrays)
        out["blocks_changed"] = sum(i.blocks_changed for i in self.arrays)
        out["elements"] = sum(i.elements for i in self.arrays)
        out["elements_changed"] = sum(i.elements_changed for i in self.arrays)
        out["bytes"] = sum(i.bytes for i in self.arrays)
        return out

    @property
    def changed(self) -> bool:
        return any(i.status != "unchanged" for i in self.arrays)

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "format_a": self.format_a, "format_b": self.format_b,
                "counts": self.counts(),
                "meta_changes": [{"key": k, "a": x, "b": y} for k, x, y in self.meta_changes],
                "arrays": [i.to_dict() for i in self.arrays]}


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


# --- planning ----------------------------------------------------------------------------------

@dataclass
class _Job:
    """What to compare for one array present in both snapshots."""

    diff: ArrayDiff
    a: ArraySource
    b: ArraySource
    layout: Layout
    compute: np.dtype | None        # dtype for the numbers (None: bytes only)
    bitwise: bool                   # same dtype: "changed" means the bits differ
    digest_mode: bool               # WTXT chunk SHA-256 values decide what changed
    changed: np.ndarray | None = None
    tasks: list[tuple[int, int]] = field(default_factory=list)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    left: int = 0

    def prepare(self) -> None:
        count = self.layout.count
        self.sums = {k: np.zeros(count) for k in ("ss_a", "ad", "ss_d", "max_abs")}
        self.sums["n"] = np.zeros(count, np.int64)
        self.sums["changed"] = np.zeros(count, bool)
        if self.digest_mode:
            self.changed = (self.a.digests() != self.b.digests()).any(axis=1)
        self.left = len(self.tasks)

    def merge(self, first: int, result: dict[str, np.ndarray]) -> None:
        for key, values in result.items():
            self.sums[key][first:first + len(values)] = values
        self.left -= 1

    def release(self) -> None:
        self.a.release()
        self.b.release()


def compute_dtype(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The dtype the numbers are computed in, or None when the values are not numbers."""
    def numeric(dt: np.dtype) -> bool:
        return dt.kind in "fiub" or dt.name == "bfloat16"
    if not (numeric(a) and numeric(b)):
        return None
    if a != b:
        return np.dtype(np.float64)
    if a.kind == "f" and a.itemsize >= 4:
        return a
    if a.kind == "f" or a.name == "bfloat16":
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def plan_pair(name: str, a: ArraySource | None, b: ArraySource | None):
    """An ArrayDiff (complete for added/removed/incomparable arrays) and a _Job or None."""
    if a is None or b is None:
        src = a or b
        diff = ArrayDiff(name, "removed" if b is None else "added",
                         bytes=src.nbytes, blocks=src.layout.count)
        setattr(diff, "dtype_a" if b is None else "dtype_b", _dtype_name(src.dtype))
        setattr(diff, "shape_a" if b is None else "shape_b", src.shape)
        return diff, None
    diff = ArrayDiff(name, "unchanged", _dtype_name(a.dtype), _dtype_name(b.dtype), a.shape,
                     b.shape, bytes=max(a.nbytes, b.nbytes))
    same_rows = a.shape[1:] == b.shape[1:] and len(a.shape) >= 1 and len(b.shape) >= 1
    if a.shape != b.shape:
        diff.status = "changed"
        if not same_rows:
            diff.notes.append("shape changed: values not compared")
            return diff, None
    compute = compute_dtype(a.dtype, b.dtype)
    if a.dtype != b.dtype:
        diff.status = "changed"
        if compute is None:
            diff.notes.append("dtype changed: values not compared")
            return diff, None
        diff.notes.append("dtype changed: values compared as float64")
    layout = a.layout
    if a.shape != b.shape:
        rows = min(a.shape[0], b.shape[0])
        layout = Layout(rows * layout.row_elems, layout.block_elems, layout.row_elems)
        grew = b.shape[0] - a.shape[0]
        diff.notes.append(f"{abs(grew)} rows {'added' if grew > 0 else 'removed'}; "
                          f"compared the {rows} common rows")
    digest_mode = (a.digests is not None and b.digests is not None and a.layout == b.layout
                   and a.dtype == b.dtype and a.shape == b.shape)
    diff.blocks, diff.elements = layout.count, layout.n_elems
    diff.rows_per_block, diff.block_elems = layout.rows_per_block, layout.block_elems
    if (a.sha256 and a.sha256 == b.sha256 and a.dtype == b.dtype and a.shape == b.shape):
        _identical(diff)               # the files state equal array digests: nothing to read
        return diff, None
    job = _Job(diff, a, b, layout, compute, a.dtype == b.dtype, digest_mode)
    job.tasks = _tasks(layout, a.dtype.itemsize)
    return diff, job


def _identical(diff: ArrayDiff) -> None:
    diff.max_abs, diff.rel_l2, diff.cosine = 0.0, 0.0, 1.0
    diff.block_rel = np.zeros(diff.blocks)


def _tasks(layout: Layout, itemsize: int) -> list[tuple[int, int]]:
    """(first block, count) of about BATCH_BYTES each; the short last block runs alone."""
    count = layout.count
    full = count - (1 if count and layout.span(count - 1)[1] - layout.span(count - 1)[0]
                    != layout.block_elems else 0)
    per = max(1, BATCH_BYTES // max(layout.block_elems * itemsize, 1))
    tasks = [(first, min(per, full - first)) for first in range(0, full, per)]
    if full < count:
        tasks.append((full, 1))
    return tasks


def _dtype_name(dt: np.dtype) -> str:
    """The dtype as every report spells it (``f32``, ``bf16``, ``bool``: ``dtype_label``)."""
    from snapops.formats.dtypes import dtype_label

    return dtype_label(dt)


# --- the work of one task (runs in a worker thread) --------------------------------------------

def run_task(job: _Job, first: int, count: int) -> dict[str, np.ndarray]:
    layout = job.layout
    start, stop = layout.span(first)[0], layout.span(first + count - 1)[1]
    a = job.a.read(start, stop)
    mask = None
    if job.digest_mode:
        mask = job.changed[first:first + count]
        if mask.any():
            b = a.copy()
            for lo, hi in true_runs(mask):
                s, e = layout.span(first + lo)[0], layout.span(first + hi - 1)[1]
                b[s - start:e - start] = job.b.read(s, e)
        else:
            b = None
    else:
        b = job.b.read(start, stop)
    return block_stats(a.reshape(count, -1), None if b is None else b.reshape(count, -1),
                       mask, job.compute, job.bitwise)


def true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) of every run of True in a 1-D bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _rowdot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-row dot products as float64. A stacked (1 x n) @ (n x 1) matmul runs BLAS dot
    kernels: several accumulators, so float32 rows of 8192 values keep ~2e-7 relative error
    (pairwise-sum accuracy) at about 3x the speed of multiply-then-sum."""
    if not x.shape[1]:
        return np.zeros(x.shape[0])
    return np.matmul(x[:, None, :], y[:, :, None]).reshape(-1).astype(np.float64)


def _sumsq(x: np.ndarray) -> np.ndarray:
    return _rowdot(x, x)


def _count_rows(neq: np.ndarray) -> np.ndarray:
    """True values per row of a 2-D bool array (popcount of packed bits: ~6x a bool sum)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(np.packbits(neq, axis=1)).sum(axis=1, dtype=np.int64)
    return neq.sum(axis=1)


def _bits(x: np.ndarray) -> np.ndarray:
    size = x.dtype.itemsize
    if size in (1, 2, 4, 8):
        return x.view(f"u{size}")
    return x.view(np.uint8).reshape(x.shape[0], -1, size)


def _neq(a2: np.ndarray, b2: np.ndarray, bitwise: bool, compute) -> np.ndarray:
    """Per-element 'changed' mask of (count, n) blocks."""
    if bitwise:
        neq = _bits(a2) != _bits(b2)
        return neq if neq.ndim == 2 else neq.any(axis=2)
    return a2.astype(compute) != b2.astype(compute)


def block_stats(a2: np.ndarray, b2: np.ndarray | None, mask: np.ndarray | None, compute,
                bitwise: bool) -> dict[str, np.ndarray]:
    """Per-block sums for (count, n) blocks of A and B (``b2`` None: B equals A).

    ``mask`` (from chunk digests) says which blocks changed; without it the bits decide."""
    count = a2.shape[0]
    zeros = np.zeros(count)
    ca = a2.astype(compute, copy=False) if compute is not None else None
    ss_a = _sumsq(ca) if ca is not None else zeros.copy()
    out = {"ss_a": ss_a, "ad": zeros.copy(), "ss_d": zeros.copy(),
           "max_abs": zeros.copy(), "n": np.zeros(count, np.int64),
           "changed": np.zeros(count, bool)}
    if b2 is None:
        return out
    if mask is None:
        out["n"] = _count_rows(_neq(a2, b2, bitwise, compute))
        mask = out["n"] > 0
    idx = np.flatnonzero(mask)
    if not idx.size:
        return out
    whole = idx.size == count
    ar, br = (a2, b2) if whole else (a2[idx], b2[idx])
    if not out["n"].any():
        out["n"][idx] = _count_rows(_neq(ar, br, bitwise, compute))
    out["changed"][idx] = True
    if compute is None:
        return out
    ac = ca if whole else ca[idx]
    bc = br.astype(compute, copy=False)
    d = bc - ac
    out["ss_d"][idx] = _sumsq(d)
    out["ad"][idx] = _rowdot(ac, d)
    out["max_abs"][idx] = np.abs(d, out=d).max(axis=1)       # d is not needed after this
    return out


# --- folding the block sums into one ArrayDiff ---------------------------------------------------

def finish(job: _Job) -> ArrayDiff:
    diff, s, layout = job.diff, job.sums, job.layout
    changed = s["changed"]
    diff.blocks_changed = int(changed.sum())
    diff.elements_changed = int(s["n"].sum())
    if diff.blocks_changed:
        diff.status = "changed"
    numeric = job.compute is not None
    if numeric:
        ss_a, ad, ss_d = (float(s[k].sum()) for k in ("ss_a", "ad", "ss_d"))
        ss_b = max(ss_a + 2 * ad + ss_d, 0.0)
        diff.norm_a, diff.norm_b = math.sqrt(ss_a), math.sqrt(ss_b)
        diff.max_abs = float(s["max_abs"].max()) if len(changed) else 0.0
        diff.rel_l2 = _ratio(math.sqrt(ss_d), diff.norm_a)
        diff.cosine = cosine(ss_a, ad, ss_d)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.sqrt(s["ss_d"]) / np.sqrt(s["ss_a"])
        rel[~changed] = 0.0
        rel[changed & (s["ss_a"] == 0)] = np.inf
        # NaN marks a block whose sums are not finite (NaN or Inf values in A or B), so the
        # heatmap draws it as non-finite rather than as the largest real change
        rel[changed & ~(np.isfinite(s["ss_a"]) & np.isfinite(s["ss_d"]))] = np.nan
        diff.block_rel = rel
    else:
        diff.block_rel = changed.astype(np.float64)
        diff.notes.append("values are not numbers: only changed bytes counted")
    for ix in np.flatnonzero(changed).tolist():
        kind, start, stop = layout.label(ix)
        diff.changes.append(BlockChange(
            ix, kind, start, stop, int(s["n"][ix]),
            float(s["max_abs"][ix]) if numeric else None,
            float(diff.block_rel[ix]) if numeric else None))
    return diff


def cosine(ss_a: float, ad: float, ss_d: float) -> float | None:
    """cos(A, B) from ||A||^2, A.D and ||D||^2 (D = B - A), accurate when B is close to A.

    A.B / (|A||B|) loses 1 - cos below float32 resolution (~1e-7) for small updates; instead
    1 - cos = (||D||^2 - (|B| - |A|)^2) / (2|A||B|) with |B| - |A| = (2 A.D + ||D||^2) /
    (|A| + |B|), where every term is computed from D itself."""
    ss_b = ss_a + 2 * ad + ss_d
    if not all(map(math.isfinite, (ss_a, ad, ss_d))):
        return math.nan                 # NaN or inf values: no meaningful angle
    if ss_a <= 0 or ss_b <= 0:
        return None
    na, nb = math.sqrt(ss_a), math.sqrt(ss_b)
    gap = (2 * ad + ss_d) / (na + nb)
    return max(-1.0, min(1.0, 1.0 - (ss_d - gap * gap) / (2 * na * nb)))


def _ratio(num: float, den: float) -> float:
    if den:
        return num / den
    return 0.0 if num == 0 else math.inf


# --- driver -------------------------------------------------------------------------------------

def diff_snapshots(a: SnapshotSource, b: SnapshotSource, *, a_label: str = "A",
                   b_label: str = "B", threads: int = 2,
                   progress: Callable[[int], None] | None = None) -> DiffReport:
    """Compare every array of ``a`` and ``b`` (see module docstring)."""
    from snapops.formats._alloc import tune_allocator

    tune_allocator()
    names = sorted(set(a.arrays) | set(b.arrays),
                   key=lambda n: n.encode("utf-8", "surrogatepass"))
    planned = [plan_pair(n, a.arrays.get(n), b.arrays.get(n)) for n in names]
    window: collections.deque = collections.deque()
    with HelperPool(max(1, threads)) as pool:
        for diff, job in planned:
            if job is None:
                continue
            job.prepare()
            if not job.tasks:
                job.release()
            for first, count in job.tasks:
                window.append((job, first, pool.submit(run_task, job, first, count)))
                while len(window) > 2 * max(1, threads):
                    _collect(window.popleft(), progress)
        while window:
            _collect(window.popleft(), progress)
    arrays = [finish(job) if job is not None else diff for diff, job in planned]
    return DiffReport(a_label, b_label, a.format, b.format, arrays, meta_changes(a.meta, b.meta))


def _collect(entry, progress) -> None:
    job, first, future = entry
    try:
        result = future.result()
    except BaseException:
        job.release()
        raise
    job.merge(first, result)
    if progress is not None:
        progress(len(result["n"]) * job.layout.block_elems * job.a.dtype.itemsize)
    if job.left == 0:
        job.release()


def meta_changes(a: dict[str, str], b: dict[str, str]) -> list[tuple[str, str | None, str | None]]:
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
