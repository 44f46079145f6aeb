"""Benchmark of ``snapops diff`` (issue 5: two 1 GiB states at >= 300 MB/s on 2 cores).

Two scenarios on a transformer-like state (``snapops.bench._measure.model_state``) written as
row-blocked WTXT, the format the daemon commits:

- ``sparse``: 1% of the rows of every matrix changed (a partial update; most chunks are
  recognised as unchanged from their ch-line SHA-256 and only A is decoded for the norms);
- ``dense``: every value changed (a full training step; both files decoded everywhere).

MB/s is raw array bytes of one state divided by the wall time of the whole diff (open, index,
compare). Also measured: the same dense diff between two ``.npz`` files (generic path), and
peak memory above the start: anonymous (what the diff allocates) and RSS (which also counts
the page cache of the memory-mapped WTXT files).

    python -m snapops.hooks.review_bench --size 1GiB
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from snapops.bench._measure import fmt_bytes, measure, model_state
from snapops.formats import wtxt

from .review import diff_paths

TS = "2026-01-01T00:00:00Z"
TARGET_MBPS = 300


def changed_state(state: dict[str, np.ndarray], fraction: float, seed: int = 1
                  ) -> dict[str, np.ndarray]:
    """A copy of ``state`` with ``fraction`` of the rows of every 2-D array perturbed
    (fraction 1.0: every value of every float array)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, array in state.items():
        if array.dtype.kind != "f":
            out[name] = array
            continue
        new = array.copy()
        if fraction >= 1.0:
            new += np.float32(1e-3) * rng.standard_normal(new.shape, dtype=np.float32)
        elif new.ndim == 2:
            rows = rng.choice(new.shape[0], max(1, int(new.shape[0] * fraction)), replace=False)
            new[rows] += np.float32(1e-2)
        out[name] = new
    return out


def bench_diff(size_bytes: int, workdir: str | os.PathLike | None = None, *,
               threads: int = 2, npz: bool = True) -> dict:
    """Measure ``snapops diff`` on two states of about ``size_bytes`` raw bytes each."""
    state = model_state(size_bytes)
    raw = sum(a.nbytes for a in state.values())
    results: dict = {"raw_bytes": raw, "arrays": len(state), "threads": threads,
                     "target_MBps": TARGET_MBPS, "scenarios": {}}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-diff-bench-") as tmp:
        base = Path(tmp) / "a.wtxt"
        first = wtxt.save(state, base, gen=1, ts=TS, row_blocking=True, threads=threads)
        results["file_bytes"] = os.path.getsize(base)
        for label, fraction in (("sparse", 0.01), ("dense", 1.0)):
            target = Path(tmp) / f"b-{label}.wtxt"
            other = changed_state(state, fraction)
            wtxt.save(other, target, gen=2, ts=TS, row_blocking=True, threads=threads,
                      merkle_prev=first.merkle_this)
            if label == "dense" and npz:
                np.savez(Path(tmp) / "a.npz", **state)
                np.savez(Path(tmp) / "b.npz", **other)
            del other
            results["scenarios"][label] = _time_diff(base, target, raw, threads)
            target.unlink()
        if npz:
            results["scenarios"]["dense_npz"] = _time_diff(
                Path(tmp) / "a.npz", Path(tmp) / "b.npz", raw, threads)
    return results


def rss_anon() -> int:
    """Anonymous resident memory (heap, arrays), without the mapped snapshot files' page
    cache, which RSS also counts and the kernel reclaims at will."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class _AnonPeak:
    def __enter__(self) -> "_AnonPeak":
        self.base = self.peak = rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_anon())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())


def _time_diff(a: Path, b: Path, raw: int, threads: int) -> dict:
    with _AnonPeak() as anon, measure() as m:
        report = diff_paths(a, b, threads=threads)
    c = report.counts()
    return {"seconds": m.result.seconds, "MBps": m.result.mbps(raw),
            "cpu_seconds": m.result.cpu_seconds, "peak_rss_extra": m.result.peak_extra,
            "peak_anon_extra": anon.peak - anon.base,
            "blocks": c["blocks"], "blocks_changed": c["blocks_changed"],
            "meets_target": m.result.mbps(raw) >= TARGET_MBPS}


def render_diff_bench(r: dict) -> str:
    lines = [f"snapops diff bench: 2 x {fmt_bytes(r['raw_bytes'])} raw in {r['arrays']} arrays "
             f"(WTXT file {fmt_bytes(r.get('file_bytes', 0))}), {r['threads']} threads"]
    for name, s in r["scenarios"].items():
        lines.append(f"  {name:10s}: {s['MBps']:7.0f} MB/s  {s['seconds']:6.2f} s  cpu "
                     f"{s['cpu_seconds']:6.2f} s  peak extra memory "
                     f"{fmt_bytes(s['peak_anon_extra'])} (RSS incl. mapped files "
                     f"{fmt_bytes(s['peak_rss_extra'])})  "
                     f"blocks {s['blocks_changed']}/{s['blocks']}  "
                     f"(target >= {r['target_MBps']} MB/s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from snapops.cli._common import parse_size

    parser = argparse.ArgumentParser(prog="python -m snapops.hooks.review_bench",
                                     description="Throughput of snapops diff.",
                                     epilog="example: python -m snapops.hooks.review_bench "
                                            "--size 1GiB")
    parser.add_argument("--size", type=parse_size, default=parse_size("256MiB"))
    parser.add_argument("--workdir")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-npz", action="store_true", help="skip the .npz scenario")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = bench_diff(args.size, args.workdir, threads=args.threads, npz=not args.no_npz)
    print(json.dumps(result, indent=2) if args.json else render_diff_bench(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
