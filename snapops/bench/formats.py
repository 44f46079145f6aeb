"""``snapops bench formats``: the binary formats (AERO, FOLD, PyCauset, FINF) on one state.

Each format's phases run round by round after one warm-up round (the first write into fresh
page cache is much slower on a new VM: the guest's memory is touched for the first time);
results give the best and the median. GB/s are 10**9 raw array bytes per second, MB/s 10**6,
times in milliseconds; writes include the fsync and the atomic rename.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from snapops.formats import aero, finf, fold, pycauset
from snapops.formats.model import Snapshot

from ._measure import flatten, machine, measure, model_state, run_rounds, seconds_stats

FORMAT_BENCHES = ("aero", "fold", "pycauset", "finf")


def run_formats(size: int, workdir: str | None = None, names: list[str] | None = None) -> dict:
    """Run the benchmarks of ``names`` (default all) on a state of ``size`` raw bytes."""
    results = {"machine": machine()}
    for name in names or FORMAT_BENCHES:
        results[name] = globals()[f"bench_{name}"](size, workdir)
    return results


def render_formats(r: dict) -> str:
    lines = [f"formats bench ({r['machine']['cpus']} CPUs, load {r['machine']['loadavg_1min']})"]
    for name, result in r.items():
        if name != "machine":
            lines.append(f"{name}:")
            lines.extend(f"  {line}" for line in flatten(result))
    return "\n".join(lines)


def _gbps(nbytes: int, seconds: list[float], pick) -> float:
    return nbytes / pick(seconds) / 1e9


def bench_aero(size: int, workdir: str | os.PathLike | None = None, *, repeats: int = 3
               ) -> dict:
    """``save``, ``open_lazy`` (+ one array + close) and ``verify(level="full")``.

    >>> bench_aero(1 << 20, "/tmp")["write_gbps"] > 0
    True
    """
    state = Snapshot(model_state(size, layers=64), {"model_name": "bench"})
    with tempfile.TemporaryDirectory(dir=workdir, prefix="aero-bench-") as tmp:
        path = Path(tmp) / "bench.aero"
        runs = run_rounds({"write": lambda: aero.save(state, path),
                           "open": lambda: _open_first(aero, path),
                           "verify": lambda: _check(aero.verify(path, level="full"))},
                          repeats, memory=False, after_round=lambda: path.unlink())
    s = {k: [m.seconds for m in v] for k, v in runs.items()}
    return {
        "format": "aero", "size_bytes": state.nbytes, "tensors": len(state.arrays),
        "repeats": repeats,
        "write_gbps": _gbps(state.nbytes, s["write"], min),
        "open_ms": min(s["open"]) * 1e3,
        "verify_gbps": _gbps(state.nbytes, s["verify"], min),
        "median": {"write_gbps": _gbps(state.nbytes, s["write"], statistics.median),
                   "open_ms": statistics.median(s["open"]) * 1e3,
                   "verify_gbps": _gbps(state.nbytes, s["verify"], statistics.median)},
        **machine(),
    }


def bench_fold(size: int, workdir: str | os.PathLike | None = None, *,
               workers: int | None = None, ecc_sample: int | None = None) -> dict:
    """Save (zstd level 3), load and verify, then the same with ``ecc="rs(32)"``; MB/s are
    raw (uncompressed) bytes per second. The first ``load`` gets fresh memory from the OS
    (the cost of a new process); ``read_again_preadv`` reuses the heap the first one freed.
    ``reedsolo_encode_MBps`` times the reedsolo backend on ``ecc_sample`` bytes, next to the
    numpy parity kernel snapops uses.

    >>> sorted(bench_fold(1 << 20, "/tmp"))[:3]
    ['arrays', 'cpu_seconds', 'ecc_backend']
    """
    state = model_state(size)
    raw = sum(a.nbytes for a in state.values())
    out: dict = {"raw_bytes": raw, "arrays": len(state), "workers": workers or "auto"}
    phases = {}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "bench.fold"
        for suffix, options in (("", {}), ("_rs32", {"ecc": "rs(32)"})):
            path.unlink(missing_ok=True)
            with measure() as w:
                info = fold.save(state, path, level=3, workers=workers, **options)
            out.setdefault("file_bytes", info.size)
            with measure() as r:
                loaded = fold.load(path, workers=workers)
            del loaded
            with measure() as v:
                _check(fold.verify(path, workers=workers))
            phases.update({f"write{suffix}": w.result, f"read{suffix}": r.result,
                           f"verify{suffix}": v.result})
            if not suffix:
                with measure() as again, fold.FoldFile.open(path, workers=workers,
                                                            use_mmap=False) as f:
                    f.load()
                phases["read_again_preadv"] = again.result
    out.update({f"{name}_MBps": m.mbps(raw) for name, m in phases.items()})
    out["read_peak_extra_beyond_arrays"] = max(0, phases["read"].peak_extra - raw)
    out["cpu_seconds"] = {name: m.cpu_seconds for name, m in phases.items()}
    out.update(_parity_rates(state, ecc_sample))
    return out


def _parity_rates(state: dict, sample: int | None) -> dict:
    from snapops.formats.fold import _ecc

    data = np.concatenate([a.reshape(-1).view(np.uint8) for a in state.values()])
    big = data[: 64 << 20].tobytes()
    with measure(memory=False) as m:
        _ecc.parity(big, 32)
    codec = _ecc._codec(32)
    backend, rate = "none", None
    if codec is not None:
        backend = type(codec).__module__
        sample = sample or (1 << 20 if backend.startswith("creedsolo") else 1 << 15)
        small = bytearray(data[:sample].tobytes())
        with measure(memory=False) as e:
            codec.encode(small)
        rate = e.result.mbps(len(small))
    return {"rs32_parity_numpy_MBps": m.result.mbps(len(big)), "ecc_backend": backend,
            "reedsolo_encode_MBps": rate}


def bench_pycauset(size: int, workdir: str | os.PathLike | None = None, *, repeats: int = 3,
                   updates: int = 20) -> dict:
    """``save``, ``open_lazy`` (+ one view + close), ``update_metadata`` (on the big file and on
    a 4 KiB one: both must be O(1) in the payload) and ``verify``; one float32 matrix, the
    peer-compatible ``raw_dense`` layout.

    >>> sorted(bench_pycauset(1 << 20, "/tmp")["update_ms"]["big"])   # update times in ms
    ['best', 'median']
    """
    state = Snapshot(model_state(size, layers=1, vectors=False), {"model_name": "bench"})
    with tempfile.TemporaryDirectory(dir=workdir, prefix="pycauset-bench-") as tmp:
        big, small = Path(tmp) / "big.pycauset", Path(tmp) / "small.pycauset"
        pycauset.save(Snapshot({"w": np.zeros((32, 32), np.float32)}), small)
        runs = run_rounds({"write": lambda: pycauset.save(state, big),
                           "open": lambda: _open_first(pycauset, big)},
                          repeats, memory=False, after_round=lambda: big.unlink())
        pycauset.save(state, big)
        update_big = _time_updates(lambda i: pycauset.update_metadata(
            big, {"provenance": {"verified": i, "pushed": f"origin/main@{i}"}}), updates)
        update_small = _time_updates(lambda i: pycauset.update_metadata(
            small, {"provenance": {"verified": i, "pushed": f"origin/main@{i}"}}), updates)
        with measure(memory=False) as v:
            _check(pycauset.verify(big))
        file_size = big.stat().st_size
    writes = [m.seconds for m in runs["write"]]
    return {
        "format": "pycauset", "size_bytes": state.nbytes, "file_size": file_size,
        "repeats": repeats,
        "write_gbps": _gbps(state.nbytes, writes, min),
        "write_gbps_median": _gbps(state.nbytes, writes, statistics.median),
        "open_ms": seconds_stats([m.seconds for m in runs["open"]]),
        "update_ms": {"big": seconds_stats(update_big), "small": seconds_stats(update_small),
                      "updates": updates},
        "verify_gbps": state.nbytes / v.result.seconds / 1e9,
        **machine(),
    }


def _time_updates(update, count: int) -> list[float]:
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        update(i)
        out.append(time.perf_counter() - t0)
    return out


def bench_finf(size: int, workdir: str | os.PathLike | None = None, *, repeats: int = 3
               ) -> dict:
    """``save`` (with and without MD5 checksums), ``open_lazy`` and ``update_tree`` (on the
    large file and on a small one with the same tree: its cost depends on the tree, not on the
    payload); ``baseline_write_fsync_gbps`` is one plain ``write`` + ``fsync`` of the same
    bytes, what the disk gives at that moment.

    >>> bench_finf(1 << 20, "/tmp")["write_gbps_no_checksum"] > 0
    True
    """
    meta = {"model_name": "bench", "step": 0}
    state = Snapshot(model_state(size, layers=64), meta)
    small = Snapshot(model_state(64 * 64, layers=64, cols=16), meta)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="finf-bench-") as tmp:
        big_path, small_path = Path(tmp) / "bench.finf", Path(tmp) / "small.finf"
        writes = run_rounds({
            "baseline": lambda: _plain_write(state, big_path),
            "raw": lambda: finf.save(state, big_path, checksum=False),
            "sum": lambda: finf.save(state, big_path, checksum=True),
        }, repeats, memory=False, after_round=lambda: big_path.unlink())
        finf.save(state, big_path, checksum=True)
        finf.save(small, small_path)
        opened = run_rounds({"open": lambda: _open_first(finf, big_path)}, repeats * 4,
                            memory=False)["open"]
        upd_big, modes_big = _finf_updates(big_path, repeats)
        upd_small, modes_small = _finf_updates(small_path, repeats)
        with measure(memory=False) as v:
            _check(finf.verify(big_path))
        with finf.FinfFile(big_path) as f:
            tree_bytes = f.sections.tree_end - f.sections.tree_start
    s = {k: [m.seconds for m in v] for k, v in writes.items()}
    opened_s = [m.seconds for m in opened]
    n = state.nbytes
    return {
        "format": "finf", "size_bytes": n, "arrays": len(state.arrays), "repeats": repeats,
        "write_gbps": _gbps(n, s["sum"], min),
        "write_gbps_no_checksum": _gbps(n, s["raw"], min),
        "baseline_write_fsync_gbps": _gbps(n, s["baseline"], min),
        "open_ms": min(opened_s) * 1e3,
        "update_ms_large": min(upd_big) * 1e3, "update_ms_small": min(upd_small) * 1e3,
        "update_modes": sorted(modes_big | modes_small),
        "verify_gbps": n / v.result.seconds / 1e9, "tree_bytes": tree_bytes,
        "median": {"write_gbps": _gbps(n, s["sum"], statistics.median),
                   "baseline_write_fsync_gbps": _gbps(n, s["baseline"], statistics.median),
                   "write_gbps_no_checksum": _gbps(n, s["raw"], statistics.median),
                   "open_ms": statistics.median(opened_s) * 1e3,
                   "update_ms_large": statistics.median(upd_big) * 1e3,
                   "update_ms_small": statistics.median(upd_small) * 1e3},
        **machine(),
    }


def _plain_write(state: Snapshot, path: Path) -> None:
    """The same bytes written by plain write() calls and one fsync: what the disk allows."""
    with open(path, "wb") as handle:
        for array in state.arrays.values():
            handle.write(np.ascontiguousarray(array).data)
        handle.flush()
        os.fsync(handle.fileno())


def _open_first(module, path: Path) -> None:
    """Open lazily, map the first array, close (the view is dropped before the close)."""
    with module.open_lazy(path) as f:
        first = f[f.names[0]]
        del first


def _finf_updates(path: Path, repeats: int) -> tuple[list[float], set[str]]:
    modes: set[str] = set()

    def update(i: int) -> None:
        modes.add(finf.update_tree(path, {"step": i + 1, "note": "x" * (i % 7)})["mode"])

    return _time_updates(update, repeats * 4 + 1)[1:], modes


def _check(report) -> None:
    if not report.ok:
        raise RuntimeError(f"benchmark file failed verification: {report.failure}")
