"""``bench_finf``: write, open and tree-update times of FINF on this machine.

Used by ``snapops bench formats``; never by tests. Each timed phase runs ``repeats`` times
after one warm-up round; the report gives the best and the median. Writes include the fsync
and the atomic rename. The tree update is timed on the large file and on a small file with the
same number of arrays (its cost depends on the tree, not on the payload).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..model import Snapshot
from . import FinfFile, open_lazy, save, update_tree, verify


def make_state(size_bytes: int, arrays: int = 64, seed: int = 0) -> Snapshot:
    """``arrays`` float32 arrays of random bits adding up to ``size_bytes`` (rounded down)."""
    per = max(1, size_bytes // arrays // 4)
    data = np.frombuffer(np.random.default_rng(seed).bytes(per * arrays * 4), np.float32)
    return Snapshot({f"layer.{i:03d}.weight": data[i * per:(i + 1) * per]
                     for i in range(arrays)}, {"model_name": "bench", "step": 0})


def _time_writes(state: Snapshot, path: Path, repeats: int, **opts) -> list[float]:
    out = []
    for round_ in range(repeats + 1):
        if path.exists():
            path.unlink()       # freeing the old file's extents is not part of the write
        t0 = time.perf_counter()
        save(state, path, **opts)
        if round_:              # round 0 warms the page cache and the allocator
            out.append(time.perf_counter() - t0)
    return out


def _time_baseline(state: Snapshot, path: Path, repeats: int) -> list[float]:
    """The same bytes written by one plain write() + fsync: what the disk allows."""
    out = []
    for round_ in range(repeats + 1):
        if path.exists():
            path.unlink()
        t0 = time.perf_counter()
        with open(path, "wb") as handle:
            for array in state.arrays.values():
                handle.write(array)
            handle.flush()
            os.fsync(handle.fileno())
        if round_:
            out.append(time.perf_counter() - t0)
    path.unlink()
    return out


def _time_open(path: Path, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        with open_lazy(path) as f:
            first = f[f.names[0]]
            del first
        out.append(time.perf_counter() - t0)
    return out[1:]


def _time_updates(path: Path, repeats: int) -> tuple[list[float], set[str]]:
    out, modes = [], set()
    for i in range(repeats * 4 + 1):
        t0 = time.perf_counter()
        modes.add(update_tree(path, {"step": i + 1, "note": "x" * (i % 7)})["mode"])
        out.append(time.perf_counter() - t0)
    return out[1:], modes


def bench_finf(size_bytes: int = 1 << 30, workdir: str | os.PathLike | None = None, *,
               arrays: int = 64, repeats: int = 3) -> dict:
    """Time ``save`` (with and without MD5 checksums), ``open_lazy`` and ``update_tree``.

    ``baseline_write_fsync_gbps`` is one plain ``write`` + ``fsync`` of the same bytes, for
    comparing the writer against what the disk gives at that moment.

    GB/s are 10**9 bytes of array data per second; times are milliseconds.

    Example::

        bench_finf(64 << 20, "/tmp")["write_gbps_no_checksum"] > 0
        # -> True
    """
    state = make_state(size_bytes, arrays)
    small = make_state(arrays * 1024, arrays)
    nbytes = state.nbytes
    with tempfile.TemporaryDirectory(dir=workdir, prefix="finf-bench-") as tmp:
        big_path, small_path = Path(tmp) / "bench.finf", Path(tmp) / "small.finf"
        base = _time_baseline(state, big_path, repeats)
        w_raw = _time_writes(state, big_path, repeats, checksum=False)
        w_sum = _time_writes(state, big_path, repeats, checksum=True)
        save(small, small_path)
        opened = _time_open(big_path, repeats * 4)
        upd_big, modes_big = _time_updates(big_path, repeats)
        upd_small, modes_small = _time_updates(small_path, repeats)
        t0 = time.perf_counter()
        report = verify(big_path)
        verify_s = time.perf_counter() - t0
        if not report.ok:
            raise RuntimeError(f"benchmark file failed verification: {report.failure}")
        with FinfFile(big_path) as f:
            tree_bytes = f.sections.tree_end - f.sections.tree_start
    return {
        "format": "finf", "size_bytes": nbytes, "arrays": arrays, "repeats": repeats,
        "write_gbps": nbytes / min(w_sum) / 1e9,
        "write_gbps_no_checksum": nbytes / min(w_raw) / 1e9,
        "baseline_write_fsync_gbps": nbytes / min(base) / 1e9,
        "open_ms": min(opened) * 1e3,
        "update_ms_large": min(upd_big) * 1e3,
        "update_ms_small": min(upd_small) * 1e3,
        "update_modes": sorted(modes_big | modes_small),
        "verify_gbps": nbytes / verify_s / 1e9,
        "tree_bytes": tree_bytes,
        "median": {"write_gbps": nbytes / statistics.median(w_sum) / 1e9,
                   "baseline_write_fsync_gbps": nbytes / statistics.median(base) / 1e9,
                   "write_gbps_no_checksum": nbytes / statistics.median(w_raw) / 1e9,
                   "open_ms": statistics.median(opened) * 1e3,
                   "update_ms_large": statistics.median(upd_big) * 1e3,
                   "update_ms_small": statistics.median(upd_small) * 1e3},
        "cpus": os.cpu_count(),
    }
