"""The one measuring helper of ``snapops bench``: wall and CPU time, peak memory above a
baseline, rounds with a warm-up, timed child processes, and the one state generator.

Every suite measures through ``measure`` (or ``run_rounds`` / ``time_command`` built on the
same clocks) so that all numbers mean the same thing: MB/s are 10**6 raw array bytes per wall
second, CPU seconds are user + system of this process (all threads), peak memory is resident
memory above the value at the start of the measurement.

>>> with measure() as m:
...     _ = sum(range(10**6))
>>> m.result.seconds > 0
True
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident memory of this process (includes mapped file pages)."""
    return _statm()[0]


def rss_anon() -> int:
    """Anonymous resident memory (heap, arrays): without the page cache of mapped files,
    which RSS also counts and the kernel reclaims at will."""
    return _statm()[1]


def _reset_rss_high_water_mark() -> bool:
    """Set the kernel's peak-RSS record (VmHWM) of this process to its current RSS
    (``/proc/self/clear_refs``, Linux 4.0+); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_high_water_mark() -> int:
    """The kernel's record of this process's peak RSS since the last reset, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def _statm() -> tuple[int, int]:
    """(resident, resident minus file-backed and shared pages) in bytes, from one read."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return int(fields[1]) * _PAGE, (int(fields[1]) - int(fields[2])) * _PAGE


@dataclass
class Measurement:
    seconds: float
    cpu_seconds: float
    peak_extra: int = 0       # peak RSS above the RSS at start
    peak_anon_extra: int = 0  # peak anonymous memory above the start

    def mbps(self, nbytes: int) -> float:
        return nbytes / self.seconds / 1e6


# Samples /proc/PID/statm every PERIOD seconds until its stdin becomes readable (a line, or
# EOF when the measured process dies); prints the peak resident and anonymous page counts.
# Nice 5, not 19: with busy threads on every core, the kernel's EEVDF scheduler delays a
# nice-19 task's wake-up by tens of milliseconds (5 of 40 peaks of 50 ms missed, none at 5).
_SAMPLER = """
import os, select, sys
os.nice(5)
path, period = sys.argv[1], float(sys.argv[2])
peak = anon = 0
def update():
    global peak, anon
    with open(path) as f:
        fields = f.read().split()
    peak, anon = max(peak, int(fields[1])), max(anon, int(fields[1]) - int(fields[2]))
update()
print("ready", flush=True)
while not select.select([sys.stdin], [], [], period)[0]:
    update()
