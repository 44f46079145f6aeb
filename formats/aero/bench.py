"""``bench_aero``: write, open and full-verify throughput of AERO on this machine.

Used by ``snapops bench formats``; never by tests. Each phase runs ``repeats`` times after one
warm-up round (the first write into fresh page cache is much slower on a new VM: the guest's
memory is touched for the first time); the report gives the best and the median of each phase.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..model import Snapshot
from . import open_lazy, save, verify


def make_state(size_bytes: int, tensors: int = 64, seed: int = 0) -> Snapshot:
    """``tensors`` float32 arrays of random bits adding up to ``size_bytes`` (rounded down)."""
    per = max(1, size_bytes // tensors // 4)
    data = np.frombuffer(np.random.default_rng(seed).bytes(per * tensors * 4), np.float32)
    return Snapshot({f"layer.{i:03d}.weight": data[i * per:(i + 1) * per]
                     for i in range(tensors)}, {"model_name": "bench"})


def bench_aero(size_bytes: int = 1 << 30, workdir: str | os.PathLike | None = None, *,
               tensors: int = 64, repeats: int = 3, **save_opts) -> dict:
    """Time ``save``, ``open_lazy`` (+ close) and ``verify(level="full")`` on a synthetic state.

    GB/s are 10**9 bytes of tensor data per second; ``open_ms`` is milliseconds.

    Example::

        bench_aero(64 << 20, "/tmp")["write_gbps"]
    """
    state = make_state(size_bytes, tensors)
    nbytes = state.nbytes
    with tempfile.TemporaryDirectory(dir=workdir, prefix="aero-bench-") as tmp:
        path = Path(tmp) / "bench.aero"
        runs = []
        for round_ in range(repeats + 1):
            t0 = time.perf_counter()
            save(state, path, **save_opts)
            t1 = time.perf_counter()
            with open_lazy(path) as f:
                t2 = time.perf_counter()
                first = f[f.names[0]]
                del first
            t3 = time.perf_counter()
            report = verify(path, level="full")
            t4 = time.perf_counter()
            if not report.ok:
                raise RuntimeError(f"benchmark file failed verification: {report.failure}")
            if round_:      # round 0 warms the page cache and the allocator
                runs.append({"write_s": t1 - t0, "open_s": t2 - t1, "verify_s": t4 - t3})
            os.unlink(path)

    def pick(key: str, fn) -> float:
        return fn(r[key] for r in runs)

    return {
        "format": "aero", "size_bytes": nbytes, "tensors": tensors, "repeats": repeats,
        "options": {k: v for k, v in save_opts.items()},
        "write_gbps": nbytes / pick("write_s", min) / 1e9,
        "open_ms": pick("open_s", min) * 1e3,
        "verify_gbps": nbytes / pick("verify_s", min) / 1e9,
        "median": {"write_gbps": nbytes / pick("write_s", statistics.median) / 1e9,
                   "open_ms": pick("open_s", statistics.median) * 1e3,
                   "verify_gbps": nbytes / pick("verify_s", statistics.median) / 1e9},
        "cpus": os.cpu_count(),
        # other processes on a 2-core machine halve these numbers; report what was running
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
