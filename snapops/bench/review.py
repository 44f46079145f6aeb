"""``snapops bench review``: the hooks and the generation verifier on a sealed generation
(:mod:`snapops.bench.generations`), and ``snapops diff``.

Diff: two transformer-like states as row-blocked WTXT (what the daemon commits): ``sparse``
(1% of the rows of every matrix changed: most chunks are recognised as unchanged from their
ch-line SHA-256) and ``dense`` (every value changed), and the dense pair as ``.npz``. MB/s is
raw array bytes of one state over the wall time of the whole diff (open, index, compare); peak
memory is anonymous (what the diff allocates) and RSS (which also counts the page cache of the
mapped files).

``--manifest-only``: the generation review from two MANIFESTs alone (:func:`bench_manifest_review`),
what a CI job on a clone without the weights does, for ``--tensors`` tensors.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from snapops.formats import wtxt
from snapops.hooks.review import diff_paths

from ._measure import fmt_bytes, machine, measure, model_state

TS = "2026-01-01T00:00:00Z"
DIFF_TARGET_MBPS = 300
PRECOMMIT_TARGET_S = 2.0
WTXT_PER_RAW = 1.39  # WTXT bytes per raw f32 byte (base64 4/3, line parity, chunk lines)


def run_review(size: int, workdir: str | None = None, threads: int = 2,
               manifest_only: bool = False, tensors: int = 1000,
               rounds: int | None = None) -> dict:
    """``rounds``: timed rounds, best kept (default 5 for the MANIFEST review, 3 for each hook
    process)."""
    from .generations import run_generations

    if manifest_only:
        return {"machine": machine(),
                "manifest": bench_manifest_review(tensors, workdir, rounds=rounds or 5)}
    return {"machine": machine(),
            "generations": run_generations(size, workdir, repeat=rounds or 3),
            "diff": bench_diff(size, workdir, threads=threads)}


def render_review(r: dict) -> str:
    from .generations import render_generations

    load = f"(load average {r['machine']['loadavg_1min']} at the start)"
    if "manifest" in r:
        return "\n".join([render_manifest_review(r["manifest"]), load])
    return "\n".join([render_generations(r["generations"]), render_diff(r["diff"]), load])


MANIFEST_REVIEW_TARGET_S = 1.0


def bench_manifest_review(tensors: int, workdir: str | os.PathLike | None = None, *,
                          rounds: int = 5) -> dict:
    """Two generations of ``tensors`` small tensors written by the generation writer (AERO,
    statistics in the MANIFEST), one step apart with a few tensors scaled; then, best of
    ``rounds``: parsing one MANIFEST (the reference), the review of the two from their
    MANIFESTs (read, compare, Markdown and JSON rendered), the heatmap PNG, and ``snapops diff
    A B --manifest-only --format md`` as a fresh process next to ``snapops --version``."""
    import subprocess
    import sys

    from snapops.formats.generation.manifest import parse_manifest
    from snapops.formats.generation.write import GenerationSpec, write_generation
    from snapops.hooks.review import (
        plot_generation, render_generation_json, render_generation_markdown, review_paths,
    )

    from ._measure import best, run_rounds

    rng = np.random.default_rng(0)
    state = {f"layers.{i // 4}.{('attn', 'mlp', 'norm', 'bias')[i % 4]}.weight":
             rng.standard_normal((16, 16)).astype(np.float32) for i in range(tensors)}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-review-bench-") as tmp:
        roots = [Path(tmp) / "a", Path(tmp) / "b"]
        spec = GenerationSpec(run="bench", format="aero")
        first = write_generation(roots[0], spec, 1, TS, state)
        step = {n: a + np.float32(1e-3) for n, a in state.items()}
        for name in list(step)[::97]:
            step[name] = step[name] * np.float32(50)
        write_generation(roots[1], spec, 2, TS, step, first.data)
        folders = [os.fspath(r / "snapshots" / "bench") for r in roots]
        data = (Path(folders[1]) / "MANIFEST").read_bytes()

        def review_once():
            review = review_paths(*folders, manifest_only=True)
            render_generation_markdown(review)
            render_generation_json(review)
            return review

        png = Path(tmp) / "review.png"
        runs = run_rounds({"parse": lambda: parse_manifest(data),
                           "review": review_once,
                           "png": lambda: plot_generation([review_once()], png)},
                          rounds, memory=False)
        exe = [sys.executable, "-m", "snapops"]
        cli = _best_seconds(exe + ["diff", *folders, "--manifest-only", "--format", "md"],
                            rounds, subprocess)
        startup = _best_seconds(exe + ["--version"], rounds, subprocess)
        review = review_once()
    out = {"tensors": tensors, "manifest_bytes": len(data), "rounds": rounds,
           "anomalies": len(review.anomalies),
           "target_seconds": MANIFEST_REVIEW_TARGET_S, "cli_seconds": cli,
           "startup_seconds": startup}
    for name, kept in runs.items():
        out[f"{name}_seconds"] = best(kept).seconds
    out["meets_target"] = out["review_seconds"] < MANIFEST_REVIEW_TARGET_S
    return out


def _best_seconds(cmd: list[str], rounds: int, subprocess) -> float:
    import time

    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def render_manifest_review(r: dict) -> str:
    parse = r["parse_seconds"]
    return "\n".join([
        f"generation review from two MANIFESTs alone: {r['tensors']} tensors "
        f"(MANIFEST {fmt_bytes(r['manifest_bytes'])}), {r['anomalies']} anomalies, best of "
        f"{r['rounds']}",
        f"  parse one MANIFEST (reference)  : {parse * 1e3:8.1f} ms",
        f"  review (read 2, compare, md+json): {r['review_seconds'] * 1e3:8.1f} ms "
        f"= {r['review_seconds'] / parse:.1f}x the parse  (target < "
        f"{r['target_seconds']:g} s: {'met' if r['meets_target'] else 'MISSED'})",
        f"  heatmap PNG (incl. the review)   : {r['png_seconds'] * 1e3:8.1f} ms",
        f"  snapops diff --manifest-only, as a process: {r['cli_seconds'] * 1e3:8.1f} ms "
        f"(snapops --version: {r['startup_seconds'] * 1e3:.1f} ms)"])


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


def bench_diff(size: int, workdir: str | os.PathLike | None = None, *, threads: int = 2,
               npz: bool = True) -> dict:
    """``snapops diff`` on two states of about ``size`` raw bytes each (see module docstring)."""
    state = model_state(size)
    raw = sum(a.nbytes for a in state.values())
    results: dict = {"raw_bytes": raw, "arrays": len(state), "threads": threads,
                     "target_MBps": DIFF_TARGET_MBPS, "scenarios": {}}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-diff-bench-") as tmp:
        folder = Path(tmp)
        base = folder / "a.wtxt"
        first = wtxt.save(state, base, gen=1, ts=TS, row_blocking=True, threads=threads)
        results["file_bytes"] = os.path.getsize(base)
        for label, fraction in (("sparse", 0.01), ("dense", 1.0)):
            target = folder / f"b-{label}.wtxt"
            other = changed_state(state, fraction)
            wtxt.save(other, target, gen=2, ts=TS, row_blocking=True, threads=threads,
                      merkle_prev=first.merkle_this)
            if label == "dense" and npz:
                np.savez(folder / "a.npz", **state)
                np.savez(folder / "b.npz", **other)
            del other
            results["scenarios"][label] = _time_diff(base, target, raw, threads)
            target.unlink()
        if npz:
            results["scenarios"]["dense_npz"] = _time_diff(folder / "a.npz", folder / "b.npz",
                                                           raw, threads)
    return results


def _time_diff(a: Path, b: Path, raw: int, threads: int) -> dict:
    with measure() as m:
        report = diff_paths(a, b, threads=threads)
    c = report.counts()
    r = m.result
    return {"seconds": r.seconds, "MBps": r.mbps(raw), "cpu_seconds": r.cpu_seconds,
            "peak_rss_extra": r.peak_extra, "peak_anon_extra": r.peak_anon_extra,
            "blocks": c["blocks"], "blocks_changed": c["blocks_changed"],
            "meets_target": r.mbps(raw) >= DIFF_TARGET_MBPS}


def render_diff(r: dict) -> str:
    lines = [f"snapops diff: 2 x {fmt_bytes(r['raw_bytes'])} raw in {r['arrays']} arrays "
             f"(WTXT file {fmt_bytes(r.get('file_bytes', 0))}), {r['threads']} threads"]
    for name, s in r["scenarios"].items():
        lines.append(f"  {name:10s}: {s['MBps']:7.0f} MB/s  {s['seconds']:6.2f} s  cpu "
                     f"{s['cpu_seconds']:6.2f} s  peak extra memory "
                     f"{fmt_bytes(s['peak_anon_extra'])} (RSS incl. mapped files "
                     f"{fmt_bytes(s['peak_rss_extra'])})  "
                     f"blocks {s['blocks_changed']}/{s['blocks']}  "
                     f"(target >= {r['target_MBps']} MB/s)")
    return "\n".join(lines)
