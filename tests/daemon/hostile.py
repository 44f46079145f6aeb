"""What a buggy or hostile trainer can leave in a spool folder, and how the tests look at the
daemon's answer: spool files with crafted headers, WAL records written as a trainer would,
and the status dict of ``snapops daemon status --json`` (the real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from snapops.daemon.client import WAL_NAME
from snapops.daemon.lifecycle import REQ, SPOOLED
from snapops.daemon.spool import MAGIC, spool_name
from snapops.daemon.wal import Wal

from .daemon_env import DaemonEnv, state_for


def spool_bytes(header: bytes) -> bytes:
    """A spool file made of ``header`` (one line of would-be JSON) and no data."""
    head = MAGIC + header + b"\n"
    return head + bytes(-len(head) % 64)


def inject(env: DaemonEnv, gen: int, content: bytes | None = None, *, file: str | None = None,
           writer: str = "0") -> None:
    """REQ and SPOOLED of ``gen`` as a trainer writes them; ``content`` (if given) becomes the
    spool file first. ``file`` is the name the SPOOLED record gives, as is."""
    env.spool.mkdir(parents=True, exist_ok=True)
    name = file or spool_name(gen)
    if content is not None:
        (env.spool / name).write_bytes(content)
    wal = Wal(env.spool / WAL_NAME, writer=writer)
    try:
        wal.append(REQ, gen, pid=os.getpid(), arrays=1, bytes=64)
        wal.append(SPOOLED, gen, file=name, bytes=len(content or b""))
    finally:
        wal.close()


def set_daemon_options(env: DaemonEnv, **options) -> None:
    """Add keys to the [daemon] table of the test config."""
    lines = "".join(f"{key} = {value}\n" for key, value in options.items())
    env.config.write_text(env.config.read_text().replace("[daemon]\n", "[daemon]\n" + lines, 1))


def cli_status(env: DaemonEnv) -> dict:
    """``snapops daemon status --json`` run as its own process."""
    proc = subprocess.run([sys.executable, "-m", "snapops", "daemon", "status", "--config",
                           str(env.config), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def dropped(status: dict, gen: int) -> dict:
    """The ``dropped_details`` entry of ``gen``."""
    found = [d for d in status["dropped_details"] if d["gen"] == gen]
    assert found, (gen, status["dropped_details"])
    return found[0]


def pushed(env: DaemonEnv, gen: int):
    def check() -> bool:
        record = env.state().gens.get(gen)
        return record is not None and record.fully_pushed(set(env.remotes))
    return check


def request_pushed(env: DaemonEnv, gen: int, timeout: float = 90.0) -> dict[str, np.ndarray]:
    """Request ``gen`` through a real Snapshotter and wait until every remote has it."""
    state = state_for(gen)
    with env.client() as client:
        client.request(state, gen)
    env.wait(pushed(env, gen), timeout, what=f"gen {gen} pushed")
    return state
