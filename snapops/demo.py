"""The end-to-end demo: a training loop beside a real daemon process, pushing verified
snapshots to a local bare Git remote, then verifying the remote's whole history."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from snapops.formats.keys import generate_keys


def write_config(work: Path, fmt: str) -> Path:
    config = work / "snapops.toml"
    config.write_text(f"""\
[daemon]
spool_dir = "spool"
state_dir = "state"
poll_interval = 0.5

[client]
max_in_flight = 2
policy = "block"

[snapshot]
run = "demo"
format = "{fmt}"
build = "demo"
shard_max = "256KiB"

[seal]
hmac_key = "keys/hmac.key"
sign_key = "keys/signing.key"

[repo]
path = "repo"

[[repo.remote]]
name = "origin"
url = "{work / 'remote.git'}"

[push]
backoff_initial = 0.5
backoff_max = 5.0
""")
    return config


def numpy_training(steps: int, seed: int = 0):
    """Linear regression by gradient descent; yields (step, state, loss)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((512, 96)).astype(np.float32)
    true_w = rng.standard_normal((96, 32)).astype(np.float32)
    y = x @ true_w
    w = np.zeros((96, 32), np.float32)
    b = np.zeros(32, np.float32)
    emb = rng.standard_normal((2048, 64)).astype(np.float32)
    for step in range(1, steps + 1):
        err = x @ w + b - y
        w -= 0.05 * (x.T @ err) / len(x)
        b -= 0.05 * err.mean(axis=0)
        emb[step % 2048] *= 0.99  # a sparse update: one row per step
        loss = float((err ** 2).mean())
        yield step, {"layer.w": w, "layer.b": b, "emb.weight": emb,
                     "step": np.array(step, np.int64)}, loss


def torch_training(steps: int, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(512, 96), torch.randn(512, 32)
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        yield step, model.state_dict(), loss.item()


def run_demo(work: Path, steps: int, every: int, fmt: str, use_torch: bool, out=print) -> int:
    from snapops.config import load_config
    from snapops.daemon.client import WAL_NAME, Snapshotter
    from snapops.daemon.service import status_from
    from snapops.daemon.wal import replay

    work.mkdir(parents=True, exist_ok=True)
    if not (work / "keys" / "signing.key").exists():
        generate_keys(work / "keys")
    if not (work / "remote.git").exists():
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(work / "remote.git")],
                       check=True)
    config_path = write_config(work, fmt)
    config = load_config(config_path)
    log = open(work / "daemon.log", "ab")
    daemon = subprocess.Popen([sys.executable, "-m", "snapops", "daemon", "run", "--config",
                               str(config_path)], stdout=log, stderr=log)
    training = torch_training if use_torch else numpy_training
    if use_torch:
        import torch  # noqa: F401  (imported before the clock starts)
    requested: dict[int, dict[str, np.ndarray]] = {}
    start = time.monotonic()
    try:
        with Snapshotter(work / "spool", max_in_flight=2, policy="block") as client:
            last_gen = replay(work / "spool" / WAL_NAME)[0].gens
            base = max(last_gen, default=0)
            for step, state, loss in training(steps):
                if step % every == 0:
                    gen = base + step // every
                    client.request(state, gen)
                    requested[gen] = {k: _as_numpy(v) for k, v in state.items()}
                    out(f"step {step:4d} loss {loss:10.4f} -> requested gen {gen}")
        out(f"training done in {time.monotonic() - start:.1f}s; waiting for the daemon to push")
        wal = work / "spool" / WAL_NAME
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = status_from(replay(wal)[0], {"origin"})
            if status["last_pushed"].get("origin") == max(requested) and \
                    not status["push_queue_depth"] and not status["waiting_to_serialize"]:
                break
            if daemon.poll() is not None:
                out(f"daemon exited early with {daemon.returncode}; see {work / 'daemon.log'}")
                return 1
            time.sleep(0.2)
        else:
            out("timed out waiting for the daemon; see snapops daemon status")
            return 1
        out(f"all generations pushed {time.monotonic() - start:.1f}s after the first step")
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
        log.close()
    return verify_remote(work, config, requested, out)


def _as_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy().copy()
    return np.array(value, copy=True)


def verify_remote(work: Path, config, requested: dict[int, dict], out=print) -> int:
    """Clone the remote and verify every generation's commit: shards, MANIFEST, ledger,
    signatures, HMACs, and the arrays against what training requested."""
    from snapops.formats.generation.load import load_from_source
    from snapops.formats.generation.source import FolderSource
    from snapops.formats.generation.verify import GenerationOptions, verify_generation

    run = config.snapshot.run
    failures = 0
    with tempfile.TemporaryDirectory(prefix="snapops-demo-verify-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(work / "remote.git"), str(clone)], check=True)
        tags = subprocess.run(["git", "-C", str(clone), "tag", "-l", f"{run}/gen-*"],
                              check=True, capture_output=True, text=True).stdout.split()
        for tag in sorted(tags):
            gen = int(tag.rsplit("-", 1)[1])
            subprocess.run(["git", "-C", str(clone), "checkout", "-q", tag], check=True)
            report = verify_generation(FolderSource(clone), run, GenerationOptions(
                hmac_key=work / "keys" / "hmac.key", trusted_keys=[work / "keys" / "signing.pub"],
                require_signature=True, require_hmac=True))
            same = True
            if gen in requested:
                loaded = load_from_source(FolderSource(clone), run, verify=False)
                same = all(np.array_equal(loaded[k], v) for k, v in requested[gen].items())
            ok = report.ok and same
            failures += not ok
            detail = (f"{report.details.get('shards')} shards, {report.raw_bytes} bytes, "
                      f"MANIFEST {report.details.get('digest', '')[:12]}") if report.ok else \
                str(report.failure)
            out(f"  {tag}: {'verified' if ok else 'FAILED'} ({detail}"
                f"{'' if same else '; arrays differ from what training requested'})")
        missing = sorted(set(requested) - {int(t.rsplit('-', 1)[1]) for t in tags})
    out(f"remote {work / 'remote.git'}: {len(tags)} generations, {len(tags) - failures} verified,"
        f" {failures} failed, {len(missing)} missing {missing if missing else ''}".rstrip())
    return 0 if not failures and not missing and tags else 1
