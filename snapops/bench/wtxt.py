"""``snapops bench wtxt``: WTXT encode / verify / decode throughput and peak extra memory."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from snapops.formats import wtxt

from ._measure import fmt_bytes, measure, model_state


def run_wtxt(size: int, workdir: str | None = None, row_blocking: bool = True,
             threads: int = 2) -> dict:
    state = model_state(size)
    raw = sum(a.nbytes for a in state.values())
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "bench.wtxt"
        with measure() as sha:
            for array in state.values():
                hashlib.sha256(array).digest()
        with measure() as enc:
            wtxt.save(state, path, gen=1, ts="2026-01-01T00:00:00Z", row_blocking=row_blocking,
                      threads=threads)
        with measure() as ver:
            report = wtxt.verify(path, workers=threads)
        with measure() as dec:
            loaded = wtxt.load(path, workers=threads)
        del loaded
        with measure() as dec2:  # the allocator now has warm memory to reuse
            loaded = wtxt.load(path, workers=threads)
        file_size = os.path.getsize(path)
    if not report.ok:
        raise RuntimeError(f"benchmark file failed verification: {report.failure}")
    del loaded
    results = {
        "raw_bytes": raw, "file_bytes": file_size, "arrays": len(state),
        "row_blocking": row_blocking,
        "sha256_MBps": sha.result.mbps(raw),
        "encode_MBps": enc.result.mbps(raw), "encode_peak_extra": enc.result.peak_extra,
        "verify_MBps": ver.result.mbps(raw), "verify_peak_extra": ver.result.peak_extra,
        "decode_MBps": dec.result.mbps(raw), "decode_again_MBps": dec2.result.mbps(raw),
        "decode_peak_extra_beyond_arrays": max(0, dec.result.peak_extra - raw),
        "cpu_seconds": {"encode": enc.result.cpu_seconds, "verify": ver.result.cpu_seconds,
                        "decode": dec.result.cpu_seconds},
    }
    return results


def render_wtxt(r: dict) -> str:
    lines = [
        f"WTXT bench: {fmt_bytes(r['raw_bytes'])} raw in {r['arrays']} arrays "
        f"(file {fmt_bytes(r['file_bytes'])}, row_blocking={r['row_blocking']})",
        f"  hashlib sha256, one pass : {r['sha256_MBps']:8.0f} MB/s",
        f"  encode (save)            : {r['encode_MBps']:8.0f} MB/s   peak extra "
        f"{fmt_bytes(r['encode_peak_extra'])}   (target >= 250 MB/s, < 64 MiB)",
        f"  verify                   : {r['verify_MBps']:8.0f} MB/s   peak extra "
        f"{fmt_bytes(r['verify_peak_extra'])}   (target >= 300 MB/s, < 64 MiB)",
        f"  decode (load)            : {r['decode_MBps']:8.0f} MB/s   peak beyond arrays "
        f"{fmt_bytes(r['decode_peak_extra_beyond_arrays'])}   (target >= 300 MB/s)",
        f"  decode again (warm memory): {r['decode_again_MBps']:8.0f} MB/s   (the first load "
        f"pays for fresh pages from the OS)",
    ]
    return "\n".join(lines)
