"""``snapops bench pipeline``: what snapshots cost the training loop, and how fast they land.

Measured in one run: request() on the training thread next to one memcpy of the state; WAL
append latency; a numpy training loop's slowdown while snapshotting every 10 steps with the
daemon running (at its configured niceness), and the request-to-pushed latency of those
snapshots under that load; request-to-pushed latency to a git daemon on 127.0.0.1 when idle;
the daemon's CPU share while idle; after an outage of the remote (a dense generation every few
seconds meanwhile), how fast the backlog drains against the push rate of a single generation
measured just before; daemon peak memory. The loop's plain runs start only once the daemon
has landed the snapshots of the run before, and the servers (git daemon; giftless with
``--store lfs``) run at nice 19: they stand in for other hosts.
"""

from __future__ import annotations

import contextlib
import json
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
from snapops.daemon.lifecycle import COMMITTED, DROPPED, PUSHED
from snapops.daemon.wal import Wal, WalReader
from snapops.formats.gitcmd import run_git

from ._measure import fmt_bytes, model_state
from .storage import FORMAT

# The git daemon and giftless stand in for hosts elsewhere: below the training loop, so that
# the slowdown measured is what snapshotting costs the training machine itself.
SERVER_NICE = 19


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
    """A git daemon on 127.0.0.1 and a snapops daemon pushing to it; the remote can go away.
    ``store="lfs"``: shard bytes go to a giftless on 127.0.0.1 (keyframes and residuals)."""

    def __init__(self, folder: Path, nice: int | None = None, fmt: str = "wtxt",
                 store: str = "git") -> None:
        self.folder = folder
        self.servers = contextlib.ExitStack()
        lfs = ""
        if store == "lfs":
            from .giftless import serving, token
            from .storage import SECRET

            url = self.servers.enter_context(serving(folder, SECRET, nice=SERVER_NICE))
            (folder / "lfs.token").write_text(token(SECRET, "write") + "\n")
            lfs = f'store = "lfs"\nlfs_url = "{url}"\nlfs_token_file = "{folder / "lfs.token"}"\n'
        self.served = folder / "served"
        self.served.mkdir()
        run_git(["init", "-q", "--bare", "-b", "main", str(self.served / "snap.git")])
        # a server for big blobs keeps pushed packs (no zlib-6 explosion into loose objects)
        run_git(["config", "receive.unpackLimit", "1"], cwd=self.served / "snap.git")
        self.port = _free_port()
        self.git: subprocess.Popen | None = None
        self.start_remote()
        config = folder / "snapops.toml"
        niceness = "" if nice is None else f"nice = {nice}\n"
        config.write_text(f"""[daemon]\n{niceness}[snapshot]\nrun = "bench"\nformat = "{fmt}"\n
[repo]\npath = "repo"\n{lfs}[[repo.remote]]\nname = "net"\nurl = "git://127.0.0.1:{self.port}/snap.git"
[push]\nbackoff_max = 5.0\n""")
        self.log = open(folder / "daemon.log", "ab")
        self.daemon = subprocess.Popen([sys.executable, "-m", "snapops", "daemon", "run",
                                        "--config", str(config)], stdout=self.log, stderr=self.log)
        self.reader = WalReader(folder / "spool" / WAL_NAME)
        self.records: list = []
        self.peaks: dict[str, int] = {}

    def start_remote(self) -> None:
        self.git = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={self.served}", "--export-all",
             "--enable=receive-pack", "--listen=127.0.0.1", f"--port={self.port}",
             str(self.served)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=lambda: os.nice(SERVER_NICE))

    def stop_remote(self) -> None:
        if self.git is not None:
            os.killpg(self.git.pid, signal.SIGTERM)
            self.git.wait(30)
            self.git = None

    def poll(self) -> list:
        """Every WAL record so far (the new ones appended to ``records``)."""
        self.sample()
        self.records += self.reader.read_new()
        if self.daemon.poll() is not None:
            raise RuntimeError(f"daemon exited; see {self.folder / 'daemon.log'}")
        return self.records

    def wait_until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.poll()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout}s")
            time.sleep(0.02)

    def wait_pushed(self, gen: int, timeout: float = 600) -> float:
        self.wait_until(lambda rs: any(r.event == PUSHED and r.gen == gen for r in rs),
                        timeout, f"gen {gen} pushed")
        return time.monotonic()

    def status(self) -> dict:
        try:
            return json.loads((self.folder / "state" / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def cpu_seconds(self) -> float:
        """CPU time of the daemon and of its children it has waited for (git)."""
        with open(f"/proc/{self.daemon.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")

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
        self.stop_remote()
        self.servers.close()


def train(state: dict[str, np.ndarray], steps: int, snap: Snapshotter | None, gen0: int,
          requested: dict[int, float] | None = None) -> float:
    """A numpy loop touching every weight each step (SGD-like updates plus a matmul);
    ``requested`` collects the unix time of each snapshot request."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 1024), dtype=np.float32)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        for name, w in state.items():
            if w.ndim == 2:
                grad = x[:, :w.shape[0]].T @ (x[:, :w.shape[0]] @ w) * 1e-6
                w -= grad
        if snap is not None and step % 10 == 0:
            if requested is not None:
                requested[gen0 + step // 10] = time.time()
            snap.request(state, gen0 + step // 10)
    return time.perf_counter() - t0


def _landed(stack: _Stack, gens, timeout: float = 1800) -> dict[int, str]:
    """Wait until every one of ``gens`` is pushed or dropped; gen -> its final event."""
    wanted = set(gens)

    def done(records) -> bool:
        return wanted <= {r.gen for r in records if r.event in (PUSHED, DROPPED)}

    stack.wait_until(done, timeout, f"{len(wanted)} generations pushed or dropped")
    return {r.gen: r.event for r in stack.records if r.gen in wanted
            and r.event in (PUSHED, DROPPED)}


def loaded_latency(stack: _Stack, requested: dict[int, float]) -> dict:
    """Request-to-pushed of the snapshots taken while training kept the CPU busy."""
    landed = _landed(stack, requested)
    pushed_at = {r.gen: float(r.fields["t"]) for r in stack.records
                 if r.event == PUSHED and r.gen in requested}
    latencies = sorted(pushed_at[g] - requested[g] for g in pushed_at)
    return {"requested": len(requested), "pushed": len(pushed_at),
            "dropped": sum(e == DROPPED for e in landed.values()),
            "median_s": statistics.median(latencies) if latencies else None,
            "max_s": latencies[-1] if latencies else None}


def idle_share(stack: _Stack, seconds: float) -> dict:
    """The daemon's CPU share over ``seconds`` with nothing to do (everything pushed)."""
    time.sleep(2.0)  # the last status write and pushes settle
    before, start = stack.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    used, wall = stack.cpu_seconds() - before, time.monotonic() - start
    return {"seconds": wall, "cpu_s": used, "share": used / wall}


def _perturb(state: dict[str, np.ndarray], step: float) -> None:
    """A dense change: every float value moves (what a training step does)."""
    for array in state.values():
        if array.dtype.kind == "f":
            array += np.float32(step)


def _pushes(stack: _Stack, keep, what: str) -> list[dict]:
    """The successful pushes ``keep(push)`` selects, once the status file shows any."""
    def found() -> list[dict]:
        history = ((stack.status().get("push") or {}).get("net") or {}).get("history") or []
        return [p for p in history if p["ok"] and keep(p)]

    stack.wait_until(lambda _: found(), 60, f"status shows {what}")
    return found()


def _push_rate(pushes: list[dict]) -> dict:
    """Bytes, wall seconds from the first start to the last end, and their ratio."""
    size = sum(p["bytes"] for p in pushes)
    start = min(p["ended"] - p["seconds"] for p in pushes)
    seconds = max(p["ended"] for p in pushes) - start
    return {"pushes": len(pushes), "gens": sum(len(p["gens"]) for p in pushes),
            "bytes": size, "seconds": seconds, "rate": size / seconds if seconds else None}


def outage_drain(stack: _Stack, snap: Snapshotter, state: dict[str, np.ndarray], gen0: int,
                 outage: float, interval: float) -> dict:
    """A reference push of one dense generation; then the remote away for ``outage`` s with
    a dense generation requested every ``interval`` s; then how the backlog drains."""
    _perturb(state, 1e-3)
    snap.request(state, gen0)
    stack.wait_pushed(gen0)
    single = _push_rate(_pushes(stack, lambda p: p["gens"] == [gen0], "the reference push"))
    stack.stop_remote()
    gens, start = [], time.monotonic()
    while time.monotonic() - start < outage:
        gens.append(gen0 + 1 + len(gens))
        _perturb(state, 1e-3)
        snap.request(state, gens[-1])
        time.sleep(max(0.0, start + interval * len(gens) - time.monotonic()))
    snap.flush()
    stack.wait_until(lambda rs: set(gens) <= {r.gen for r in rs if r.event in (COMMITTED, DROPPED)},
                     1800, "the outage's generations committed")
    back = time.time()
    stack.start_remote()
    landed = _landed(stack, gens)
    pushed = [g for g, event in landed.items() if event == PUSHED]
    drained = []
    if pushed:
        _pushes(stack, lambda p: max(pushed) in p["gens"], "the drain's last push")
        drained = _pushes(stack, lambda p: p["ended"] >= back, "the drain")
    result = {"outage_s": outage, "interval_s": interval, "requested": len(gens),
              "committed": len(pushed),
              "single": single, "drain": _push_rate(drained) if drained else None,
              "back_to_drained_s": max(p["ended"] for p in drained) - back if drained else None}
    if drained and single["rate"] and result["drain"]["rate"]:
        result["ratio"] = result["drain"]["rate"] / single["rate"]
    return result


def run_pipeline(size: int, steps: int = 60, workdir: str | None = None, rounds: int = 3,
                 *, nice: int | None = None, idle: float = 60.0, outage: float = 60.0,
                 interval: float = 5.0, store: str = "git") -> dict:
    state = model_state(size)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-bench-") as tmp:
        folder = Path(tmp)
        result = {"request": request_cost(state, folder), "wal": wal_latency(folder)}
        stack = _Stack(folder, nice, fmt=FORMAT[store], store=store)
        try:
            with Snapshotter(folder / "spool", max_in_flight=2) as snap:
                t0 = time.monotonic()
                snap.request(state, 1)
                latency = stack.wait_pushed(1) - t0
                result["loop"], requested = _loop(state, steps, rounds, snap, stack)
                result["loaded"] = loaded_latency(stack, requested)
                result["latency"] = {"request_to_pushed_s": latency}
                if idle > 0:
                    result["idle"] = idle_share(stack, idle)
                if outage > 0:
                    result["outage"] = outage_drain(stack, snap, state, max(requested) + 1,
                                                    outage, interval)
            result["daemon_peak"] = stack.peaks
        finally:
            stack.close()
    result["state_bytes"] = sum(a.nbytes for a in state.values())
    result["nice"], result["store"], result["format"] = nice, store, FORMAT[store]
    return result


def _loop(state, steps: int, rounds: int, snap: Snapshotter, stack: _Stack
          ) -> tuple[dict, dict[int, float]]:
    """This VM's speed drifts by tens of percent: alternate plain and snapshotting runs and
    compare medians. A plain run starts only once the daemon has landed every snapshot of the
    run before (else it would measure the daemon's backlog, not a quiet machine)."""
    plain, loaded, gen0, requested = [], [], 100, {}
    for _ in range(rounds):
        plain.append(train(state, steps, None, 0))
        these: dict[int, float] = {}
        loaded.append(train(state, steps, snap, gen0, these))
        requested |= these
        _landed(stack, these)
        gen0 += steps // 10 + 1
    base, with_snaps = statistics.median(plain), statistics.median(loaded)
    return ({"steps": steps, "rounds": rounds, "plain_s": base, "with_snapshots_s": with_snaps,
             "slowdown": with_snaps / base - 1, "plain_runs": plain, "snapshot_runs": loaded},
            requested)


def _render_ops(r: dict) -> list[str]:
    lines = []
    loaded = r.get("loaded")
    if loaded and loaded["median_s"] is not None:
        lines.append(f"  request -> pushed while training keeps the CPU busy (daemon nice "
                     f"{r.get('nice') or 'default'}): median {loaded['median_s']:.1f} s, max "
                     f"{loaded['max_s']:.1f} s; {loaded['pushed']} of {loaded['requested']} "
                     f"pushed, {loaded['dropped']} coalesced")
    if r.get("idle"):
        idle = r["idle"]
        lines.append(f"  idle daemon: {idle['cpu_s']:.2f} CPU-s in {idle['seconds']:.0f} s = "
                     f"{idle['share'] * 100:.2f}% of a core (target < 0.5%)")
    out = r.get("outage")
    if out and out.get("drain"):
        single, drain = out["single"], out["drain"]
        lines.append(
            f"  outage {out['outage_s']:.0f} s, a generation every {out['interval_s']:.0f} s: "
            f"{out['committed']} of {out['requested']} committed; after the remote came back "
            f"{drain['gens']} gens ({fmt_bytes(drain['bytes'])}) in {drain['pushes']} pushes, "
            f"drained in {out['back_to_drained_s']:.1f} s at {fmt_bytes(drain['rate'])}/s vs "
            f"{fmt_bytes(single['rate'])}/s for one generation = {out.get('ratio', 0):.2f}x "
            f"(target >= 0.8x)")
    return lines


def render_pipeline(r: dict) -> str:
    q, w, loop = r["request"], r["wal"], r["loop"]
    return "\n".join([
        f"pipeline bench, state {fmt_bytes(r['state_bytes'])}, store {r.get('store', 'git')} "
        f"({r.get('format', 'wtxt')}):",
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
        *_render_ops(r),
        f"  daemon peak memory: {fmt_bytes(r['daemon_peak'].get('VmRSS', 0))} resident, of which "
        f"{fmt_bytes(r['daemon_peak'].get('RssAnon', 0))} anonymous and up to "
        f"{fmt_bytes(r['daemon_peak'].get('RssFile', 0))} file pages (the mmap'd spool and "
        f"libraries) (target < 2x the state = {fmt_bytes(2 * r['state_bytes'])})",
    ])
