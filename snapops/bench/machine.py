"""The machine's own floors, measured in one run: what every other suite's targets stand on.

- SHA-256 and BLAKE3 of one buffer on one core, and SHA-256 on two threads (hashlib releases
  the GIL): the hash passes the formats must make;
- a copy into memory the process has touched before, against the first touch of new anonymous
  memory: on a virtual machine every new page can cost a fault in the host as well (nested
  virtualization, or a host that takes freed pages back), which a copy into reused memory never
  pays;
- two composite floors, each on two threads over 32 MiB pieces: SHA-256 and two BLAKE3 passes
  (what a full verify of a sealed AERO generation hashes: the file against the MANIFEST, then
  every chunk and every tensor), and a copy into new memory followed by its SHA-256 (what a
  restore must do at least: git's object files hold the bytes in deflate blocks, so they are
  copied out, and hashed against the MANIFEST);
- a file written through the page cache and fsync'd, against the same bytes written with
  ``O_DIRECT`` (no page cache); the file read while not cached, and again from the page cache.

Each is the median of ``rounds`` after a warm-up, as MB/s and nanoseconds of one core per byte.

Example::

    result = run_machine(size=64 << 20, workdir=None)
    result["sha256_1core_MBps"], result["memory_first_touch_MBps"]
"""

from __future__ import annotations

import hashlib
import mmap
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable

import blake3
import numpy as np

from snapops.formats.workers import run_all

from ._measure import fmt_bytes, median, run_rounds

BLOCK = 4 << 20          # bytes per write or read call, a multiple of any O_DIRECT alignment


def _threads(buf: memoryview, work: Callable[[memoryview], object], count: int) -> None:
    step = -(-len(buf) // count)
    threads = [threading.Thread(target=work, args=(buf[i:i + step],))
               for i in range(0, len(buf), step)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


PIECE = 32 << 20         # a shard's size in the generation benches


def pieces(buf, size: int = PIECE) -> list[memoryview]:
    view = memoryview(buf).cast("B")
    return [view[i:i + size] for i in range(0, len(view), size)]


def hash_passes(buffers: list, passes: tuple[str, ...], threads: int = 2) -> None:
    """Every buffer through every pass (``sha256``, ``blake3``), buffers spread over
    ``threads`` threads: the hashing a verify must do, with nothing else in the way."""
    def work(buf) -> None:
        for name in passes:
            (hashlib.sha256(buf) if name == "sha256"
             else blake3.blake3(buf, max_threads=1)).digest()

    run_all(work, buffers, threads)


def fresh_copy_sha256(buffers: list, threads: int = 2) -> None:
    """Each buffer copied into new anonymous memory, then its SHA-256, on ``threads``
    threads: the least a restore does with every byte."""
    def work(buf) -> None:
        with mmap.mmap(-1, max(1, len(buf))) as fresh:
            view = memoryview(fresh)[:len(buf)]
            view[:] = buf
            hashlib.sha256(view).digest()
            view.release()

    run_all(work, buffers, threads)


def _first_touch(src: np.ndarray) -> None:
    with mmap.mmap(-1, len(src)) as fresh:
        view = np.frombuffer(fresh, np.uint8)
        np.copyto(view, src)
        del view


def _write(path: Path, data: memoryview, *, direct: bool) -> None:
    """A new file (the old one unlinked: its pages go back to the kernel), fsync'd."""
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600)
    try:
        for at in range(0, len(data), BLOCK):
            os.write(fd, data[at:at + BLOCK])
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path, into) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.readinto(into):
            pass


def _uncache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _direct_supported(folder: Path) -> bool:
    try:
        fd = os.open(folder / ".direct-probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:           # tmpfs and some network file systems have no O_DIRECT
        return False
    os.close(fd)
    return True


def run_machine(size: int, workdir: str | None = None, rounds: int = 3) -> dict:
    size = max(BLOCK, size // BLOCK * BLOCK)
    # page-aligned buffers (mmap), as O_DIRECT wants, touched once before any round
    src = np.frombuffer(mmap.mmap(-1, size), np.uint8)
    src[:] = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    view = memoryview(src)
    reused = np.empty_like(src)
    np.copyto(reused, src)
    scratch = memoryview(np.frombuffer(mmap.mmap(-1, BLOCK), np.uint8))
    out: dict = {"size": size, "rounds": rounds, "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-bench-") as tmp:
        path = Path(tmp) / "machine.bin"
        out["o_direct"] = _direct_supported(Path(tmp))
        operations = {
            "sha256_1core": lambda: _sha256(view),
            "sha256_2threads": lambda: _threads(view, _sha256, 2),
            "blake3_1core": lambda: blake3.blake3(view, max_threads=1).digest(),
            "memory_copy_reused": lambda: np.copyto(reused, src),
            "memory_first_touch": lambda: _first_touch(src),
            "sha256_2blake3_2threads": lambda: hash_passes(pieces(src),
                                                           ("sha256", "blake3", "blake3")),
            "fresh_copy_sha256_2threads": lambda: fresh_copy_sha256(pieces(src)),
            "disk_write_page_cache_fsync": lambda: _write(path, view, direct=False),
            **({"disk_write_o_direct_fsync": lambda: _write(path, view, direct=True)}
               if out["o_direct"] else {}),
            "disk_read_uncached": lambda: (_uncache(path), _read(path, scratch)),
            "disk_read_page_cache": lambda: _read(path, scratch),
        }
        runs = run_rounds(operations, rounds, memory=False)
    for name, kept in runs.items():
        out[f"{name}_MBps"] = size / median(kept).seconds / 1e6
    out["load_after"] = os.getloadavg()[0]
    return out


def _sha256(data: memoryview) -> None:
    hashlib.sha256(data).digest()


ROWS = (("sha256_1core_MBps", "SHA-256, one core"),
        ("sha256_2threads_MBps", "SHA-256, two threads"),
        ("blake3_1core_MBps", "BLAKE3, one core"),
        ("memory_copy_reused_MBps", "copy into memory touched before"),
        ("memory_first_touch_MBps", "copy into new memory (first touch)"),
        ("sha256_2blake3_2threads_MBps", "SHA-256 + 2 x BLAKE3, two threads"),
        ("fresh_copy_sha256_2threads_MBps", "new-memory copy + SHA-256, two threads"),
        ("disk_write_page_cache_fsync_MBps", "write through the page cache + fsync"),
        ("disk_write_o_direct_fsync_MBps", "write with O_DIRECT + fsync"),
        ("disk_read_uncached_MBps", "read, not in the page cache"),
        ("disk_read_page_cache_MBps", "read from the page cache"))


def render_machine(r: dict) -> str:
    lines = [f"machine bench: {fmt_bytes(r['size'])} per operation, median of {r['rounds']} "
             f"(load average {r['load_before']:.2f} -> {r['load_after']:.2f})",
             f"  {'operation':38s} {'MB/s':>8s}  {'ns/byte':>7s}"]
    for key, label in ROWS:
        if key in r:
            lines.append(f"  {label:38s} {r[key]:8.0f}  {1e3 / r[key]:7.2f}")
    if not r["o_direct"]:
        lines.append("  (O_DIRECT: not supported by the file system of --workdir)")
    return "\n".join(lines)
