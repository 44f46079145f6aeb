"""Measuring helpers: wall time, CPU time and peak RSS above a baseline."""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass

import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


@dataclass
class Measurement:
    seconds: float
    cpu_seconds: float
    peak_extra: int  # peak RSS above the RSS at start

    def mbps(self, nbytes: int) -> float:
        return nbytes / self.seconds / 1e6


class measure:
    """Context manager sampling RSS every millisecond in a background thread."""

    def __enter__(self) -> "measure":
        self._stop = threading.Event()
        self.base = rss_bytes()
        self.peak = self.base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self._cpu = _cpu()
        self._t0 = time.perf_counter()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc) -> None:
        elapsed = time.perf_counter() - self._t0
        cpu = _cpu() - self._cpu
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.result = Measurement(elapsed, cpu, self.peak - self.base)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def model_state(size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A transformer-like state of about ``size`` raw bytes: f32 matrices plus small vectors."""
    rng = np.random.default_rng(seed)
    cols = 1024
    layers = max(1, size // (4 * cols * cols))
    rows = max(1, size // (4 * cols * layers))
    state = {}
    for i in range(layers):
        state[f"layer{i:03d}_w"] = rng.standard_normal((rows, cols), dtype=np.float32)
        state[f"layer{i:03d}_b"] = rng.standard_normal(cols, dtype=np.float32)
    state["step"] = np.array(1234, dtype=np.int64)
    return state


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"
