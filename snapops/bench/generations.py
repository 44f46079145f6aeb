"""Benchmark of sealed generations: the whole-generation verifier and the hooks that run it
(numbers for the README, never test assertions).

For a model-like state of ``size`` raw bytes written as one signed, HMAC'd generation (32 MiB
shards) in WTXT and in AERO, MB/s of raw array bytes and wall seconds of:

* ``verify``: ``verify_generation`` of the work tree (3 shards at once, every check); next to
  it the floors it is made of, each on 2 threads: SHA-256 of every file, every shard's own
  verify, and the hash passes a full verify makes with the bytes already in memory and
  nothing else to do (:data:`HASH_PASSES`: no verifier can beat it on this machine); and the
  same verifier without the formats' own verify (``deep=False``: sealed digests and the
  arrays' names, dtypes and shapes only);
* ``verify_git``: the same from the commit (blobs copied from git into a scratch folder; the
  work repository stores objects as the daemon's does, ``[repo] compression`` 0);
* ``pre_receive``: ``snapops hook pre-receive`` as installed by ``snapops hooks install`` in a
  bare repository (a fresh process: start-up included; best of 3), for the first generation
  and for a next one where one shard changed (the accepted parent's shards are not read);
* ``pre_commit``: ``snapops hook pre-commit`` with the first generation staged (best of 3);
* ``startup``: ``snapops --version``.

    python -m snapops.bench.generations --size 256MiB
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from snapops.bench._measure import model_state
from snapops.formats.workers import run_all

TS = "2026-01-02T03:04:05Z"
RUN = "bench"
FORMATS = ("wtxt", "aero")
NO_HOOKS = "git -c core.hooksPath=/nonexistent receive-pack"  # stage objects past the hook
# What a full verify of a sealed generation hashes, per format: (over the files' bytes, over
# the raw array bytes). Every file against its MANIFEST digest; WTXT: chunk, array and whole
# content SHA-256 and the HMAC over the raw bytes; AERO: the BLAKE3 of every chunk and of
# every tensor (both spanning the weights).
HASH_PASSES = {"wtxt": (("sha256",), ("sha256",) * 4),
               "aero": (("sha256", "blake3", "blake3"), ())}
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b"}


def _snapops() -> list[str]:
    exe = Path(sys.executable).with_name("snapops")
    return [os.fspath(exe)] if os.access(exe, os.X_OK) else [sys.executable, "-m", "snapops"]


def _git(cwd: Path, *args: str, input: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          input=input, env=os.environ | GIT_ENV).stdout.strip()


def _best(cmd: list[str], cwd: Path, stdin: str = "", repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True)
        best = min(best, time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[-2:])} failed: {proc.stderr.strip()}")
    return best


def _timed(function, *args) -> float:
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


class Bench:
    """One format: a work tree with the generation committed, a bare repository with hooks."""

    def __init__(self, work: Path, fmt: str, size: int) -> None:
        from snapops.config.schema import RepoConfig
        from snapops.daemon.worktree import configure_repo
        from snapops.formats.generation.write import GenerationSpec
        from snapops.formats.keys import generate_keys, load_hmac_key

        self.work, self.fmt = work, fmt
        self.keys, self.repo, self.bare = work / "keys", work / "repo", work / "remote.git"
        generate_keys(self.keys)
        self.spec = GenerationSpec(run=RUN, format=fmt, build="bench",
                                   sign_key=self.keys / "signing.key",
                                   hmac_key=load_hmac_key(self.keys / "hmac.key"))
        self.state = model_state(size)
        self.raw = sum(a.nbytes for a in self.state.values())
        self.repo.mkdir()
        _git(self.repo, "init", "-q", "-b", "main")
        configure_repo(self.repo, RepoConfig().compression)  # objects as the daemon stores them

    def options(self):
        from snapops.formats.generation.verify import GenerationOptions
        from snapops.formats.keys import coerce_trusted, load_hmac_key

        return GenerationOptions(trusted_keys=coerce_trusted([self.keys / "signing.pub"]),
                                 hmac_key=load_hmac_key(self.keys / "hmac.key"),
                                 require_signature=True, require_hmac=True)

    def commit(self, gen: int, state, previous: bytes | None) -> tuple[str, bytes]:
        from snapops.formats.generation.write import seal_in_ledger, write_generation

        written = write_generation(self.repo, self.spec, gen, TS, state, previous)
        seal_in_ledger(self.repo, RUN, written)
        _git(self.repo, "add", "-A")
        _git(self.repo, "commit", "-q", "-m", f"gen {gen}")
        return _git(self.repo, "rev-parse", "HEAD"), written.data

    def mbps(self, seconds: float) -> float:
        """Raw array bytes per second."""
        return round(self.raw / seconds / 1e6, 1)

    def shards(self) -> list[Path]:
        return sorted(p for p in (self.repo / "snapshots" / RUN / "shards").iterdir())

    def floors(self) -> dict:
        from snapops.formats.integrity import file_sha256
        from snapops.formats.registry import handler

        chosen = handler(self.fmt)
        opts = {"hmac_key": self.keys / "hmac.key", "trusted_keys": [self.keys]} \
            if chosen.capabilities.can_hmac else {}
        verify = chosen.verify
        sha = _timed(lambda: run_all(file_sha256, self.shards(), 2))
        own = _timed(lambda: run_all(lambda p: verify(str(p), **opts), self.shards(), 2))
        return {"sha256_mb_s": self.mbps(sha), "format_verify_mb_s": self.mbps(own),
                "hash_floor_mb_s": self.mbps(self.hash_floor())}

    def hash_floor(self, repeat: int = 3) -> float:
        """Seconds for the hash passes of a full verify (:data:`HASH_PASSES`) over the
        files and arrays held in memory, on two threads; best of ``repeat``."""
        from .machine import hash_passes, pieces

        over_files, over_raw = HASH_PASSES[self.fmt]
        files = [memoryview(p.read_bytes()) for p in self.shards()]
        raw = [piece for a in self.state.values()
               for piece in pieces(np.ascontiguousarray(a).reshape(-1).view(np.uint8))]

        def passes() -> None:
            hash_passes(files, over_files)
            if over_raw:
                hash_passes(raw, over_raw)

        return min(_timed(passes) for _ in range(repeat))

    def verify(self) -> dict:
        from snapops.formats.generation.source import FolderSource, GitTreeSource
        from snapops.formats.generation.verify import verify_generation
        from snapops.hooks.gitio import Git

        def check(source, deep: bool = True) -> None:
            options = dataclasses.replace(self.options(), deep=deep)
            report = verify_generation(source, RUN, options)
            if not report.ok:
                raise RuntimeError(str(report.failure))

        folder = min(_timed(check, FolderSource(self.repo)) for _ in range(2))
        shallow = min(_timed(check, FolderSource(self.repo), False) for _ in range(2))
        with tempfile.TemporaryDirectory(dir=self.work) as scratch:
            git = _timed(check, GitTreeSource(Git(self.repo), "HEAD", scratch))
        return {"verify_s": folder, "verify_mb_s": self.mbps(folder), "verify_git_s": git,
                "verify_git_mb_s": self.mbps(git), "verify_digest_only_mb_s": self.mbps(shallow)}

    def remote(self) -> None:
        _git(self.work, "init", "-q", "--bare", "-b", "main", str(self.bare))
        subprocess.run([*_snapops(), "hooks", "install", str(self.bare)], check=True,
                       capture_output=True)
        for key, value in (("snapops.trustedKeys", self.keys / "signing.pub"),
                           ("snapops.requireSignature", "true"),
                           ("snapops.hmacKey", self.keys / "hmac.key"),
                           ("snapops.requireHmac", "true")):
            _git(self.bare, "config", key, str(value))

    def pre_receive(self, old: str | None, new: str, repeat: int = 3) -> float:
        """Objects staged in the bare repository past the hook, then the hook timed alone."""
        _git(self.repo, "push", "-q", f"--receive-pack={NO_HOOKS}", str(self.bare),
             f"{new}:refs/staging/gen")
        _git(self.bare, "update-ref", "-d", "refs/staging/gen")
        null = "0" * len(new)
        seconds = _best([*_snapops(), "hook", "pre-receive"], self.bare,
                        f"{old or null} {new} refs/heads/main\n", repeat)
        _git(self.bare, "update-ref", "refs/heads/main", new)
        return seconds


def bench_format(work: Path, fmt: str, size: int, repeat: int = 3) -> dict:
    """Every measurement of one format; each hook run ``repeat`` times, the best kept."""
    bench = Bench(work, fmt, size)
    first, data = bench.commit(1, bench.state, None)
    result = {"raw_bytes": bench.raw, "files_bytes": sum(p.stat().st_size
                                                         for p in bench.shards())}
    result |= bench.verify() | bench.floors()
    bench.remote()
    result["pre_receive_s"] = bench.pre_receive(None, first, repeat)
    one_layer = dict(bench.state)
    name = next(n for n in one_layer if n.endswith("_w"))
    one_layer[name] = one_layer[name] + 1
    second, _ = bench.commit(2, one_layer, data)
    result["pre_receive_next_s"] = bench.pre_receive(first, second, repeat)
    _git(bench.repo, "reset", "-q", "--soft", "HEAD~1")  # generation 2 staged, not committed
    result["pre_commit_s"] = _best([*_snapops(), "hook", "pre-commit"], bench.repo,
                                   repeat=repeat)
    return result


def run_generations(size: int, workdir: str | os.PathLike | None = None,
                    formats=FORMATS, repeat: int = 3) -> dict:
    """Every measurement for each format (processes timed ``repeat`` times, best kept);
    ``startup_s`` and the load average once."""
    result = {"cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
              "startup_s": _best([*_snapops(), "--version"], Path.cwd(), repeat=repeat)}
    for fmt in formats:
        work = Path(tempfile.mkdtemp(prefix=f"snapops-bench-gen-{fmt}-", dir=workdir))
        try:
            result[fmt] = bench_format(work, fmt, size, repeat)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = os.getloadavg()[0]
    return result


TARGETS = {"pre_receive_s": "< 2 s", "verify_mb_s": {"wtxt": ">= 300", "aero": ">= 2000"}}


def render_generations(r: dict) -> str:
    lines = [f"sealed generations ({r['cpus']} CPUs, load {r['load_before']:.1f} -> "
             f"{r['load_after']:.1f}; snapops start-up {r['startup_s']:.2f} s)"]
    for fmt in FORMATS:
        g = r.get(fmt)
        if g is None:
            continue
        lines += [
            f"{fmt}: {g['raw_bytes'] / 2**20:.0f} MiB raw in {g['files_bytes'] / 2**20:.0f} MiB "
            "of shards",
            f"  verify_generation (work tree)  {g['verify_s']:6.2f} s {g['verify_mb_s']:8.1f} "
            f"MB/s  target {TARGETS['verify_mb_s'][fmt]} MB/s",
            f"    floor: SHA-256 of the files             {g['sha256_mb_s']:8.1f} MB/s",
            f"    floor: each shard's own verify          {g['format_verify_mb_s']:8.1f} MB/s",
            f"    floor: a full verify's hash passes alone {g['hash_floor_mb_s']:7.1f} MB/s "
            "(bytes in memory, both cores)",
            f"  verify_generation, digests and arrays only {g['verify_digest_only_mb_s']:6.1f} "
            "MB/s (no format verify)",
            f"  verify_generation (git commit) {g['verify_git_s']:6.2f} s "
            f"{g['verify_git_mb_s']:8.1f} MB/s",
            f"  hook pre-receive, new generation      {g['pre_receive_s']:6.2f} s  target < 2 s",
            f"  hook pre-receive, one shard changed   {g['pre_receive_next_s']:6.2f} s",
            f"  hook pre-commit, new generation staged {g['pre_commit_s']:5.2f} s",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import json

    from snapops.cli._common import parse_size

    parser = argparse.ArgumentParser(
        description="time whole-generation verification and the hooks",
        epilog="example: python -m snapops.bench.generations --size 256MiB")
    parser.add_argument("--size", type=parse_size, default=parse_size("256MiB"))
    parser.add_argument("--format", action="append", choices=FORMATS)
    parser.add_argument("--workdir")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = run_generations(args.size, args.workdir, tuple(args.format or FORMATS))
    print(json.dumps(out, indent=2) if args.json else render_generations(out))