update()
print(peak, anon, flush=True)
"""


class measure:
    """Context manager: wall and CPU time; with ``memory=True`` (default) also peak RSS (the
    kernel's own high-water mark, exact) and peak anonymous memory, sampled every 5 ms by a
    child process at nice 5 reading ``/proc/PID/statm``. A sampling thread of this process
    took the GIL every 2 ms and slowed a two-thread WTXT load by 7-10%; this sampler's cost
    is below the noise. Use
    ``memory=False`` for millisecond-scale operations (starting the sampler takes tens of
    milliseconds, before the clocks start)."""

    def __init__(self, memory: bool = True) -> None:
        self.memory = memory

    def __enter__(self) -> "measure":
        self.base, self.anon_base = _statm() if self.memory else (0, 0)
        self.peak, self.anon_peak = self.base, self.anon_base
        self._sampler = None
        self._high_water = self.memory and _reset_rss_high_water_mark()
        if self.memory:
            self._sampler = subprocess.Popen(
                [sys.executable, "-I", "-c", _SAMPLER, f"/proc/{os.getpid()}/statm", "0.005"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if self._sampler.stdout.readline() != "ready\n":
                self._sampler.kill()
                self._sampler.wait()
                raise RuntimeError("the memory sampler of `snapops bench` did not start")
        self._cpu = cpu_seconds()
        self._t0 = time.perf_counter()
        return self

    def _update_peaks(self, rss: int, anon: int) -> None:
        self.peak, self.anon_peak = max(self.peak, rss), max(self.anon_peak, anon)

    def __exit__(self, *exc) -> None:
        elapsed = time.perf_counter() - self._t0
        cpu = cpu_seconds() - self._cpu
        if self._sampler is not None:
            self._update_peaks(*_statm())
            out, _ = self._sampler.communicate("stop\n", timeout=30)
            pages = out.split()
            if len(pages) != 2 or not all(v.isdigit() for v in pages):
                raise RuntimeError(f"the memory sampler of `snapops bench` failed: {out!r}")
            self._update_peaks(int(pages[0]) * _PAGE, int(pages[1]) * _PAGE)
            if self._high_water:
                self._update_peaks(_rss_high_water_mark(), 0)
        self.result = Measurement(elapsed, cpu, self.peak - self.base,
                                  self.anon_peak - self.anon_base)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def machine_busy_seconds(stat: str = "/proc/stat") -> float | None:
    """CPU-seconds every core of the machine has spent busy since boot, all processes
    together (user, nice, system, irq, softirq; not idle, not I/O wait, not the time a
    hypervisor stole); None where ``/proc/stat`` cannot be read.

    >>> isinstance(machine_busy_seconds(), float)
    True
    """
    try:
        with open(stat, encoding="ascii") as f:
            fields = f.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if fields[0] != "cpu":
        return None
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


_observers: list[Callable[[int], object]] = []   # progress bars of `snapops bench`


@contextlib.contextmanager
def reporting_to(update: Callable[[int], object] | None) -> Iterator[None]:
    """While open, every measured operation of :func:`run_rounds` advances ``update`` by one
    (what ``snapops bench`` draws on a terminal); None: nothing to report to."""
    if update is not None:
        _observers.append(update)
    try:
        yield
    finally:
        if update is not None:
            _observers.remove(update)


def run_rounds(operations: dict[str, Callable[[], object]], rounds: int, *, warmup: int = 1,
               memory: bool = True, after_round: Callable[[], object] | None = None
               ) -> dict[str, list[Measurement]]:
    """Run every operation once per round, interleaved (so drift of a shared machine hits
    them alike), then ``after_round`` (not timed); the first ``warmup`` rounds warm the page
    cache and the allocator and are not kept. Returns the kept measurements per operation.

    >>> runs = run_rounds({"sum": lambda: sum(range(1000))}, 3, memory=False)
    >>> len(runs["sum"])
    3
    """
    kept: dict[str, list[Measurement]] = {name: [] for name in operations}
    for round_ in range(warmup + rounds):
        for name, operation in operations.items():
            with measure(memory) as m:
                operation()
            if round_ >= warmup:
                kept[name].append(m.result)
            for update in _observers:
                update(1)
        if after_round is not None:
            after_round()
    return kept


def median(runs: list[Measurement]) -> Measurement:
    """The run of median wall time (CPU and memory of that same run)."""
    ordered = sorted(runs, key=lambda m: m.seconds)
    return ordered[(len(ordered) - 1) // 2]


def best(runs: list[Measurement]) -> Measurement:
    return min(runs, key=lambda m: m.seconds)


def time_command(cmd: list[str], cwd, repeat: int = 3
                 ) -> tuple[float, subprocess.CompletedProcess]:
    """Best of ``repeat`` wall times of a child process (the machine is shared; the minimum
    is the cost), and the last run's result."""
    fastest, proc = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        fastest = min(fastest, time.perf_counter() - start)
    return fastest, proc


def seconds_stats(values: list[float]) -> dict:
    """Best and median of wall times, in milliseconds."""
    return {"best": min(values) * 1e3, "median": statistics.median(values) * 1e3}


def machine() -> dict:
    """What the numbers depend on: CPUs and the 1-minute load average now."""
    return {"cpus": os.cpu_count(), "loadavg_1min": round(os.getloadavg()[0], 2)}


def model_state(size: int, seed: int = 0, *, cols: int = 1024, layers: int | None = None,
                vectors: bool = True) -> dict[str, np.ndarray]:
    """The benchmarks' state: a transformer-like set of float32 ``(rows, cols)`` matrices of
    about ``size`` raw bytes in total (4 MiB each by default), a bias vector per matrix and a
    scalar step. ``layers=1, vectors=False`` gives one matrix.

    >>> sorted(model_state(8 << 20))[:2]
    ['layer000_b', 'layer000_w']
    """
    rng = np.random.default_rng(seed)
    layers = layers or max(1, size // (4 * cols * cols))
    rows = max(1, size // (4 * cols * layers))
    state = {}
    for i in range(layers):
        state[f"layer{i:03d}_w"] = rng.standard_normal((rows, cols), dtype=np.float32)
        if vectors:
            state[f"layer{i:03d}_b"] = rng.standard_normal(cols, dtype=np.float32)
    if vectors:
        state["step"] = np.array(1234, dtype=np.int64)
    return state


def fmt_bytes(n: float) -> str:
    try:
        n = float(n) if abs(n) >= 1024 else n
    except OverflowError:               # an int beyond any float: no real size
        return "-"
    if not math.isfinite(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


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
