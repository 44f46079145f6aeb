"""Benchmark of armored age encryption and decryption (``snapops bench seal``)."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Callable

import pyrage

from ._stream import decrypt_io, encrypt_io


class _PatternReader:
    """``size`` bytes without holding them: one random MiB, repeated."""

    def __init__(self, size: int) -> None:
        self._left = size
        self._block = os.urandom(1 << 20)

    def read(self, n: int = -1) -> bytes:
        n = min(self._left, len(self._block) if n is None or n < 0 else n, len(self._block))
        self._left -= n
        return self._block[:n]


class _NullWriter:
    def write(self, data) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def _peak_rss_meter() -> tuple[str, Callable[[], int]]:
    """Start measuring peak resident memory; return (method, growth-in-bytes reader).

    Linux lets a process reset its peak-RSS mark (``clear_refs`` 5), which makes the peak of one
    operation measurable even after an earlier, bigger one; elsewhere getrusage may under-report.
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")

        def peak() -> int:
            status = Path("/proc/self/status").read_text()
            return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024

        method = "VmHWM"
    except OSError:
        import resource

        def peak() -> int:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

        method = "ru_maxrss"
    base = peak()
    return method, lambda: peak() - base


def _timed(call) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_armor(size_bytes: int, *, repeat: int = 1,
                folder: str | os.PathLike | None = None) -> dict:
    """Armored encrypt and decrypt of ``size_bytes``: best MB/s (10**6 bytes of plaintext per
    second) over ``repeat`` runs, by wall clock and by CPU time (steadier on a busy machine),
    and the peak extra resident memory.

    The ciphertext goes through a temporary file in ``folder``; the plaintext is generated and
    discarded on the fly, so the memory figure is what the pipeline itself holds.

    Example::

        bench_armor(256 * 2**20)["encrypt_mb_s"]
        # -> 402.3
    """
    identity = pyrage.x25519.Identity.generate()
    recipient = str(identity.to_public())
    best = {"encrypt": (float("inf"),) * 2, "decrypt": (float("inf"),) * 2}
    with tempfile.TemporaryDirectory(dir=folder, prefix="snapops-bench-") as tmp:
        path = Path(tmp) / "bench.age"
        method, peak = _peak_rss_meter()
        for _ in range(repeat):
            path.unlink(missing_ok=True)
            with open(path, "wb") as out:
                took = _timed(lambda: encrypt_io(_PatternReader(size_bytes), out, [recipient]))
            best["encrypt"] = tuple(map(min, best["encrypt"], took))
            with open(path, "rb") as src:
                took = _timed(lambda: decrypt_io(src, _NullWriter(), [identity]))
            best["decrypt"] = tuple(map(min, best["decrypt"], took))
        result = {"size_bytes": size_bytes, "armored_bytes": path.stat().st_size}
    for op, (wall, cpu) in best.items():
        result[f"{op}_mb_s"] = round(size_bytes / wall / 1e6, 1)
        result[f"{op}_cpu_mb_s"] = round(size_bytes / max(cpu, 1e-9) / 1e6, 1)
    result.update(peak_extra_bytes=peak(), memory_method=method)
    return result
