"""``snapops bench seal``: DELTA v2 size, age armor throughput, signature cost vs state size."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyrage

from snapops.formats import wtxt
from snapops.formats.armor import decrypt_io, encrypt_io
from snapops.formats.keys import generate_keys, load_public_key, load_signing_key
from snapops.formats.wtxt.delta import make_delta

from ._measure import best, fmt_bytes, measure, model_state


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


class _PatternReader:
    """``size`` bytes without holding them: one random MiB, repeated."""

    def __init__(self, size: int) -> None:
        self._left = size
        self._block = os.urandom(1 << 20)

    def read(self, n: int = -1) -> bytes:
        n = min(self._left, len(self._block) if n is None or n < 0 else n, len(self._block))
        self._left -= n
        return self._block[:n]


class _NullWriter:
    def write(self, data) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def bench_armor(size: int, *, repeat: int = 1, folder: str | os.PathLike | None = None
                ) -> dict:
    """Armored age encrypt and decrypt of ``size`` bytes: best MB/s over ``repeat`` runs by
    wall clock and by CPU time (steadier on a busy machine), and the peak extra resident
    memory. The plaintext is generated and discarded on the fly, the ciphertext goes through
    a temporary file in ``folder``: the memory figure is what the pipeline itself holds.

    >>> bench_armor(256 * 2**20)["encrypt_mb_s"]  # doctest: +SKIP
    402.3
    """
    identity = pyrage.x25519.Identity.generate()
    recipient = str(identity.to_public())
    runs: dict[str, list] = {"encrypt": [], "decrypt": []}
    with tempfile.TemporaryDirectory(dir=folder, prefix="snapops-bench-") as tmp:
        path = Path(tmp) / "bench.age"
        for _ in range(repeat):
            path.unlink(missing_ok=True)
            with open(path, "wb") as out, measure() as enc:
                encrypt_io(_PatternReader(size), out, [recipient])
            with open(path, "rb") as src, measure() as dec:
                decrypt_io(src, _NullWriter(), [identity])
            runs["encrypt"].append(enc.result)
            runs["decrypt"].append(dec.result)
        result = {"size_bytes": size, "armored_bytes": path.stat().st_size}
    for op, measured in runs.items():
        result[f"{op}_mb_s"] = round(best(measured).mbps(size), 1)
        fastest_cpu = min(m.cpu_seconds for m in measured)
        result[f"{op}_cpu_mb_s"] = round(size / max(fastest_cpu, 1e-9) / 1e6, 1)
    result["peak_extra_bytes"] = max(m.peak_extra for ms in runs.values() for m in ms)
    return result


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
