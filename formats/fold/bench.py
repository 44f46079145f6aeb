"""FOLD throughput for ``snapops bench formats`` (a measurement, never a test assertion).

Example::

    r = bench_fold(64 << 20, "/tmp")
    sorted(r)[:3]
    # -> ['cpu_seconds', 'ecc_backend', 'file_bytes']
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from . import _ecc
from . import FoldFile, load, save, verify


def bench_fold(size_bytes: int, workdir: str | os.PathLike | None = None, *,
               workers: int | None = None, ecc_sample: int | None = None) -> dict:
    """Save (zstd level 3), load and verify a model-like state of ``size_bytes``, then the
    same with ``ecc="rs(32)"``; MB/s are raw (uncompressed) bytes per second, wall clock,
    fsync included. The first ``load`` gets fresh memory from the OS (the cost of a new
    process); ``read_again`` reuses the heap the first one freed. ``reedsolo_encode_MBps``
    times the reedsolo backend (``creedsolo`` if importable) on ``ecc_sample`` bytes, for
    comparison with the numpy parity kernel snapops uses."""
    from snapops.bench._measure import measure, model_state

    state = model_state(size_bytes)
    raw = sum(a.nbytes for a in state.values())
    out: dict = {"raw_bytes": raw, "arrays": len(state), "workers": workers or "auto"}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "bench.fold"
        with measure() as w:
            info = save(state, path, level=3, workers=workers)
        out["file_bytes"] = info.size
        with measure() as r:
            loaded = load(path, workers=workers)
        del loaded
        with measure() as rp:
            with FoldFile.open(path, workers=workers, use_mmap=False) as f:
                loaded = f.load()
        del loaded
        with measure() as v:
            report = verify(path, workers=workers)
        if not report.ok:
            raise RuntimeError(f"benchmark file failed verification: {report.failure}")
        path.unlink()
        with measure() as we:
            save(state, path, level=3, ecc="rs(32)", workers=workers)
        with measure() as re_:
            load(path, workers=workers)
        with measure() as ve:
            verify(path, workers=workers)
    out.update(
        write_MBps=w.result.mbps(raw), read_MBps=r.result.mbps(raw),
        read_again_preadv_MBps=rp.result.mbps(raw),
        verify_MBps=v.result.mbps(raw), write_rs32_MBps=we.result.mbps(raw),
        read_rs32_MBps=re_.result.mbps(raw), verify_rs32_MBps=ve.result.mbps(raw),
        read_peak_extra_beyond_arrays=max(0, r.result.peak_extra - raw),
        cpu_seconds={"write": w.result.cpu_seconds, "read": r.result.cpu_seconds,
                     "read_again_preadv": rp.result.cpu_seconds,
                     "verify": v.result.cpu_seconds, "write_rs32": we.result.cpu_seconds,
                     "verify_rs32": ve.result.cpu_seconds},
    )
    out.update(_parity_rates(state, ecc_sample))
    return out


def _parity_rates(state: dict, sample: int | None) -> dict:
    data = np.concatenate([a.reshape(-1).view(np.uint8) for a in state.values()])
    big = data[: 64 << 20].tobytes()
    t = time.perf_counter()
    _ecc.parity(big, 32)
    numpy_rate = len(big) / (time.perf_counter() - t) / 1e6
    codec = _ecc._codec(32)
    backend, rate = "none", None
    if codec is not None:
        backend = type(codec).__module__
        sample = sample or (1 << 20 if backend.startswith("creedsolo") else 1 << 15)
        small = bytearray(data[:sample].tobytes())
        t = time.perf_counter()
        codec.encode(small)
        rate = len(small) / (time.perf_counter() - t) / 1e6
    return {"rs32_parity_numpy_MBps": numpy_rate, "ecc_backend": backend,
            "reedsolo_encode_MBps": rate}


def render_fold(r: dict) -> str:
    mib = r["raw_bytes"] / (1 << 20)
    lines = [f"FOLD bench: {mib:.0f} MiB raw in {r['arrays']} arrays "
             f"(file {r['file_bytes'] / (1 << 20):.0f} MiB)"]
    for key, label in [("write_MBps", "write, zstd level 3"), ("read_MBps", "read (load, mmap)"),
                       ("read_again_preadv_MBps", "read again (preadv, warm heap)"),
                       ("verify_MBps", "verify"), ("write_rs32_MBps", "write, zstd + rs(32)"),
                       ("read_rs32_MBps", "read, rs(32) file"),
                       ("verify_rs32_MBps", "verify, rs(32) parity checked"),
                       ("rs32_parity_numpy_MBps", "rs(32) parity kernel (numpy)"),
                       ("reedsolo_encode_MBps", f"rs(32) encode, {r['ecc_backend']}")]:
        if r.get(key) is not None:
            lines.append(f"  {label:<30}: {r[key]:8.1f} MB/s")
    return "\n".join(lines)
