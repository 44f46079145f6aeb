"""``snapops bench review``: the pre-commit hook on a staged WTXT, and ``snapops diff``.

Pre-commit: one staged, signed and HMAC'd WTXT of about ``size`` bytes in a fresh repository;
times, each the best wall time of a fresh ``snapops`` process (CLI start-up included):
``precommit_s`` (the hook as installed: the work-tree copy verified in place when it has the
staged blob's id), ``precommit_blob_s`` (blob streamed from ``git cat-file``), ``verify_file_s``
(``snapops verify FILE`` with the same keys, the floor for both), ``startup_s`` and
``git_add_s`` (setup, for scale).

Diff: two transformer-like states as row-blocked WTXT (what the daemon commits): ``sparse``
(1% of the rows of every matrix changed: most chunks are recognised as unchanged from their
ch-line SHA-256) and ``dense`` (every value changed), and the dense pair as ``.npz``. MB/s is
raw array bytes of one state over the wall time of the whole diff (open, index, compare); peak
memory is anonymous (what the diff allocates) and RSS (which also counts the page cache of the
mapped files).
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

from snapops.formats import wtxt
from snapops.formats.keys import generate_keys
from snapops.hooks.review import diff_paths

from ._measure import fmt_bytes, machine, measure, model_state, time_command

TS = "2026-01-01T00:00:00Z"
DIFF_TARGET_MBPS = 300
PRECOMMIT_TARGET_S = 2.0
WTXT_PER_RAW = 1.39  # WTXT bytes per raw f32 byte (base64 4/3, line parity, chunk lines)


def run_review(size: int, workdir: str | None = None, threads: int = 2) -> dict:
    return {"machine": machine(), "pre_commit": bench_precommit(size, workdir),
            "diff": bench_diff(size, workdir, threads=threads)}


def render_review(r: dict) -> str:
    return "\n".join([render_precommit(r["pre_commit"]), render_diff(r["diff"]),
                      f"(load average {r['machine']['loadavg_1min']} at the start)"])


def _snapops() -> list[str]:
    exe = Path(sys.executable).with_name("snapops")
    return [os.fspath(exe)] if os.access(exe, os.X_OK) else [sys.executable, "-m", "snapops"]


def _staged_repo(work: Path, size: int) -> tuple[Path, Path, float]:
    keys, repo = work / "keys", work / "repo"
    generate_keys(keys)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    state = model_state(int(size / WTXT_PER_RAW), layers=1, vectors=False)
    snap = repo / "snapshots" / "run1" / "s.wtxt"
    snap.parent.mkdir(parents=True)
    wtxt.save(state, snap, gen=1, ts=TS, row_blocking=True,
              sign_key=keys / "signing.key", hmac_key=keys / "hmac.key")
    for key, value in (("snapops.trustedKeys", keys), ("snapops.requireSignature", "true"),
                       ("snapops.hmacKey", keys / "hmac.key"), ("snapops.requireHmac", "true")):
        subprocess.run(["git", "config", key, str(value)], cwd=repo, check=True)
    start = time.perf_counter()
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    return repo, snap, time.perf_counter() - start


def bench_precommit(size: int, workdir: str | os.PathLike | None = None) -> dict:
    """Stage a WTXT of about ``size`` file bytes and time the pre-commit hook on it (both read
    paths), ``snapops verify`` and CLI start-up.

    >>> bench_precommit(256 << 20, "/tmp")["precommit_s"]  # doctest: +SKIP
    1.4
    """
    work = Path(tempfile.mkdtemp(prefix="snapops-bench-hooks-", dir=workdir))
    try:
        repo, snap, git_add_s = _staged_repo(work, size)
        cli = _snapops()
        hook = [*cli, "hook", "pre-commit"]
        precommit_s, proc = time_command(hook, repo)
        _check_hook(proc, "pre-commit hook")
        subprocess.run(["git", "config", "snapops.useWorktree", "false"], cwd=repo, check=True)
        blob_s, proc = time_command(hook, repo, repeat=1)
        _check_hook(proc, "pre-commit hook (blob path)")
        keys = work / "keys"
        verify_s, _ = time_command([*cli, "verify", str(snap), "--trusted-key", str(keys),
                                    "--require-signature", "--hmac-key", str(keys / "hmac.key"),
                                    "--require-hmac"], repo)
        startup_s, _ = time_command([*cli, "--version"], repo)
        file_size = snap.stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mb = file_size / 1e6
    return {"file_bytes": file_size, "git_add_s": round(git_add_s, 3),
            "precommit_s": round(precommit_s, 3), "precommit_mb_s": round(mb / precommit_s, 1),
            "precommit_blob_s": round(blob_s, 3), "precommit_blob_mb_s": round(mb / blob_s, 1),
            "verify_file_s": round(verify_s, 3), "startup_s": round(startup_s, 3),
            "target_s": PRECOMMIT_TARGET_S, "meets_target": precommit_s < PRECOMMIT_TARGET_S}


def _check_hook(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed: {proc.stderr}")


def render_precommit(r: dict) -> str:
    return "\n".join([
        f"pre-commit on a staged {fmt_bytes(r['file_bytes'])} WTXT:",
        f"  hook (work tree, hash-matched) {r['precommit_s']:7.3f} s  "
        f"{r['precommit_mb_s']:7.1f} MB/s  target < {r['target_s']} s: "
        f"{'met' if r['meets_target'] else 'MISSED'}",
        f"  hook (blob via git cat-file)  {r['precommit_blob_s']:7.3f} s  "
        f"{r['precommit_blob_mb_s']:7.1f} MB/s",
        f"  snapops verify FILE           {r['verify_file_s']:7.3f} s",
        f"  snapops start-up              {r['startup_s']:7.3f} s",
        f"  git add (setup)               {r['git_add_s']:7.3f} s",
    ])


def changed_state(state: dict[str, np.ndarray], fraction: float, seed: int = 1
                  ) -> dict[str, np.ndarray]:
    """A copy of ``state`` with ``fraction`` of the rows of every 2-D array perturbed
    (fraction 1.0: every value of every float array)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, array in state.items():
        if array.dtype.kind != "f":
            out[name] = array
            continue
        new = array.copy()
        if fraction >= 1.0:
            new += np.float32(1e-3) * rng.standard_normal(new.shape, dtype=np.float32)
        elif new.ndim == 2:
            rows = rng.choice(new.shape[0], max(1, int(new.shape[0] * fraction)), replace=False)
            new[rows] += np.float32(1e-2)
        out[name] = new
    return out


