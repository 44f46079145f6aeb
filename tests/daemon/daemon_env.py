"""A real daemon environment for tests: config, keys, remotes, a daemon subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from snapops.daemon.client import WAL_NAME, Snapshotter
from snapops.daemon.lifecycle import DROPPED
from snapops.daemon.walstatus import status_from
from snapops.daemon.wal import replay
from snapops.formats.keys import generate_keys

from .gitserve import GitDaemon, git, init_bare


class DaemonEnv:
    def __init__(self, root: Path, remotes: dict[str, str], *, fmt: str = "wtxt",
                 repo: Path | None = None, extra: str = "", shard_max: str = "64KiB",
                 repo_extra: str = "") -> None:
        self.root = root
        self.keys = root / "keys"
        if not self.keys.exists():
            generate_keys(self.keys)
        self.remotes = remotes
        self.repo = repo or root / "repo"
        remote_tables = "".join(f'[[repo.remote]]\nname = "{n}"\nurl = "{u}"\n'
                                for n, u in remotes.items())
        self.config = root / "snapops.toml"
        self.config.write_text(f"""\
[daemon]
poll_interval = 0.2
[snapshot]
run = "t"
format = "{fmt}"
shard_max = "{shard_max}"
build = "test"
[seal]
hmac_key = "keys/hmac.key"
sign_key = "keys/signing.key"
[repo]
path = "{self.repo}"
{repo_extra}{remote_tables}[push]
backoff_initial = 0.2
backoff_max = 1.0
timeout = 20.0
{extra}""")
        self.log = root / "daemon.log"
        self.proc: subprocess.Popen | None = None
        self.spool = root / "spool"

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``snapops daemon run``; ``env``: variables added to its environment."""
        assert self.proc is None or self.proc.poll() is not None
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "snapops", "daemon", "run", "--config", str(self.config)],
                stdout=log, stderr=log,
                env={**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})})
        return self.proc

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the running daemon has written its status file (its signal handlers are set)."""
        import json

        def ready() -> bool:
            try:
                return json.loads((self.root / "state" / "status.json").read_text()).get(
                    "pid") == self.proc.pid
            except (OSError, ValueError):
                return False

        self.wait(ready, timeout, what="daemon start-up")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.wait_ready()
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def client(self, **kwargs) -> Snapshotter:
        return Snapshotter(self.spool, **kwargs)

    def state(self):
        return replay(self.spool / WAL_NAME)[0]

    def status(self) -> dict:
        return status_from(self.state(), set(self.remotes))

    def wait(self, predicate, timeout: float = 90.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited ({self.proc.returncode}) while waiting for "
                                     f"{what}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; status {self.status()}\n"
                             f"{self.log.read_text()[-3000:]}")

    def push_all(self, states: dict, what: str = "generations pushed",
                 timeout: float = 90.0) -> None:
        """Start the daemon, request every ``gen -> state``, wait until all are pushed and
        stop it with SIGTERM (exit 0); the daemon is killed whatever happens."""
        try:
            self.start()
            with self.client(policy="block") as client:
                for gen, state in states.items():
                    client.request(state, gen)
            self.wait(self.all_pushed, timeout=timeout, what=what)
            assert self.terminate() == 0
        finally:
            self.kill()

    def kill_cycles(self, rng, cycles: int, request, pause: tuple[float, float]) -> None:
        """``cycles`` times: start the daemon, ``request(client)``, SIGKILL it after a random
        pause; then start it once more, wait until everything is pushed and stop it with
        SIGTERM (exit 0). The daemon is killed whatever happens."""
        try:
            for _ in range(cycles):
                self.start()
                with self.client(max_in_flight=2) as client:
                    request(client)
                time.sleep(rng.uniform(*pause))
                self.kill()
            self.start()
            self.wait(self.all_pushed, what="recovery after SIGKILLs")
            assert self.terminate() == 0
        finally:
            self.kill()

    def all_pushed(self) -> bool:
        state = self.state()
        pending = [g for g in state.gens.values() if g.state != DROPPED
                   and not g.fully_pushed(set(self.remotes))]
        return bool(state.gens) and not pending

    def remote_tags(self, url: str) -> list[str]:
        out = git("ls-remote", "--tags", url)
        return sorted({line.split("refs/tags/")[1].removesuffix("^{}")
                       for line in out.splitlines() if "refs/tags/" in line})


def state_for(gen: int, rows: int = 256, cols: int = 64, bias: int = 16
              ) -> dict[str, np.ndarray]:
    """A small deterministic state; each gen changes one row of the embedding and the step."""
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((rows, cols)).astype(np.float32)
    emb[gen % rows] += gen
    return {"emb.weight": emb, "head.bias": np.full(bias, gen, np.float64),
            "step": np.array(gen, np.int64)}


def down_remote(root: Path, name: str = "net") -> tuple[Path, GitDaemon, DaemonEnv]:
    """A bare remote ``snap.git`` behind a git daemon that is not started yet (the remote is
    down until ``server.start()``), and a DaemonEnv pushing to it as ``name``."""
    served = root / "served"
    served.mkdir()
    init_bare(served / "snap.git")
    server = GitDaemon(served)
    return served, server, DaemonEnv(root, {name: server.url("snap.git")})
