"""``snapops bench pipeline``: what snapshots cost the training loop, and how fast they land.

Measured in one run: request() on the training thread next to one memcpy of the state; WAL
append latency; a numpy training loop's slowdown while snapshotting every 10 steps with the
daemon running; request-to-pushed latency to a git daemon on 127.0.0.1; daemon peak memory.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from snapops.daemon.client import WAL_NAME, Snapshotter
from snapops.daemon.lifecycle import PUSHED
from snapops.daemon.wal import Wal, WalReader

from ._measure import fmt_bytes, model_state


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def request_cost(state: dict[str, np.ndarray], folder: Path) -> dict:
    copies = {k: np.empty_like(v) for k, v in state.items()}

    def memcpy():
        for k, v in state.items():
            np.copyto(copies[k], v)

    memcpy()
    baseline = _median_time(memcpy, 9)
    times = []
    with Snapshotter(folder / "spool-req", max_in_flight=2) as snap:
        for gen in range(1, 13):
            t0 = time.perf_counter()
            snap.request(state, gen)
            times.append(time.perf_counter() - t0)
            snap.flush()  # time the request alone, not its competition with the spool write
    steady = statistics.median(times[2:])
    return {"state_bytes": sum(a.nbytes for a in state.values()), "memcpy_s": baseline,
            "request_s": steady, "ratio": steady / baseline, "first_request_s": times[0]}


def wal_latency(folder: Path, count: int = 1000) -> dict:
    wal = Wal(folder / "wal-bench.log")
    times = []
    for gen in range(count):
        t0 = time.perf_counter()
        wal.append("REQ", gen, arrays=3, bytes=1 << 26)
        times.append(time.perf_counter() - t0)
    wal.close()
    times.sort()
    return {"count": count, "p50_ms": times[count // 2] * 1e3,
            "p99_ms": times[int(count * 0.99)] * 1e3, "max_ms": times[-1] * 1e3}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Stack:
    """A git daemon on 127.0.0.1 and a snapops daemon pushing to it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        served = folder / "served"
        served.mkdir()
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(served / "snap.git")],
                       check=True)
        # a server for big blobs keeps pushed packs (no zlib-6 explosion into loose objects)
        subprocess.run(["git", "-C", str(served / "snap.git"), "config", "receive.unpackLimit",
                        "1"], check=True)
        self.port = _free_port()
        self.git = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={served}", "--export-all",
             "--enable=receive-pack", "--listen=127.0.0.1", f"--port={self.port}", str(served)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        config = folder / "snapops.toml"
        config.write_text(f"""[daemon]\npoll_interval = 0.2\n[snapshot]\nrun = "bench"\n
[repo]\npath = "repo"\n[[repo.remote]]\nname = "net"\nurl = "git://127.0.0.1:{self.port}/snap.git"\n""")
        self.log = open(folder / "daemon.log", "ab")
        self.daemon = subprocess.Popen([sys.executable, "-m", "snapops", "daemon", "run",
                                        "--config", str(config)], stdout=self.log, stderr=self.log)
        self.reader = WalReader(folder / "spool" / WAL_NAME)
        self.peaks: dict[str, int] = {}

    def wait_pushed(self, gen: int, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sample()
            if any(r.event == PUSHED and r.gen == gen for r in self.reader.read_new()):
                return time.monotonic()
            if self.daemon.poll() is not None:
                raise RuntimeError(f"daemon exited; see {self.folder / 'daemon.log'}")
            time.sleep(0.02)
        raise RuntimeError(f"gen {gen} not pushed within {timeout}s")

    def sample(self) -> None:
        """Track the daemon's peak anonymous and file-backed (mmap'd spool) memory."""
        try:
            with open(f"/proc/{self.daemon.pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f)
        except OSError:
            return
        for key in ("RssAnon", "RssFile", "VmRSS"):
            value = int(fields.get(key, "0 kB").split()[0]) * 1024
            self.peaks[key] = max(self.peaks.get(key, 0), value)

    def close(self) -> None:
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(120)
        self.log.close()
        os.killpg(self.git.pid, signal.SIGTERM)
        self.git.wait(30)


def train(state: dict[str, np.ndarray], steps: int, snap: Snapshotter | None, gen0: int) -> float:
    """A numpy loop touching every weight each step (SGD-like updates plus a matmul)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 1024), dtype=np.float32)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        for name, w in state.items():
            if w.ndim == 2:
                grad = x[:, :w.shape[0]].T @ (x[:, :w.shape[0]] @ w) * 1e-6
                w -= grad
        if snap is not None and step % 10 == 0:
            snap.request(state, gen0 + step // 10)
    return time.perf_counter() - t0


def run_pipeline(size: int, steps: int = 60, workdir: str | None = None,
                 rounds: int = 3) -> dict:
    state = model_state(size)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-bench-") as tmp:
        folder = Path(tmp)
        result = {"request": request_cost(state, folder), "wal": wal_latency(folder)}
        stack = _Stack(folder)
        try:
            with Snapshotter(folder / "spool", max_in_flight=2) as snap:
                t0 = time.monotonic()
                snap.request(state, 1)
                latency = stack.wait_pushed(1) - t0
                # This VM's speed drifts by tens of percent: alternate plain and snapshotting
                # runs and compare medians.
                plain, loaded, gen0 = [], [], 100
                for _ in range(rounds):
                    plain.append(train(state, steps, None, 0))
                    loaded.append(train(state, steps, snap, gen0))
                    gen0 += steps // 10 + 1
                last = gen0 - 1
            stack.wait_pushed(last)
            base, with_snaps = statistics.median(plain), statistics.median(loaded)
            result["loop"] = {"steps": steps, "rounds": rounds, "plain_s": base,
                              "with_snapshots_s": with_snaps, "slowdown": with_snaps / base - 1,
                              "plain_runs": plain, "snapshot_runs": loaded}
            result["latency"] = {"request_to_pushed_s": latency}
            result["daemon_peak"] = stack.peaks
        finally:
            stack.close()
    result["state_bytes"] = sum(a.nbytes for a in state.values())
    return result


def render_pipeline(r: dict) -> str:
    q, w, loop = r["request"], r["wal"], r["loop"]
    return "\n".join([
        f"pipeline bench, state {fmt_bytes(r['state_bytes'])}:",
        f"  request() on the training thread: {q['request_s'] * 1e3:.1f} ms vs one memcpy "
        f"{q['memcpy_s'] * 1e3:.1f} ms = {q['ratio']:.2f}x (target <= 1.3x; first request "
        f"{q['first_request_s'] * 1e3:.1f} ms allocates the pinned buffers)",
        f"  WAL append over {w['count']}: p50 {w['p50_ms']:.3f} ms, p99 {w['p99_ms']:.3f} ms "
        f"(target p99 < 1 ms)",
        f"  training loop, {loop['steps']} steps, snapshot every 10 with the daemon running "
        f"(median of {loop['rounds']} alternating runs): {loop['plain_s']:.2f}s -> "
        f"{loop['with_snapshots_s']:.2f}s = {loop['slowdown'] * 100:+.1f}% (target < 5%)",
        f"  request -> pushed to git://127.0.0.1: {r['latency']['request_to_pushed_s']:.2f} s "
        f"(target < 5 s)",
        f"  daemon peak memory: {fmt_bytes(r['daemon_peak'].get('VmRSS', 0))} resident, of which "
        f"{fmt_bytes(r['daemon_peak'].get('RssAnon', 0))} anonymous and up to "
        f"{fmt_bytes(r['daemon_peak'].get('RssFile', 0))} file pages (the mmap'd spool and "
        f"libraries) (target < 2x the state = {fmt_bytes(2 * r['state_bytes'])})",
    ])
