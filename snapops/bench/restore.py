"""Benchmark of restore: a sealed generation read back from a local remote (numbers for the
README, never test assertions).

One signed, HMAC'd generation of a model-like state of ``size`` raw bytes (32 MiB shards) is
committed (zlib level 0, as the daemon configures its repository), tagged and made the
content of a bare remote (``git clone --bare`` of the work repository: its loose objects).
Timed, rounds interleaved, MB/s of raw array bytes:

* ``restore``: ``snapops.load_generation(REMOTE, run, gen=1)`` with the trusted key and HMAC
  key required (MANIFEST seal, file set, every shard's arrays against their sealed BLAKE3
  content digest, ledger; arrays with their dtypes): the arrays in memory;
* ``restore_to_file``: the same, then written to ``.safetensors`` (what ``snapops restore -o``
  does);
* ``restore_url``: the same from ``file://REMOTE``, once (a bare repository a ``file://`` URL
  names on this machine is read in place, as its path is; other URLs are fetched, depth 1);
* references measured in the same run: ``git cat-file`` of every shard blob (what git costs
  to hand the bytes over; a restore copies stored loose objects out of the object store
  itself, :mod:`snapops.formats.looseobject`); ``copy_out``, that copy of every shard into a
  scratch folder, then the BLAKE3 of the copy, on as many threads as there are CPUs: the
  part of a verified restore no decoder can skip (its ceiling on this machine); one SHA-256
  pass and one memcpy over the raw bytes.

    snapops bench restore --size 1GiB --format aero
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ._measure import best, machine, run_rounds

FORMATS = ("wtxt", "aero")
TARGETS = {"wtxt": ">= 500", "aero": ">= 1500"}


def _setup(work: Path, fmt: str, size: int):
    from .generations import RUN, Bench, _git

    from snapops.daemon.worktree import configure_repo

    bench = Bench(work, fmt, size)
    configure_repo(bench.repo, 0)     # as the daemon sets its repository (repo.compression)
    bench.commit(1, bench.state, None)
    _git(bench.repo, "tag", "-a", "-m", "gen 1", f"{RUN}/gen-000001")
    remote = work / "remote.git"
    _git(work, "clone", "-q", "--bare", str(bench.repo), str(remote))
    shutil.rmtree(bench.repo / "snapshots")           # only the remote holds the bytes now
    return bench, remote


def _cat_blobs(remote: Path, blobs: list[tuple[str, int]]) -> None:
    for oid, _ in blobs:
        subprocess.run(["git", "cat-file", "blob", oid], cwd=remote, check=True,
                       stdout=subprocess.DEVNULL)


def _shard_blobs(remote: Path, run: str) -> list[tuple[str, int]]:
    listing = subprocess.run(["git", "ls-tree", "-r", "-l", "HEAD", f"snapshots/{run}/shards/"],
                             cwd=remote, check=True, capture_output=True, text=True).stdout
    return [(line.split()[2], int(line.split()[3])) for line in listing.splitlines()]


def _copy_out(remote: Path, blobs: list[tuple[str, int]], scratch: Path) -> None:
    """Every shard blob copied out of the object store, then the BLAKE3 of the copy (what
    a restore proves its arrays by), one thread per CPU, each copy removed once hashed (as a
    restore releases them)."""
    import mmap
    from blake3 import blake3

    from snapops.formats.looseobject import copy_stored_blob
    from snapops.formats.workers import run_all

    def one(blob: tuple[str, int]) -> None:
        target = scratch / blob[0]
        with open(target, "xb+") as out:
            if copy_stored_blob(remote / "objects", blob[0], out, size=blob[1],
                                sha256=False) is None:
                raise RuntimeError(f"blob {blob[0]} is not a stored loose object")
            if blob[1]:
                with mmap.mmap(out.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    blake3(data).digest()
        target.unlink()

    run_all(one, blobs, os.cpu_count() or 1)


def bench_format(work: Path, fmt: str, size: int, rounds: int) -> dict:
    import hashlib

    import snapops

    from .generations import RUN

    bench, remote = _setup(work, fmt, size)
    opts = bench.options()
    keys = {"trusted_keys": opts.trusted_keys, "hmac_key": opts.hmac_key,
            "require_signature": True, "require_hmac": True}
    raw = bench.raw
    flat = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in bench.state.values()]
    copy_to = [np.empty_like(a) for a in flat]
    out = work / "restored.safetensors"
    blobs = _shard_blobs(remote, RUN)
    scratch = work / "copy-out"
    scratch.mkdir()

    def restore():
        snap = snapops.load_generation(remote, RUN, gen=1, **keys)
        if snap.nbytes != raw:
            raise RuntimeError(f"restored {snap.nbytes} bytes, expected {raw}")

    def restore_to_file():
        snap = snapops.load_generation(remote, RUN, gen=1, **keys)
        snapops.save(snap, out)

    def sha256():
        h = hashlib.sha256()
        for a in flat:
            h.update(a)

    def memcpy():
        for src, dst in zip(flat, copy_to):
            np.copyto(dst, src)

    runs = run_rounds({"restore": restore, "restore_to_file": restore_to_file,
                       "cat_file": lambda: _cat_blobs(remote, blobs),
                       "copy_out": lambda: _copy_out(remote, blobs, scratch), "sha256": sha256,
                       "memcpy": memcpy}, rounds, after_round=lambda: out.unlink(missing_ok=True))
    result = {"raw_bytes": raw, "shard_bytes": sum(size for _, size in blobs)}
    for name, kept in runs.items():
        m = best(kept)
        result[f"{name}_s"] = round(m.seconds, 3)
        result[f"{name}_mb_s"] = round(m.mbps(raw), 1)
        if name.startswith("restore"):
            result[f"{name}_peak_anon_mib"] = round(m.peak_anon_extra / 2**20, 1)
    result["restore_vs_sha256"] = round(result["restore_mb_s"] / result["sha256_mb_s"], 2)
    url = run_rounds({"restore_url": lambda: snapops.load_generation(
        f"file://{remote}", RUN, gen=1, **keys)}, 1, warmup=0)["restore_url"][0]
    result["restore_url_s"] = round(url.seconds, 3)
    result["restore_url_mb_s"] = round(url.mbps(raw), 1)
    return result


def run_restore(size: int, workdir: str | os.PathLike | None = None, names=None,
                rounds: int = 2) -> dict:
    result = {"machine": machine()}
    for fmt in names or FORMATS:
        work = Path(tempfile.mkdtemp(prefix=f"snapops-bench-restore-{fmt}-", dir=workdir))
        try:
            result[fmt] = bench_format(work, fmt, size, rounds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = round(os.getloadavg()[0], 2)
    return result


def render_restore(r: dict) -> str:
    m = r["machine"]
    lines = [f"restore from a local remote ({m['cpus']} CPUs, load {m['loadavg_1min']} -> "
             f"{r['load_after']}; MB/s of raw array bytes, best of the rounds)"]
    for fmt in FORMATS:
        g = r.get(fmt)
        if g is None:
            continue
        lines += [
            f"{fmt}: {g['raw_bytes'] / 2**20:.0f} MiB raw in {g['shard_bytes'] / 2**20:.0f} MiB "
            "of shards",
            f"  restore (verified, to memory)   {g['restore_s']:6.2f} s {g['restore_mb_s']:8.1f} "
            f"MB/s  target {TARGETS[fmt]} MB/s  ({g['restore_vs_sha256']}x SHA-256)",
            f"  restore to .safetensors         {g['restore_to_file_s']:6.2f} s "
            f"{g['restore_to_file_mb_s']:8.1f} MB/s",
            f"  restore from file:// (read in place)  {g['restore_url_s']:6.2f} s "
            f"{g['restore_url_mb_s']:8.1f} MB/s",
            f"  reference: git cat-file of the shards {g['cat_file_mb_s']:8.1f} MB/s "
            "(restore copies stored loose objects itself)",
            f"  reference: copy-out + BLAKE3 of the shards, {m['cpus']} threads "
            f"{g['copy_out_mb_s']:8.1f} MB/s (the ceiling of a verified restore here)",
            f"  reference: SHA-256 {g['sha256_mb_s']:8.1f} MB/s, memcpy {g['memcpy_mb_s']:8.1f} "
            "MB/s",
        ]
    return "\n".join(lines)
