"""Benchmark: ``snapops hook pre-commit`` on one staged, signed, HMAC'd WTXT (numbers for the
README, never a test assertion).

Times, each as wall seconds of a fresh ``snapops`` process (so CLI start-up is included):

* ``precommit_s``: the hook as installed, i.e. the work-tree copy hashed against the staged
  blob id while it is verified (``snapops.useWorktree`` true, the default);
* ``precommit_blob_s``: the same hook reading the blob from ``git cat-file`` (useWorktree
  false: what happens when the work tree differs from the index);
* ``verify_file_s``: ``snapops verify FILE`` with the same keys, the floor for both;
* ``startup_s``: ``snapops --version``; ``git_add_s``: staging the file (setup, for scale).

Example::

    bench_precommit(256 << 20, "/tmp")["precommit_s"]
    # -> 1.4
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROWS = 1024  # f32 columns per row of the benchmark matrix
WTXT_PER_RAW = 1.39  # WTXT bytes per raw f32 byte (base64 4/3, line parity, chunk lines)


def _snapops() -> list[str]:
    exe = Path(sys.executable).with_name("snapops")
    return [os.fspath(exe)] if os.access(exe, os.X_OK) else [sys.executable, "-m", "snapops"]


def _timed(cmd: list[str], cwd: Path, repeat: int = 3) -> tuple[float, subprocess.CompletedProcess]:
    """Best of ``repeat`` wall times (the machine is shared; the minimum is the cost)."""
    best, proc = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        best = min(best, time.perf_counter() - start)
    return best, proc


def _make_repo(work: Path, size_bytes: int) -> tuple[Path, Path, float]:
    from snapops.formats import wtxt
    from snapops.formats.keys import generate_keys

    keys, repo = work / "keys", work / "repo"
    generate_keys(keys)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    rows = max(1, int(size_bytes / WTXT_PER_RAW) // (4 * ROWS))
    state = {"w": np.random.default_rng(0).standard_normal((rows, ROWS), dtype=np.float32)}
    snap = repo / "snapshots" / "run1" / "s.wtxt"
    snap.parent.mkdir(parents=True)
    wtxt.save(state, snap, gen=1, ts="2026-01-02T03:04:05Z", row_blocking=True,
              sign_key=keys / "signing.key", hmac_key=keys / "hmac.key")
    for key, value in (("snapops.trustedKeys", keys), ("snapops.requireSignature", "true"),
                       ("snapops.hmacKey", keys / "hmac.key"), ("snapops.requireHmac", "true")):
        subprocess.run(["git", "config", key, str(value)], cwd=repo, check=True)
    start = time.perf_counter()
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    return repo, snap, time.perf_counter() - start


def bench_precommit(size_bytes: int, workdir: str | os.PathLike | None = None) -> dict:
    """Stage a WTXT of about ``size_bytes`` in a fresh repository under ``workdir`` and time
    the pre-commit hook on it (both read paths), ``snapops verify`` and CLI start-up."""
    work = Path(tempfile.mkdtemp(prefix="snapops-bench-hooks-", dir=workdir))
    try:
        repo, snap, git_add_s = _make_repo(work, size_bytes)
        cli = _snapops()
        hook = [*cli, "hook", "pre-commit"]
        precommit_s, proc = _timed(hook, repo)
        if proc.returncode != 0:
            raise RuntimeError(f"pre-commit hook failed: {proc.stderr}")
        subprocess.run(["git", "config", "snapops.useWorktree", "false"], cwd=repo, check=True)
        blob_s, proc = _timed(hook, repo, repeat=1)
        if proc.returncode != 0:
            raise RuntimeError(f"pre-commit hook (blob path) failed: {proc.stderr}")
        keys = work / "keys"
        verify_s, _ = _timed([*cli, "verify", str(snap), "--trusted-key", str(keys),
                              "--require-signature", "--hmac-key", str(keys / "hmac.key"),
                              "--require-hmac"], repo)
        startup_s, _ = _timed([*cli, "--version"], repo)
        size = snap.stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mb = size / 1e6
    return {"file_bytes": size, "cpus": os.cpu_count(), "git_add_s": round(git_add_s, 3),
            "precommit_s": round(precommit_s, 3), "precommit_mb_s": round(mb / precommit_s, 1),
            "precommit_blob_s": round(blob_s, 3), "precommit_blob_mb_s": round(mb / blob_s, 1),
            "verify_file_s": round(verify_s, 3), "startup_s": round(startup_s, 3),
            "target_s": 2.0, "meets_target": precommit_s < 2.0}


def render_precommit(r: dict) -> str:
    return "\n".join([
        f"pre-commit on a staged {r['file_bytes'] / 2**20:.0f} MiB WTXT ({r['cpus']} CPUs):",
        f"  hook (work tree, hash-matched) {r['precommit_s']:7.3f} s  "
        f"{r['precommit_mb_s']:7.1f} MB/s  target < {r['target_s']} s: "
        f"{'met' if r['meets_target'] else 'MISSED'}",
        f"  hook (blob via git cat-file)  {r['precommit_blob_s']:7.3f} s  "
        f"{r['precommit_blob_mb_s']:7.1f} MB/s",
        f"  snapops verify FILE           {r['verify_file_s']:7.3f} s",
        f"  snapops start-up              {r['startup_s']:7.3f} s",
        f"  git add (setup)               {r['git_add_s']:7.3f} s",
    ])


if __name__ == "__main__":
    import argparse
    import json

    from snapops.cli._common import parse_size

    parser = argparse.ArgumentParser(description="time snapops hook pre-commit",
                                     epilog="example: python -m snapops.hooks.bench --size 256MiB")
    parser.add_argument("--size", type=parse_size, default=parse_size("256MiB"))
    parser.add_argument("--workdir")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = bench_precommit(args.size, args.workdir)
    print(json.dumps(result, indent=2) if args.json else render_precommit(result))
