"""``snapops bench multirank``: what snapshots cost each rank of a multi-rank job, and how fast a
generation made of N ranks' parts lands, against one rank with one part.

Measured in one run, with a git daemon on 127.0.0.1 and a snapops daemon per world size: each
rank is its own process (spawned) holding ``--size`` bytes of a row-split global state as
:class:`~snapops.Shard` s; for every generation the ranks start ``request()`` together, and
request-to-pushed is the time from the first rank's request to the PUSHED record. The same
generations are run with one rank of ``--size`` bytes and with ``--ranks`` ranks of ``--size``
bytes each, and the WAL's record times split each into spooling (first REQ to last SPOOLED),
serializing, committing and pushing. Each rank's ``request()`` stall is compared with a memcpy
of its part in the same process just before, one rank at a time (with a core per rank, as on a
training machine, ranks do not compete for one), on a spool no daemon reads (medians over the
generations after the first, which allocates the pinned buffers). Before each generation every
rank moves every weight (a dense training step), so every shard is rewritten each time.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from snapops.daemon.client import WAL_NAME
from snapops.daemon.wal import WalReader

from ._measure import fmt_bytes, machine_busy_seconds, model_state
from .pipeline import _median_time, _perturb, _Stack

GENS = 4   # the first one warms buffers and caches; the others are measured


def rank_part(size: int, rank: int, world: int) -> dict:
    """Rank ``rank``'s rows of a global state of ``world`` x ``size`` bytes (matrices split
    by rows; vectors and the step counter on rank 0)."""
    from snapops.formats.generation.plan import Shard

    part = {}
    for name, local in model_state(size, seed=rank).items():
        if local.ndim == 2:
            rows = local.shape[0]
            part[name] = Shard(local, global_shape=(rows * world, local.shape[1]),
                               offsets=(rows * rank, 0))
        elif rank == 0:
            part[name] = local
    return part


def _rank_main(folder: str, rank: int, world: int, size: int, turn, start, results) -> None:
    """One rank: request() stalls against memcpy when its turn comes, then one request per
    generation together with the other ranks when the parent says go."""
    from snapops.daemon.client import Snapshotter
    from snapops.daemon.spool import spool_name

    part = rank_part(size, rank, world)
    arrays = {n: getattr(v, "local", v) for n, v in part.items()}
    copies = {n: np.empty_like(a) for n, a in arrays.items()}

    def memcpy():
        for name, array in arrays.items():
            np.copyto(copies[name], array)

    memcpy()
    alone = Path(folder) / "spool-stall"
    with Snapshotter(alone, rank=rank, world_size=world, policy="block") as snap:
        for gen in range(1, GENS + 1):
            turn.wait()
            turn.clear()
            baseline = _median_time(memcpy, 3)
            t0 = time.monotonic()
            snap.request(part, gen)
            stall = time.monotonic() - t0
            snap.flush()
            (alone / spool_name(gen, rank if world > 1 else None)).unlink()
            results.put((rank, gen, stall, baseline))
    with Snapshotter(Path(folder) / "spool", rank=rank, world_size=world,
                     policy="block") as snap:
        for gen in range(1, GENS + 1):
            _perturb(arrays, 1e-3)   # every weight moves, as in a training step
            start.wait()
            t0 = time.monotonic()
            snap.request(part, gen)
            results.put((rank, gen, t0))
            snap.flush()
    results.put((rank, "bytes", sum(a.nbytes for a in arrays.values())))


def run_world(size: int, world: int, folder: Path, fmt: str = "wtxt", store: str = "git"
              ) -> dict:
    """A daemon for ``world`` ranks and its ranks; request-to-pushed and stalls per gen."""
    folder.mkdir()
    os.environ["SNAPOPS_CLUSTER_WORLD_SIZE"] = str(world)   # the stack's daemon inherits it
    try:
        stack = _Stack(folder, fmt=fmt, store=store)
    finally:
        del os.environ["SNAPOPS_CLUSTER_WORLD_SIZE"]
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(world + 1), ctx.Queue()
    turns = [ctx.Event() for _ in range(world)]
    procs = [ctx.Process(target=_rank_main, args=(str(folder), r, world, size, turns[r], start,
                                                  results)) for r in range(world)]
    latencies, busy, stalls = [], [], {r: [] for r in range(world)}
    copies = {r: [] for r in range(world)}
    try:
        for proc in procs:
            proc.start()
        for gen in range(1, GENS + 1):
            for rank in range(world):      # one rank at a time
                turns[rank].set()
                got, _, stall, baseline = results.get(timeout=600)
                stalls[got].append(stall)
                copies[got].append(baseline)
        for gen in range(1, GENS + 1):
            start.wait(timeout=600)       # every rank has moved its weights: requests start
            before = machine_busy_seconds()
            starts = [results.get(timeout=600)[2] for _ in range(world)]
            latencies.append(stack.wait_pushed(gen) - min(starts))
            after = machine_busy_seconds()
            busy.append(after - before if None not in (before, after) else None)
        sizes = {rank: nbytes for rank, _, nbytes in (results.get(timeout=600)
                                                      for _ in range(world))}
    finally:
        for proc in procs:
            proc.join(60)
        stack.close()
    measured = [b for b in busy[1:] if b is not None]
    return {"world": world, "request_to_pushed_s": latencies,
            "median_s": statistics.median(latencies[1:]), "peaks": stack.peaks,
            "machine_cpu_s": busy,
            "machine_cpu_median_s": statistics.median(measured) if measured else None,
            "phases_s": phases(folder / "spool" / WAL_NAME),
            "ranks": [rank_stall(r, sizes[r], copies[r][1:], stalls[r][1:])
                      for r in range(world)]}


def rank_stall(rank: int, nbytes: int, copies: list[float], stalls: list[float]) -> dict:
    memcpy, request = statistics.median(copies), statistics.median(stalls)
    return {"rank": rank, "part_bytes": nbytes, "memcpy_s": memcpy, "request_s": request,
            "ratio": request / memcpy}


def phases(wal: Path) -> dict[str, float]:
    """Median seconds per stage over the measured gens, from the WAL records' times."""
    times: dict[int, dict[str, list[float]]] = {}
    for record in WalReader(wal).read_new():
        times.setdefault(record.gen, {}).setdefault(record.event, []).append(
            float(record.fields["t"]))
    stages = {"spool": ("REQ", min, "SPOOLED", max), "serialize": ("SPOOLED", max, "SERIALIZED",
                                                                   min),
              "commit": ("SERIALIZED", min, "COMMITTED", min),
              "push": ("COMMITTED", min, "PUSHED", min)}
    out = {}
    for stage, (a, first, b, last) in stages.items():
        spans = [last(t[b]) - first(t[a]) for gen, t in times.items()
                 if gen > 1 and a in t and b in t]
        out[stage] = statistics.median(spans) if spans else None
    return out


