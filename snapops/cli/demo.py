"""snapops demo: the main job, end to end, on this machine.

Until the daemon lands (issue 4) this runs the WTXT pipeline in-process: a small numpy
training loop snapshots its weights every few steps into sealed, row-blocked WTXT files
chained by merkle links, verifies every file, loads it back and checks it bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from snapops.formats import wtxt
from snapops.formats.keys import generate_keys
from snapops.formats.model import Snapshot

from ._common import add_command


def train_steps(steps: int, seed: int = 0):
    """A tiny linear-regression training loop; yields (step, state) after each step."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    true_w = rng.standard_normal((64, 16)).astype(np.float32)
    y = x @ true_w
    w = np.zeros((64, 16), np.float32)
    b = np.zeros(16, np.float32)
    for step in range(1, steps + 1):
        err = x @ w + b - y
        w -= 0.05 * (x.T @ err) / len(x)
        b -= 0.05 * err.mean(axis=0)
        yield step, {"w": w.copy(), "b": b.copy(), "step": np.array(step, np.int64),
                     "loss": np.array(float((err ** 2).mean()), np.float64)}


def run(args) -> int:
    work = Path(args.workdir)
    keys = work / "keys"
    if not (keys / "signing.key").exists():
        generate_keys(keys)
    out = work / "snapshots"
    out.mkdir(parents=True, exist_ok=True)
    merkle_prev, written, failures = None, 0, 0
    for step, state in train_steps(args.steps):
        if step % args.every:
            continue
        gen = step // args.every
        path = out / f"gen-{gen:06d}.wtxt"
        result = wtxt.save(state, path, gen=gen, row_blocking=True, merkle_prev=merkle_prev,
                           hmac_key=keys / "hmac.key", sign_key=keys / "signing.key",
                           build="demo", audit=f"loss={float(state['loss']):.6g}")
        report = wtxt.verify(path, hmac_key=keys / "hmac.key", trusted_keys=[keys],
                             require_hmac=True, require_signature=True)
        same = wtxt.load(path).equal(Snapshot(state))
        ok = report.ok and same
        failures += not ok
        written += 1
        print(f"gen {gen:3d} step {step:4d} loss {float(state['loss']):10.4f} "
              f"{'verified' if ok else 'FAILED: ' + str(report.failure)}  {path.name} "
              f"merkle {result.merkle_this[:12]}")
        merkle_prev = result.merkle_this
    print(f"{written} snapshots written to {out}, {written - failures} verified, "
          f"{failures} failed")
    return 0 if failures == 0 and written else 1


def register(sub) -> None:
    p = add_command(
        sub, "demo", help="run the end-to-end demo (training loop + verified snapshots)",
        description="Run a small numpy training loop that snapshots its weights every few "
                    "steps as sealed (HMAC + Ed25519), row-blocked, merkle-chained WTXT files, "
                    "then verifies and reloads each one. Exit 0 only if all verified.",
        example="snapops demo --workdir demo-work --steps 60", func=run)
    p.add_argument("--workdir", default="demo-work", help="folder for keys and snapshots")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--every", type=int, default=10, help="snapshot every N steps (default 10)")
