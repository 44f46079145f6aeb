"""``snapops bench seal``: DELTA v2 size, age armor throughput, signature cost vs state size."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from snapops.formats import wtxt
from snapops.formats.armor import bench_armor
from snapops.formats.keys import generate_keys
from snapops.formats.wtxt.delta import make_delta

from ._measure import fmt_bytes, model_state


def delta_sizes(folder: Path, rows_per_chunk: int) -> list[dict]:
    """Delta vs full file for a row-blocked 4096x1024 f32 matrix with 1% / 10% rows changed."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4096, 1024), dtype=np.float32)
    first = wtxt.save({"R": base}, folder / "g1.wtxt", gen=1, ts="2026-01-01T00:00:00Z",
                      rows_per_chunk=rows_per_chunk)
    out = []
    for share in (0.01, 0.10):
        for pattern in ("random", "contiguous"):
            target = base.copy()
            count = int(4096 * share)
            rows = (rng.choice(4096, count, replace=False) if pattern == "random"
                    else np.arange(1000, 1000 + count))
            target[rows] += 0.001
            wtxt.save({"R": target}, folder / "g2.wtxt", gen=2, ts="2026-01-01T00:00:00Z",
                      rows_per_chunk=rows_per_chunk, merkle_prev=first.merkle_this)
            stats = make_delta(folder / "g1.wtxt", folder / "g2.wtxt", folder / "d.wtxtdelta")
            out.append({"rows_changed": share, "pattern": pattern,
                        "rows_per_chunk": rows_per_chunk, "full_bytes": stats.target_bytes,
                        "delta_bytes": stats.delta_bytes,
                        "delta_share": stats.delta_bytes / stats.target_bytes})
    return out


def signature_cost(folder: Path) -> list[dict]:
    keys = folder / "keys"
    generate_keys(keys)
    out = []
    for size in (1 << 20, 64 << 20):
        path = folder / "s.wtxt"
        state = model_state(size)
        wtxt.save(state, path, gen=1, ts="2026-01-01T00:00:00Z")
        text = path.read_bytes()
        header = text[:text.index(b"\narr ") + 1]
        from snapops.formats.keys import load_public_key, load_signing_key

        key, pub = load_signing_key(keys / "signing.key"), load_public_key(keys / "signing.pub")
        t0 = time.perf_counter()
        for _ in range(200):
            signature = key.sign(header)
        t1 = time.perf_counter()
        for _ in range(200):
            pub.verify(signature, header)
        t2 = time.perf_counter()
        out.append({"state_bytes": size, "signed_bytes": len(header),
                    "sign_us": (t1 - t0) / 200 * 1e6, "verify_us": (t2 - t1) / 200 * 1e6})
    return out


def run_seal(size: int, workdir: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp)
        deltas = delta_sizes(folder, 1) + delta_sizes(folder, 8)
        signatures = signature_cost(folder)
        armor = bench_armor(size, repeat=2, folder=folder)
    return {"delta": deltas, "signature": signatures, "armor": armor}


def render_seal(r: dict) -> str:
    lines = ["DELTA v2 vs full file, row-blocked 4096x1024 f32 (target: 1% rows -> <= 3%):"]
    for d in r["delta"]:
        lines.append(f"  {d['rows_changed']:4.0%} rows {d['pattern']:10s} rows_per_chunk="
                     f"{d['rows_per_chunk']}: {fmt_bytes(d['delta_bytes']):>10s} of "
                     f"{fmt_bytes(d['full_bytes'])} = {d['delta_share']:6.2%}")
    lines.append("Ed25519 sign/verify of the header (independent of state size):")
    for s in r["signature"]:
        lines.append(f"  state {fmt_bytes(s['state_bytes']):>9s}: {s['signed_bytes']} header "
                     f"bytes, sign {s['sign_us']:.0f} us, verify {s['verify_us']:.0f} us")
    a = r["armor"]
    lines.append(f"age ASCII armor, {fmt_bytes(a['size_bytes'])} (target >= 300 MB/s): encrypt "
                 f"{a['encrypt_mb_s']:.0f} MB/s, decrypt {a['decrypt_mb_s']:.0f} MB/s, peak "
                 f"extra {fmt_bytes(a['peak_extra_bytes'])}")
    return "\n".join(lines)
