"""``snapops bench storage``: what a run of generations costs to store, push, clone and restore,
with ``store = "git"`` and ``store = "lfs"`` side by side in the same run.

For each store and regime a real daemon serializes ``gens`` generations of a model-like state
of ``size`` raw bytes (requested one at a time, each after the previous was pushed) into a bare
remote on local disk; the LFS store uploads to a giftless on 127.0.0.1 (local storage backend).
Regimes: ``dense_f32`` (every weight moves by an AdamW-like relative step of 1e-3 each
generation), ``dense_bf16`` (the same in bfloat16), ``sparse_f32`` (1% of the rows change).
Measured: bytes stored (the bare remote plus the LFS storage folder), their growth per
generation after the first as a ratio to the raw bytes, request-to-pushed per generation, a
fresh ``git clone`` of the run (pointers only for LFS), and the restore of the newest
generation, verified as ``snapops restore`` verifies it (seal, file set, every shard's
SHA-256, ledger, arrays; not each format's own deep verify, which the hooks run), in MB/s of
raw bytes. LFS: ``restore_MBps`` with the objects in the local cache, the keyframe and
residual chain applied, in a throw-away cache as ``snapops restore`` keeps its own;
``restore_kept_cache_MBps`` the same in a kept cache (``--lfs-cache``: rebuilt shards are
fsync'd); ``restore_cold_MBps`` fetching them into an empty cache first, bound by the LFS
server's download speed; ``restore_longest_chain_MBps`` the warm restore of the generation
whose shards apply the most residuals (``restore_longest_chain_gen``, ``..._residuals``:
``keyframe_every - 1`` per shard at most), read from its tag. The git store
writes WTXT (its default); the LFS store AERO. The bare remote is configured as ``snapops hooks
install`` configures one (``receive.fsckObjects``, ``core.looseCompression 0``), without hooks.

    snapops bench storage --size 128MiB --gens 30 --json
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from snapops.daemon.client import WAL_NAME, Snapshotter
from snapops.daemon.lifecycle import DROPPED, PUSHED
from snapops.daemon.wal import WalReader
from snapops.formats.gitcmd import run_git
from snapops.hooks.install import SERVER_CONFIG

from ._measure import fmt_bytes, machine, model_state

REGIMES = ("dense_f32", "dense_bf16", "sparse_f32")
STORES = ("git", "lfs")
FORMAT = {"git": "wtxt", "lfs": "aero"}
KEYFRAME_EVERY = 8
SECRET = "snapops-bench-secret"


def _states(size: int, regime: str, gens: int):
    """The state of each generation, in order (one array set, changed in place)."""
    state = model_state(size, vectors=False)
    rng = np.random.default_rng(1)
    for gen in range(1, gens + 1):
        if gen > 1:
            for w in state.values():
                if regime == "sparse_f32":
                    rows = rng.choice(w.shape[0], max(1, w.shape[0] // 100), replace=False)
                    w[rows] *= 1 + np.float32(1e-3) * rng.standard_normal(
                        (len(rows), w.shape[1]), dtype=np.float32)
                else:
                    w *= 1 + np.float32(1e-3) * rng.standard_normal(w.shape, dtype=np.float32)
        if regime == "dense_bf16":
            import ml_dtypes

            yield {k: v.astype(ml_dtypes.bfloat16) for k, v in state.items()}
        else:
            yield state


def _du(*folders: Path) -> int:
    return sum(p.stat().st_size for f in folders if f.exists() for p in f.rglob("*")
               if p.is_file() and not p.is_symlink())


def _config(folder: Path, store: str, lfs_url: str | None, token_file: Path | None,
            keyframe_every: int = KEYFRAME_EVERY) -> Path:
    lfs = (f'store = "lfs"\nlfs_url = "{lfs_url}"\nlfs_token_file = "{token_file}"\n'
           f"keyframe_every = {keyframe_every}\n") if store == "lfs" else ""
    config = folder / "snapops.toml"
    config.write_text(f"""[daemon]\npoll_interval = 0.2\n[snapshot]\nrun = "bench"
