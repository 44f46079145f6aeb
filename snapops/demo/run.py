"""The end-to-end demo: a GPT-style model trained on CPU beside a real daemon process, every
generation pushed through a guarded pre-receive to a ``git daemon`` on 127.0.0.1, then cloned,
verified, restored into a fresh model and reviewed; the numbers go to ``WORKDIR/summary.md``.

Training alternates phases without and with snapshot requests, so the cost of snapshotting is
measured in the same run, under the same machine load, rather than against another run.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


from snapops.formats.keys import generate_keys

from .model import ModelSize, build_model, parameter_count, snapshot_state, train_step
from .remote import GitDaemon, guarded_remote, repository_bytes
from .summary import Summary, fmt_mib, latencies_from_wal, write_summary

RUN = "demo"


@dataclass
class Training:
    plain: list[float] = field(default_factory=list)      # seconds per step, no request
    snapping: list[float] = field(default_factory=list)   # seconds per step incl. request()
    stalls: list[float] = field(default_factory=list)     # seconds inside request()
    requested: list[int] = field(default_factory=list)
    last_state: dict | None = None                        # copy of the newest requested state
    steps: int = 0
    loss: float = float("nan")


def write_config(work: Path, url: str, fmt: str, quick: bool) -> Path:
    config = work / "snapops.toml"
    config.write_text(f"""\
[daemon]
spool_dir = "spool"
state_dir = "state"

[client]
max_in_flight = 2
policy = "coalesce"

[snapshot]
run = "{RUN}"
format = "{fmt}"
build = "demo"
shard_max = "{'256KiB' if quick else '32MiB'}"

[seal]
hmac_key = "keys/hmac.key"
sign_key = "keys/signing.key"

[repo]
path = "repo"

[[repo.remote]]
name = "origin"
url = "{url}"

