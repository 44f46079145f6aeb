"""``snapops bench formats`` and ``snapops bench review``: thin front ends over the
benchmarks each format / review module ships."""

from __future__ import annotations

import importlib

FORMAT_BENCHES = {
    "aero": ("snapops.formats.aero.bench", "bench_aero"),
    "fold": ("snapops.formats.fold.bench", "bench_fold"),
    "pycauset": ("snapops.formats.pycauset.bench", "bench_pycauset"),
    "finf": ("snapops.formats.finf.bench", "bench_finf"),
}


def run_formats(size: int, names: list[str], workdir: str | None = None) -> dict:
    results = {}
    for name in names:
        module, function = FORMAT_BENCHES[name]
        results[name] = getattr(importlib.import_module(module), function)(size, workdir)
    return results


def run_review(size: int, workdir: str | None = None) -> dict:
    from snapops.hooks.bench import bench_precommit
    from snapops.hooks.review_bench import bench_diff

    return {"pre_commit": bench_precommit(size, workdir), "diff": bench_diff(size, workdir)}


def flatten(value, prefix: str = "") -> list[str]:
    """Scalar results as ``key.sub: value`` lines (floats rounded), for the terminal."""
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            lines.extend(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return lines
    if isinstance(value, float):
        return [f"{prefix}: {value:.3g}"]
    if isinstance(value, (int, str, bool)) or value is None:
        return [f"{prefix}: {value}"]
    return []