format = "{FORMAT[store]}"\n[repo]\npath = "repo"\n{lfs}[[repo.remote]]\nname = "origin"
url = "{folder / 'remote.git'}"\n[push]\nbackoff_initial = 0.2\nbackoff_max = 2.0\n""")
    return config


def _wait_pushed(reader: WalReader, records: list, gen: int, daemon, timeout=1800) -> float:
    deadline = time.monotonic() + timeout
    while True:
        records += reader.read_new()
        if any(r.gen == gen and r.event in (PUSHED, DROPPED) for r in records):
            if any(r.gen == gen and r.event == DROPPED for r in records):
                raise RuntimeError(f"gen {gen} was dropped")
            return time.time()
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"gen {gen} not pushed (daemon exit {daemon.poll()})")
        time.sleep(0.02)


WARM_ROUNDS = 3   # restores with the objects at hand: the best is kept (one is noise here)


def _restore(folder: Path, store: str, lfs_url: str | None, secret: str) -> dict:
    """Seconds to restore the newest generation from a fresh clone (exact, verified as
    ``snapops restore`` verifies: seal, file set, every shard's SHA-256, ledger, arrays; best
    of ``WARM_ROUNDS``). LFS: ``cold`` fetches every object into an empty cache (bound by the
    LFS server's download speed), ``warm`` has the objects cached and rebuilds the shards from
    them (keyframe and residuals decoded); both in a throw-away cache, as ``snapops restore``
    uses without ``--lfs-cache`` (nothing fsync'd); ``warm_kept`` is ``warm`` in a kept cache
    (``--lfs-cache``: rebuilt shards fsync'd)."""
    from snapops.formats.generation.load import load_from_source
    from snapops.formats.generation.source import FolderSource
    from snapops.formats.lfs.client import LfsClient
    from snapops.formats.lfs.objects import ObjectStore
    from snapops.formats.lfs.source import LfsSource, tag_manifests
    from snapops.hooks.gitio import Git
    from snapops.restore import generation_options

    from .giftless import token

    clone = folder / "clone"
    checks = generation_options()    # what snapops restore checks (no format's own deep verify)
    if store == "git":
        times = []
        for _ in range(WARM_ROUNDS):
            start = time.perf_counter()
            load_from_source(FolderSource(clone), "bench", options=checks)
            times.append(time.perf_counter() - start)
        return {"warm": min(times)}
    cache = folder / "restore-cache"
    shutil.rmtree(cache, ignore_errors=True)
    client = LfsClient(lfs_url, token(secret, "read"))
    out: dict[str, float] = {}
    for phase in ("cold", *("warm", "warm_kept") * WARM_ROUNDS):
        store_ = ObjectStore(cache, client, durable=phase == "warm_kept")
        if phase != "cold":  # keep the fetched objects, forget the rebuilt shards
            _forget_rebuilt(cache, {line.split()[0] for line in subprocess.run(
                ["git", "-C", str(clone), "lfs", "ls-files", "--all", "--long"],
                capture_output=True, text=True, check=False).stdout.splitlines() if line})
        start = time.perf_counter()
        load_from_source(LfsSource(FolderSource(clone), "bench", store_,
                                   manifests=tag_manifests(Git(clone), "bench")), "bench",
                         options=checks)
        out[phase] = min(out.get(phase, float("inf")), time.perf_counter() - start)
    out.update(_restore_longest_chain(clone, cache, client, checks))
    return out


def _restore_longest_chain(clone: Path, cache: Path, client, checks) -> dict:
    """The best of ``WARM_ROUNDS`` warm restores of the generation whose shards apply the
    most residuals, from its tag (objects cached, rebuilt shards not)."""
    from snapops.formats.generation.load import load_from_source
    from snapops.formats.generation.manifest import gen_text, parse_manifest
    from snapops.formats.generation.source import GitTreeSource
    from snapops.formats.lfs.objects import ObjectStore
    from snapops.formats.lfs.source import LfsSource, tag_manifests
    from snapops.hooks.gitio import Git

    git = Git(clone)
    read = tag_manifests(git, "bench")
    manifests = {}
    tags = git.text("for-each-ref", "--format=%(refname:lstrip=3)", "refs/tags/bench/")
    newest = max(int(name.removeprefix("gen-")) for name in tags.split())
    for g in range(newest, 0, -1):
        data = read(g)
        if data is None:
            break
        manifests[g] = parse_manifest(data, f"gen {g}")
    store = ObjectStore(cache, client, durable=False)

    def residuals(g: int) -> int:
        return sum(len(store.chain(shard, lambda b, p=shard.path: manifests[b].shard(p),
                                   shard.path)[1]) for shard in manifests[g].shards)

    worst = max(manifests, key=lambda g: (residuals(g), g))
    tag = f"refs/tags/bench/gen-{gen_text(worst)}"
    objects = {s.object for m in manifests.values() for s in m.shards if s.object}
    best = float("inf")
    for _ in range(WARM_ROUNDS):
        _forget_rebuilt(cache, objects)     # the kept-cache rounds before left them there
        with tempfile.TemporaryDirectory(dir=clone.parent) as scratch:
            source = GitTreeSource(git, tag, scratch)
            start = time.perf_counter()
            load_from_source(LfsSource(source, "bench", ObjectStore(cache, client,
                                                                    durable=False),
                                       manifests=read), "bench", options=checks)
            best = min(best, time.perf_counter() - start)
    return {"longest_chain": best, "longest_chain_gen": worst,
            "longest_chain_residuals": residuals(worst)}


def _forget_rebuilt(cache: Path, objects: set[str]) -> None:
    """Remove every file of the cache named by a SHA-256 that is not a stored object (the
    rebuilt shards), so that the next restore rebuilds them."""
    for path in cache.iterdir():
        if path.name not in objects and len(path.name) == 64:
            path.unlink()


def run_one(folder: Path, store: str, regime: str, size: int, gens: int,
            keyframe_every: int = KEYFRAME_EVERY) -> dict:
    from .giftless import serving, token

    folder.mkdir(parents=True)
    run_git(["init", "-q", "--bare", "-b", "main", str(folder / "remote.git")])
    for key, (value, _why) in SERVER_CONFIG.items():  # as `snapops hooks install` sets it
        run_git(["config", key, value], cwd=folder / "remote.git")
    with (serving(folder, SECRET) if store == "lfs" else _nothing()) as lfs_url:
        token_file = None
        if store == "lfs":
            token_file = folder / "lfs.token"
            token_file.write_text(token(SECRET, "write") + "\n")
        config = _config(folder, store, lfs_url, token_file, keyframe_every)
        log = open(folder / "daemon.log", "ab")
        daemon = subprocess.Popen([sys.executable, "-m", "snapops", "daemon", "run", "--config",
                                   str(config)], stdout=log, stderr=log)
        paths = [folder / "remote.git"] + ([folder / "lfs-storage"] if store == "lfs" else [])
        latencies, stored, raw = [], [], 0
        try:
            reader = WalReader(folder / "spool" / WAL_NAME)
            records: list = []
            with Snapshotter(folder / "spool", policy="block") as snap:
                for gen, state in enumerate(_states(size, regime, gens), start=1):
                    raw = sum(a.nbytes for a in state.values())
                    t0 = time.time()
                    snap.request(state, gen)
                    if gen == 1:
                        reader = WalReader(folder / "spool" / WAL_NAME)
                    latencies.append(_wait_pushed(reader, records, gen, daemon) - t0)
                    stored.append(_du(*paths))
        finally:
            daemon.terminate()
            daemon.wait(120)
            log.close()
        clone = folder / "clone"
        start = time.perf_counter()
        subprocess.run(["git", "clone", "-q", str(folder / "remote.git"), str(clone)],
                       check=True, env=os.environ | {"GIT_LFS_SKIP_SMUDGE": "1"})
        clone_s = time.perf_counter() - start
        restore_s = _restore(folder, store, lfs_url, SECRET)
    growth = (stored[-1] - stored[0]) / max(1, gens - 1)
    return {"store": store, "regime": regime, "format": FORMAT[store],
            "stored_bytes": stored[-1], "first_gen_bytes": stored[0],
            "stored_ratio_per_gen": growth / raw if gens > 1 else stored[0] / raw,
            "request_to_pushed_s": {"median": statistics.median(latencies),
                                    "max": max(latencies)},
            "clone_s": clone_s, "restore_MBps": raw / restore_s["warm"] / 1e6,
            "restore_cold_MBps": raw / restore_s["cold"] / 1e6 if "cold" in restore_s else None,
            "restore_kept_cache_MBps": raw / restore_s["warm_kept"] / 1e6
            if "warm_kept" in restore_s else None,
            **({"restore_longest_chain_MBps": raw / restore_s["longest_chain"] / 1e6,
                "restore_longest_chain_gen": restore_s["longest_chain_gen"],
                "restore_longest_chain_residuals": restore_s["longest_chain_residuals"]}
               if "longest_chain" in restore_s else {}),
            "paths": [str(p) for p in paths]}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run_storage(size: int, workdir: str | None = None, gens: int = 30,
                regimes: list[str] | None = None, stores: list[str] | None = None,
                keyframe_every: int = KEYFRAME_EVERY) -> dict:
    keep = workdir is not None
    root = Path(workdir) if keep else Path(tempfile.mkdtemp(prefix="snapops-bench-storage-"))
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    raw = sum(a.nbytes for a in model_state(size, vectors=False).values())
    try:
        for regime in regimes or REGIMES:
            for store in stores or STORES:
                folder = Path(tempfile.mkdtemp(prefix=f"{store}-{regime}-", dir=root))
                shutil.rmtree(folder)
                runs.append(run_one(folder, store, regime, size, gens, keyframe_every))
                if not keep:
                    shutil.rmtree(folder, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return {"raw_bytes_per_gen": raw, "gens": gens, "keyframe_every": keyframe_every,
            "machine": machine(), "runs": runs}


def render_storage(r: dict) -> str:
    lines = [f"raw bytes per generation (f32): {fmt_bytes(r['raw_bytes_per_gen'])}, "
             f"{r['gens']} generations, LFS keyframe_every {r['keyframe_every']} (skip "
             f"residuals: a restore applies at most {r['keyframe_every'] - 1})",
             f"{'store':5} {'regime':11} {'stored':>10} {'per gen':>8} {'push med':>9} "
             f"{'push max':>9} {'clone':>7} {'restore':>11}"]
    for run in r["runs"]:
        lat = run["request_to_pushed_s"]
        lines.append(f"{run['store']:5} {run['regime']:11} {fmt_bytes(run['stored_bytes']):>10} "
                     f"{run['stored_ratio_per_gen']:>7.3f}x {lat['median']:>8.2f}s "
                     f"{lat['max']:>8.2f}s {run['clone_s']:>6.2f}s "
                     f"{run['restore_MBps']:>6.0f} MB/s"
                     + (f" (cold {run['restore_cold_MBps']:.0f} MB/s, kept cache "
                        f"{run['restore_kept_cache_MBps']:.0f} MB/s; gen "
                        f"{run['restore_longest_chain_gen']}, the longest chain "
                        f"({run['restore_longest_chain_residuals']} residuals): "
                        f"{run['restore_longest_chain_MBps']:.0f} MB/s)"
                        if run.get("restore_cold_MBps") else ""))
    return "\n".join(lines)