[push]
backoff_initial = 0.5
backoff_max = 5.0
""")
    return config


def train(work: Path, size: ModelSize, seconds: float, phase_steps: int, out,
          max_generations: int | None = None) -> Training:
    """Alternate phases of ``phase_steps`` steps without and with a snapshot request (one per
    snapshot phase, right after its first step) until ``seconds`` have passed (at most
    ``max_generations`` requests; later snapshot phases are timed without one)."""
    from snapops.daemon.client import Snapshotter

    model, optimizer, batch = build_model(size)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    out(f"model: {parameter_count(model) / 1e6:.2f} M parameters, {fmt_mib(nbytes)} of state "
        "(f32 weights, bf16 embeddings)")
    result = Training()
    start, phase = time.monotonic(), 0
    limit = max_generations if max_generations is not None else 1 << 62
    with Snapshotter(work / "spool", max_in_flight=2, policy="coalesce") as client:
        while time.monotonic() - start < seconds or len(result.requested) < 2:
            snapping = phase % 2 == 1 and len(result.requested) < limit
            for i in range(phase_steps):
                began = time.perf_counter()
                result.loss = train_step(model, optimizer, batch)
                result.steps += 1
                state = None
                if snapping and i == 0:
                    state = snapshot_state(model, result.steps)
                    asked = time.perf_counter()
                    client.request(state, result.steps)
                    result.stalls.append(time.perf_counter() - asked)
                (result.snapping if snapping else result.plain).append(
                    time.perf_counter() - began)
                if state is not None:  # kept for the restore check, outside the timing
                    result.requested.append(result.steps)
                    result.last_state = {k: v.detach().clone() for k, v in state.items()}
                    out(f"step {result.steps:4d} loss {result.loss:.3f} -> requested gen "
                        f"{result.steps} (request() {result.stalls[-1] * 1e3:.1f} ms)")
            phase += 1
    out(f"training: {result.steps} steps in {time.monotonic() - start:.0f} s, "
        f"final loss {result.loss:.3f}")
    return result


def wait_pushed(work: Path, gens: list[int], daemon: subprocess.Popen, timeout: float,
                out) -> tuple[set[int], dict[int, str]]:
    """Wait until every requested generation is pushed or dropped; (pushed, gen -> reason of
    the dropped ones: ``coalesced`` when a newer request replaced it before it was spooled)."""
    from snapops.daemon.lifecycle import DROPPED, PUSHED
    from snapops.daemon.wal import replay

    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + NOTE_EVERY
    while True:
        state = replay(work / "spool" / "wal.log")[0]
        done = {g: state.gens[g] for g in gens
                if g in state.gens and state.gens[g].state in (PUSHED, DROPPED)}
        finished = len(done) == len(gens)
        if not finished and time.monotonic() > next_note:
            out(waiting_note(work, len(gens) - len(done)))
            next_note = time.monotonic() + NOTE_EVERY
        if not finished and daemon.poll() is not None:
            out(f"daemon exited early with {daemon.returncode}; see {work / 'daemon.log'}")
        elif not finished and time.monotonic() > deadline:
            out("timed out waiting for the daemon; see `snapops daemon status`")
        elif not finished:
            time.sleep(0.2)
            continue
        return ({g for g, r in done.items() if r.state == PUSHED},
                {g: r.fields.get("reason", "?") for g, r in done.items() if r.state == DROPPED})


NOTE_EVERY = 30.0      # seconds between notes while the demo waits for pushes


def waiting_note(work: Path, left: int) -> str:
    """What the demo says while it waits: how many generations are left and, when the last
    push to a remote failed, why (from the daemon's ``status.json``)."""
    from snapops.cli.daemon import daemon_state

    note = f"still waiting for {left} generation(s) to be pushed"
    remotes = daemon_state(work / "state" / "status.json")[0].get("push")
    if not isinstance(remotes, dict):
        return note
    failures = [f"{name}: {state['last_error']}" for name, state in remotes.items()
                if isinstance(state, dict) and state.get("last_error")]
    if failures:
        note += "; the last push failed, retrying: " + "; ".join(failures)
    return note


def verify_clone(url: str, work: Path, out) -> tuple[int, list[str], Path]:
    """Clone the remote and verify every generation tag as CI would; (verified, failures,
    clone path)."""
    from snapops.formats.generation.source import GitTreeSource
    from snapops.formats.generation.verify import GenerationOptions, verify_generation
    from snapops.hooks.gitio import Git

    clone = work / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", url, str(clone)], check=True)
    tags = subprocess.run(["git", "-C", str(clone), "tag", "-l", f"{RUN}/gen-*"], check=True,
                          capture_output=True, text=True).stdout.split()
    options = GenerationOptions(trusted_keys=[work / "trusted"], hmac_key=work / "keys/hmac.key",
                                require_signature=True, require_hmac=True)
    failures = []
    with tempfile.TemporaryDirectory(prefix="snapops-demo-") as scratch:
        for tag in sorted(tags):
            report = verify_generation(GitTreeSource(Git(clone), tag, scratch), RUN, options)
            if not report.ok:
                failures.append(f"{tag}: {report.failure}")
            out(f"  {tag}: {'verified' if report.ok else 'FAILED ' + str(report.failure)}")
    return len(tags) - len(failures), failures, clone


def restore_check(url: str, gen: int, expected: dict, size: ModelSize, keys: Path) -> str:
    """Restore generation ``gen`` from the remote into a fresh model, as a resuming job would
    (``snapops.torch.load_state_dict``: one verified generation fetched, not the history);
    '' when every tensor came back equal with its dtype."""
    import torch

    import snapops.torch

    state = snapops.torch.load_state_dict(url, RUN, gen=gen, trusted_keys=[keys / "signing.pub"],
                                          hmac_key=keys / "hmac.key", require_signature=True,
                                          require_hmac=True)
    model, _, _ = build_model(size, seed=1)
    step = state.pop("train.step")
    model.load_state_dict(state)
    problems = [name for name, tensor in model.state_dict().items()
                if tensor.dtype != expected[name].dtype or not torch.equal(tensor, expected[name])]
    if int(step) != int(expected["train.step"]):
        problems.append("train.step")
    return ", ".join(problems)


def review_last_two(clone: Path, pushed: list[int], work: Path, out) -> list[str]:
    """``snapops diff`` of the last two pushed generations, as a reviewer runs it: one Markdown
    report (anomalies first) and one PNG in ``WORKDIR/review/``; what was written."""
    if len(pushed) < 2:
        return ["fewer than two generations pushed: nothing to review"]
    folder = work / "review"
    folder.mkdir(exist_ok=True)
    a, b = (f"{RUN}/gen-{g:06d}" for g in pushed[-2:])
    report, image = folder / "review.md", folder / "review.png"
    result = subprocess.run([sys.executable, "-m", "snapops", "diff", "--git", a, b,
                             f"snapshots/{RUN}", "--format", "md", "--output", str(report),
                             "--plot", str(image)], cwd=clone, capture_output=True, text=True)
    if result.returncode != 0:
        return [f"review FAILED: {result.stderr.strip()}"]
    out(f"review of {a} -> {b}: {report}, {image}")
    return [f"{a} -> {b}: {report.relative_to(work)}", str(image.relative_to(work))]


def run_demo(work: Path, *, quick: bool = False, seconds: float = 120.0, fmt: str = "wtxt",
             out=print) -> int:
    size = ModelSize.quick() if quick else ModelSize()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "keys" / "signing.key").exists():
        generate_keys(work / "keys")
    (work / "trusted").mkdir(exist_ok=True)
    shutil.copy(work / "keys" / "signing.pub", work / "trusted" / "signing.pub")
    guarded_remote(work / "remote.git", work / "trusted")
    with GitDaemon(work) as server:
        url = server.url("remote.git")
        config = write_config(work, url, fmt, quick)
        log = open(work / "daemon.log", "ab")
        daemon = subprocess.Popen([sys.executable, "-m", "snapops", "daemon", "run",
                                   "--config", str(config)], stdout=log, stderr=log)
        try:
            training = train(work, size, seconds, 2 if quick else 3, out,
                             max_generations=4 if quick else None)
            out("waiting for the daemon to push every generation")
            pushed, dropped = wait_pushed(work, training.requested, daemon, 900, out)
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(300)
            log.close()
        verified, failures, clone = verify_clone(url, work, out)
        restore = (restore_check(url, max(pushed), training.last_state, size, work / "keys")
                   if pushed and max(pushed) == training.requested[-1]
                   else "the newest generation was not pushed")
    review = review_last_two(clone, sorted(pushed), work, out)
    summary = Summary(
        parameters=sum(v.numel() for k, v in training.last_state.items() if k != "train.step"),
        state_bytes=sum(v.numel() * v.element_size() for v in training.last_state.values()),
        steps=training.steps, plain=training.plain, snapping=training.snapping,
        stalls=training.stalls, requested=training.requested, pushed=sorted(pushed),
        dropped=dropped,
        verified=verified, failures=failures,
        latencies=latencies_from_wal(work / "spool" / "wal.log", "origin"),
        repo_bytes=repository_bytes(work / "remote.git"), restore_problems=restore,
        review=review)
    write_summary(work / "summary.md", summary, out)
    lost = [g for g, reason in dropped.items() if reason != "coalesced"]
    ok = not failures and not restore and not lost and verified == len(pushed) > 0
    return 0 if ok else 1