def run_multirank(size: int, ranks: int = 4, workdir: str | None = None,
                  fmt: str = "wtxt", store: str = "git") -> dict:
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-bench-") as tmp:
        one = run_world(size, 1, Path(tmp) / "w1", fmt, store)
        many = run_world(size, ranks, Path(tmp) / f"w{ranks}", fmt, store)
    return {"size": size, "ranks": ranks, "format": fmt, "store": store, "one": one,
            "many": many, "cpus": os.cpu_count(),
            "ratio": many["median_s"] / one["median_s"], "load": os.getloadavg(),
            "floor_ratio": floor_ratio(many, one, os.cpu_count() or 1)}


def floor_ratio(many: dict, one: dict, cpus: int) -> float | None:
    """The least ratio of N ranks to one rank this machine allows for the work as it is: the
    N-rank generation's CPU-seconds (every process of the machine: ranks, daemon, git, the
    LFS server) spread perfectly over ``cpus`` cores, against one rank's time."""
    cpu = many.get("machine_cpu_median_s")
    return None if cpu is None else cpu / cpus / one["median_s"]


def render_multirank(r: dict) -> str:
    one, many = r["one"], r["many"]
    worst = max(many["ranks"], key=lambda x: x["ratio"])
    lines = [f"multirank bench, {r['format']}, store {r.get('store', 'git')}, "
             f"{fmt_bytes(r['size'])} per rank (load average "
             f"{r['load'][0]:.2f}):"]
    for run in (one, many):
        lines.append(
            f"  {run['world']} rank(s) x {fmt_bytes(r['size'])}: request -> pushed "
            f"{run['median_s']:.2f} s (gens 2-{GENS}: "
            f"{', '.join(f'{s:.2f}' for s in run['request_to_pushed_s'][1:])}; "
            + ", ".join(f"{k} {v:.2f}" for k, v in run["phases_s"].items() if v is not None)
            + ")")
    lines.append(f"  ratio {r['ranks']} ranks / 1 rank: {r['ratio']:.2f}x (target < 2x)")
    if r.get("floor_ratio") is not None and one.get("machine_cpu_median_s"):
        cpus, cpu1, cpu_n = r["cpus"], one["machine_cpu_median_s"], many["machine_cpu_median_s"]
        lines.append(
            f"  CPU-seconds of the whole machine per generation: 1 rank {cpu1:.2f} "
            f"({cpu1 / one['median_s']:.2f} cores busy), {r['ranks']} ranks {cpu_n:.2f} "
            f"({cpu_n / many['median_s']:.2f} cores busy)")
        lines.append(
            f"  floor on these {cpus} cores: {r['ranks']} ranks' CPU-seconds / {cpus} = "
            f"{cpu_n / cpus:.2f} s = {r['floor_ratio']:.2f}x one rank "
            "(no scheduling does better without less work per byte)")
    for rank in many["ranks"]:
        lines.append(f"  rank {rank['rank']}: request() {rank['request_s'] * 1e3:.1f} ms vs "
                     f"memcpy of its {fmt_bytes(rank['part_bytes'])} "
                     f"{rank['memcpy_s'] * 1e3:.1f} ms = {rank['ratio']:.2f}x")
    lines.append(f"  worst rank stall {worst['ratio']:.2f}x (target <= 1.3x)")
    return "\n".join(lines)