def bench_diff(size: int, workdir: str | os.PathLike | None = None, *, threads: int = 2,
               npz: bool = True) -> dict:
    """``snapops diff`` on two states of about ``size`` raw bytes each (see module docstring)."""
    state = model_state(size)
    raw = sum(a.nbytes for a in state.values())
    results: dict = {"raw_bytes": raw, "arrays": len(state), "threads": threads,
                     "target_MBps": DIFF_TARGET_MBPS, "scenarios": {}}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-diff-bench-") as tmp:
        folder = Path(tmp)
        base = folder / "a.wtxt"
        first = wtxt.save(state, base, gen=1, ts=TS, row_blocking=True, threads=threads)
        results["file_bytes"] = os.path.getsize(base)
        for label, fraction in (("sparse", 0.01), ("dense", 1.0)):
            target = folder / f"b-{label}.wtxt"
            other = changed_state(state, fraction)
            wtxt.save(other, target, gen=2, ts=TS, row_blocking=True, threads=threads,
                      merkle_prev=first.merkle_this)
            if label == "dense" and npz:
                np.savez(folder / "a.npz", **state)
                np.savez(folder / "b.npz", **other)
            del other
            results["scenarios"][label] = _time_diff(base, target, raw, threads)
            target.unlink()
        if npz:
            results["scenarios"]["dense_npz"] = _time_diff(folder / "a.npz", folder / "b.npz",
                                                           raw, threads)
    return results


def _time_diff(a: Path, b: Path, raw: int, threads: int) -> dict:
    with measure() as m:
        report = diff_paths(a, b, threads=threads)
    c = report.counts()
    r = m.result
    return {"seconds": r.seconds, "MBps": r.mbps(raw), "cpu_seconds": r.cpu_seconds,
            "peak_rss_extra": r.peak_extra, "peak_anon_extra": r.peak_anon_extra,
            "blocks": c["blocks"], "blocks_changed": c["blocks_changed"],
            "meets_target": r.mbps(raw) >= DIFF_TARGET_MBPS}


def render_diff(r: dict) -> str:
    lines = [f"snapops diff: 2 x {fmt_bytes(r['raw_bytes'])} raw in {r['arrays']} arrays "
             f"(WTXT file {fmt_bytes(r.get('file_bytes', 0))}), {r['threads']} threads"]
    for name, s in r["scenarios"].items():
        lines.append(f"  {name:10s}: {s['MBps']:7.0f} MB/s  {s['seconds']:6.2f} s  cpu "
                     f"{s['cpu_seconds']:6.2f} s  peak extra memory "
                     f"{fmt_bytes(s['peak_anon_extra'])} (RSS incl. mapped files "
                     f"{fmt_bytes(s['peak_rss_extra'])})  "
                     f"blocks {s['blocks_changed']}/{s['blocks']}  "
                     f"(target >= {r['target_MBps']} MB/s)")
    return "\n".join(lines)
