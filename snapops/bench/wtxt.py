"""``snapops bench wtxt``: what WTXT costs next to one SHA-256 pass, plain and sealed.

Measured in one run, interleaved round by round after a warm-up round: one hashlib SHA-256
pass over the state; ``save`` plain and sealed (HMAC key + Ed25519 signing key, what the daemon
writes); ``verify`` without keys and with the HMAC key and trusted key (signature and HMAC
required); ``load`` of the sealed file; and the disk's floor for a save: writing and fsyncing
as many (random) bytes as the file holds, shown in MB/s of the state's raw bytes. Every
round's saves (and the disk floor) write new files, as the daemon's do (it saves each shard
as ``.NAME.new`` and renames it over the previous generation's file afterwards): the files
of the round before are deleted between rounds, untimed, so no save pays for freeing the
blocks and page cache of the file it would replace (0.1 s of a 0.8 s save of 256 MiB). Each is
reported as MB/s of raw array bytes (median run), as a ratio to the SHA-256 pass of the same
run, with its CPU seconds (all threads: how well both cores are used) and its peak extra
memory: anonymous memory the operation allocates (its resident size also counts the page
cache of the files it maps, e.g. the save's read-back of its own file for the digest; that
is in the JSON as ``peak_rss_extra``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from snapops.formats import wtxt
from snapops.formats.keys import generate_keys

from ._measure import fmt_bytes, machine, median, model_state, run_rounds

TS = "2026-01-01T00:00:00Z"
# Targets as ratios to one SHA-256 pass (issue 16); a sealed file costs four SHA-256 passes.
TARGETS = {"encode_sealed": 0.25, "verify_keyed": 0.32, "encode_plain": 0.30, "load": 0.30}
LABELS = {
    "sha256": "hashlib SHA-256, one pass",
    "encode_plain": "save, plain",
    "encode_sealed": "save, sealed (HMAC + sign)",
    "verify": "verify, no keys",
    "verify_keyed": "verify, HMAC key + trusted key",
    "load": "load (sealed file, no keys)",
    "disk": "disk: fsync'd write, file's size",
}
TEXT_PER_RAW = 4 / 3 * 79 / 76   # base64, then 76 characters + " p\n" per line


def _operations(state: dict, folder: Path, row_blocking: bool, threads: int, sizes: dict
                ) -> tuple[dict, Callable[[], None]]:
    """The timed operations, and what runs between rounds: note the files' sizes in
    ``sizes``, then delete them, so the next round writes new files."""
    keys = folder / "keys"
    generate_keys(keys)
    plain, sealed = folder / "plain.wtxt", folder / "sealed.wtxt"
    common = dict(gen=1, ts=TS, row_blocking=row_blocking, threads=threads)
    sealing = dict(hmac_key=keys / "hmac.key", sign_key=keys / "signing.key")
    checking = dict(hmac_key=keys / "hmac.key", trusted_keys=[keys / "signing.pub"],
                    require_signature=True, require_hmac=True)

    text = np.random.default_rng(0).bytes(int(sum(a.nbytes for a in state.values())
                                             * TEXT_PER_RAW))

    def disk():
        """The durable-write floor: as many bytes as the file, written and fsynced."""
        with open(folder / "disk.bin", "wb", buffering=0) as f:
            f.write(text)
            os.fsync(f.fileno())

    def verified(**options):
        report = wtxt.verify(sealed, workers=threads, **options)
        if not report.ok:
            raise RuntimeError(f"benchmark file failed verification: {report.failure}")

    def between_rounds() -> None:
        for name, path in (("plain", plain), ("sealed", sealed), ("disk", folder / "disk.bin")):
            sizes[name] = path.stat().st_size
            path.unlink()

    return {
        "sha256": lambda: [hashlib.sha256(a).digest() for a in state.values()],
        "encode_plain": lambda: wtxt.save(state, plain, **common),
        "encode_sealed": lambda: wtxt.save(state, sealed, **common, **sealing),
        "verify": verified,
        "verify_keyed": lambda: verified(**checking),
        "load": lambda: wtxt.load(sealed, workers=threads),
        "disk": disk,
    }, between_rounds


def run_wtxt(size: int, workdir: str | None = None, row_blocking: bool = True,
             threads: int = 2, rounds: int = 3) -> dict:
    """Measure every operation ``rounds`` times (after one warm-up round); medians."""
    state = model_state(size)
    raw = sum(a.nbytes for a in state.values())
    before = machine()
    with tempfile.TemporaryDirectory(dir=workdir, prefix="snapops-bench-wtxt-") as tmp:
        folder = Path(tmp)
        sizes: dict[str, int] = {}
        operations, between_rounds = _operations(state, folder, row_blocking, threads, sizes)
        runs = run_rounds(operations, rounds, after_round=between_rounds)
    sha = median(runs["sha256"]).mbps(raw)
    ops = {}
    for name, measured in runs.items():
        m = median(measured)
        ops[name] = {"MBps": m.mbps(raw), "ratio_to_sha256": m.mbps(raw) / sha,
                     "seconds": m.seconds, "cpu_seconds": m.cpu_seconds,
                     "cores_used": m.cpu_seconds / m.seconds,
                     "peak_extra": max(r.peak_anon_extra for r in measured),
                     "peak_rss_extra": max(r.peak_extra for r in measured),
                     "target_ratio": TARGETS.get(name),
                     "all_MBps": [r.mbps(raw) for r in measured]}
    ops["load"]["peak_extra_beyond_arrays"] = max(0, ops["load"]["peak_extra"] - raw)
    return {"raw_bytes": raw, "arrays": len(state),
            "file_bytes": {"plain": sizes["plain"], "sealed": sizes["sealed"]},
            "row_blocking": row_blocking, "threads": threads, "rounds": rounds,
            "machine_before": before, "machine_after": machine(), "operations": ops}


def render_wtxt(r: dict) -> str:
    lines = [
        f"WTXT bench: {fmt_bytes(r['raw_bytes'])} raw in {r['arrays']} arrays (files: plain "
        f"{fmt_bytes(r['file_bytes']['plain'])}, sealed {fmt_bytes(r['file_bytes']['sealed'])}"
        f"; row_blocking={r['row_blocking']}); median of {r['rounds']} rounds; load average "
        f"{r['machine_before']['loadavg_1min']} -> {r['machine_after']['loadavg_1min']}",
        f"  {'operation':32s} {'MB/s':>7s} {'x SHA':>6s} {'target':>7s} {'CPU s':>6s} "
        f"{'cores':>5s}  extra memory (anonymous, after a warm-up round)",
    ]
    for name, op in r["operations"].items():
        target = f">={op['target_ratio']:.2f}" if op["target_ratio"] else ""
        peak = op.get("peak_extra_beyond_arrays", op["peak_extra"])
        lines.append(
            f"  {LABELS[name]:32s} {op['MBps']:7.0f} {op['ratio_to_sha256']:6.3f} {target:>7s} "
            f"{op['cpu_seconds']:6.2f} {op['cores_used']:5.2f}  {fmt_bytes(peak)}"
            + (" beyond the arrays" if name == "load" else ""))
    return "\n".join(lines)
