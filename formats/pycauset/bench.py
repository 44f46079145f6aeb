"""``bench_pycauset``: write, open and metadata-update times of PyCauset on this machine.

For ``snapops bench formats``; never used by tests. The payload is one 2-D float32 array of
random bits (the peer-compatible ``raw_dense`` layout). Each phase runs ``repeats`` times
after a warm-up round (the first write into fresh page cache is slower on a new VM); the
report gives the best and the median. Metadata updates are timed on the big file and on a
4 KiB one: both must be O(1) in the payload size (two fsyncs of a few hundred bytes).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..model import Snapshot
from . import open_lazy, save, update_metadata, verify


def make_state(size_bytes: int, seed: int = 0) -> Snapshot:
    """One float32 matrix of random bits, 1024 columns, about ``size_bytes`` bytes."""
    cols = 1024
    rows = max(1, size_bytes // (4 * cols))
    data = np.frombuffer(np.random.default_rng(seed).bytes(rows * cols * 4), np.float32)
    return Snapshot({"weights": data.reshape(rows, cols)}, {"model_name": "bench"})


def _time_updates(path: Path, count: int) -> list[float]:
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        update_metadata(path, {"provenance": {"verified": i, "pushed": f"origin/main@{i}"}})
        out.append(time.perf_counter() - t0)
    return out


def _time_open(path: Path) -> float:
    t0 = time.perf_counter()
    with open_lazy(path) as f:
        view = f[f.names[0]]
        del view
    return time.perf_counter() - t0


def bench_pycauset(size_bytes: int = 1 << 30, workdir: str | os.PathLike | None = None, *,
                   repeats: int = 3, updates: int = 20) -> dict:
    """Time ``save``, ``open_lazy`` (+ one view + close), ``update_metadata`` and ``verify``.

    GB/s are 10**9 payload bytes per second; times are milliseconds.

    Example::

        bench_pycauset(64 << 20, "/tmp")["update_ms"]["big"]["best"]   # ~1 ms
    """
    state = make_state(size_bytes)
    nbytes = state.nbytes
    with tempfile.TemporaryDirectory(dir=workdir, prefix="pycauset-bench-") as tmp:
        big, small = Path(tmp) / "big.pycauset", Path(tmp) / "small.pycauset"
        save(Snapshot({"w": np.zeros((32, 32), np.float32)}), small)
        runs = []
        for round_ in range(repeats + 1):
            if big.exists():
                os.unlink(big)
            t0 = time.perf_counter()
            save(state, big)
            t1 = time.perf_counter()
            if round_:                   # round 0 warms the page cache and the allocator
                runs.append({"write_s": t1 - t0, "open_s": _time_open(big)})
        update_big = _time_updates(big, updates)
        update_small = _time_updates(small, updates)
        t0 = time.perf_counter()
        report = verify(big)
        verify_s = time.perf_counter() - t0
        if not report.ok:
            raise RuntimeError(f"benchmark file failed verification: {report.failure}")
        file_size = big.stat().st_size

    def stats(values: list[float]) -> dict:
        return {"best": min(values) * 1e3, "median": statistics.median(values) * 1e3}

    return {
        "format": "pycauset", "size_bytes": nbytes, "file_size": file_size, "repeats": repeats,
        "write_gbps": nbytes / min(r["write_s"] for r in runs) / 1e9,
        "write_gbps_median": nbytes / statistics.median(r["write_s"] for r in runs) / 1e9,
        "open_ms": stats([r["open_s"] for r in runs]),
        "update_ms": {"big": stats(update_big), "small": stats(update_small),
                      "updates": updates},
        "verify_gbps": nbytes / verify_s / 1e9,
        "cpus": os.cpu_count(),
    }
