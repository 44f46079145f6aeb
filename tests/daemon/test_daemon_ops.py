"""The daemon's operations with real git: an idle daemon does nothing on its own (or anyone's)
file activity; its git children die with it; the ``-delta`` attributes reach every clone; its
work repository stays bounded while the remote keeps the whole history."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from snapops.config import load_config
from snapops.daemon.lifecycle import COMMITTED, PUSHED
from snapops.daemon.maintenance import history_cut
from snapops.daemon.service import STATUS_EVERY, Daemon
from snapops.daemon.wal import Record, WalState, replay
from snapops.formats.gitcmd import invocations

from .daemon_env import DaemonEnv, state_for
from .gitserve import git, git_daemon, init_bare  # noqa: F401
from .test_service import pushed_counts, verify_remote
from .throttle import ThrottledProxy

QUIET = {"daemon.nice": 0, "daemon.cpu_policy": "normal", "daemon.io_class": "none",
         "daemon.poll_interval": 0.5}


def wait_for(predicate, within: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def settled(daemon: Daemon, quiet: float = 1.0) -> bool:
    """True once the daemon took no step for ``quiet`` seconds, owes no status rewrite and
    began none in that time (a rewrite clears the flag first, then writes: one still under
    way would land later)."""
    steps = daemon.steps
    time.sleep(quiet)
    last_write = daemon._status_due - STATUS_EVERY
    return daemon.steps == steps and not daemon._status_dirty \
        and time.monotonic() - last_write >= quiet


def test_an_idle_daemon_does_no_work_on_file_activity_that_brings_nothing_new(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    daemon = Daemon(load_config(env.config, overrides=QUIET))
    thread = threading.Thread(target=daemon.run, name="daemon-under-test")
    with env.client(policy="block") as client:
        client.request(state_for(1), 1)  # a WAL and a spool file are present from now on
        thread.start()
        try:
            wait_for(env.all_pushed, what="gen 1 pushed")
            wait_for(lambda: settled(daemon), what="the daemon to settle")
            status = tmp_path / "state" / "status.json"
            before = (daemon.steps, daemon.wakeups, invocations(), status.stat().st_mtime_ns)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:  # what `daemon status` and other tools do
                replay(env.spool / "wal.log")
                (env.spool / "notes.txt").write_text("not the WAL\n")
                time.sleep(0.05)
            steps, wakeups, gits, mtime = before
            assert (daemon.steps, invocations(), status.stat().st_mtime_ns) == (steps, gits, mtime)
            assert daemon.wakeups - wakeups <= 3.0 / 0.5 + 1  # the safety interval only
            client.request(state_for(2), 2)  # news: it wakes at once and does the work
            wait_for(env.all_pushed, what="gen 2 pushed")
            assert daemon.steps > steps and invocations() > gits
        finally:
            daemon.stop()
            thread.join(60)
    assert not thread.is_alive()


def session_members(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``sid``."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_bytes()
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # state ppid pgrp session
        if fields[3] == str(sid).encode() and fields[0] != b"Z":
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def test_git_children_die_with_a_sigkilled_daemon_and_a_restart_pushes(tmp_path, git_daemon):
    proxy = ThrottledProxy(git_daemon.port, rate=50_000.0).start()  # ~1 MB takes ~20 s
    env = DaemonEnv(tmp_path, {"net": proxy.url("served.git")})
    state = {"w": np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)}
    try:
        with open(env.log, "ab") as log:  # a session of its own: its children are findable
            env.proc = subprocess.Popen(
                [sys.executable, "-m", "snapops", "daemon", "run", "--config", str(env.config)],
                stdout=log, stderr=log, start_new_session=True)
        daemon_pid = env.proc.pid
        with env.client(policy="block") as client:
            client.request(state, 1)
        wait_for(lambda: any(" push " in cmd for cmd in session_members(daemon_pid).values()),
                 what="a git push of the daemon")
        env.kill()
        wait_for(lambda: not session_members(daemon_pid), within=30,
                 what=f"no process left of the killed daemon: {session_members(daemon_pid)}")
        proxy.rate = 50e6  # the link is fast again
        env.start()
        env.wait(env.all_pushed, what="push after restart")
        assert env.terminate() == 0
    finally:
        env.kill()
        proxy.stop()
    served = git_daemon.base / "served.git"
    assert verify_remote(env, str(served), tmp_path, {1: state}) == ["t/gen-000001"]
    assert set(pushed_counts(env).values()) == {1}


def dense_state(gen: int) -> dict[str, np.ndarray]:
    """Every value changes from one generation to the next (what training does)."""
    rng = np.random.default_rng(gen)
    return {"emb.weight": rng.standard_normal((256, 64)).astype(np.float32)}


def test_delta_attributes_are_committed_and_reach_clones(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    sparse = dense_state(2)
    sparse["emb.weight"][3] += 1.0  # one row of gen 2 changes in gen 3
    try:
        env.start()
        with env.client(policy="block") as client:
            for gen, state in ((1, dense_state(1)), (2, dense_state(2)), (3, sparse)):
                client.request(state, gen)
        env.wait(env.all_pushed, what="three generations pushed")
        assert env.terminate() == 0
    finally:
        env.kill()
    clone = tmp_path / "clone"
    git("clone", "-q", str(bare), str(clone))
    shards = git("ls-tree", "-r", "--name-only", "t/gen-000002", "--", "snapshots/t/shards",
                 cwd=clone).split()
    assert shards
    git("checkout", "-q", "t/gen-000002", cwd=clone)
    attrs = git("check-attr", "delta", "--", *shards, cwd=clone).splitlines()
    assert attrs and all(line.endswith("delta: unset") for line in attrs), attrs
    git("checkout", "-q", "t/gen-000003", cwd=clone)  # a sparse change: delta search is back
    attrs = git("check-attr", "delta", "--", *shards, cwd=clone).splitlines()
    assert all(line.endswith("delta: unspecified") for line in attrs), attrs
    info = tmp_path / "repo" / ".git" / "info" / "attributes"
    assert not info.exists() or "-delta" not in info.read_text()


def test_work_repository_keeps_the_retention_ring_and_the_remote_everything(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    text = env.config.read_text().replace('path = "', 'retention = 2\ngc_interval = 0.5\npath = "', 1)
    env.config.write_text(text)
    repo = env.repo
    try:
        env.start()
        with env.client(policy="block") as client:
            for gen in range(1, 6):
                client.request(state_for(gen), gen)
        env.wait(env.all_pushed, what="five generations pushed")
        # the tags go first, then the shallow boundary, then the prune of what they held
        env.wait(lambda: git("tag", "-l", cwd=repo).split() == ["t/gen-000004", "t/gen-000005"]
                 and int(git("rev-list", "--count", "main", cwd=repo)) == 2,
                 what="old generations forgotten locally")
        env.wait(lambda: subprocess.run(["git", "fsck"], cwd=repo,
                                        capture_output=True).returncode == 0,
                 what="a consistent repository after the cleanup")
        with env.client(policy="block") as client:  # a shallow work repository still pushes
            client.request(state_for(6), 6)
        env.wait(env.all_pushed, what="gen 6 pushed from the cut repository")
        assert env.terminate() == 0
    finally:
        env.kill()
    assert int(git("rev-list", "--count", "main", cwd=bare)) == 6
    assert verify_remote(env, str(bare), tmp_path, {6: state_for(6)}) == \
        [f"t/gen-{g:06d}" for g in range(1, 7)]


def wal_state(*records: tuple[str, int, dict]) -> WalState:
    state = WalState()
    for line, (event, gen, fields) in enumerate(records, 1):
        state.apply(Record(event, gen, fields, line))
    return state


def test_history_cut_keeps_the_ring_and_whatever_a_remote_lacks():
    records = []
    for gen in range(1, 7):
        records += [("REQ", gen, {}), ("SPOOLED", gen, {"file": f"gen-{gen:012d}.spool"}),
                    ("SERIALIZED", gen, {}), (COMMITTED, gen, {"commit": f"{gen:040x}"})]
        records += [(PUSHED, gen, {"remote": "a"})]
        if gen <= 3:
            records += [(PUSHED, gen, {"remote": "b"})]
    state = wal_state(*records)
    assert history_cut(state, {"a"}, retention=2) == (5, f"{5:040x}", [1, 2, 3, 4])
    assert history_cut(state, {"a", "b"}, retention=2) == (4, f"{4:040x}", [1, 2, 3])  # b lacks 4
    assert history_cut(state, {"a"}, retention=6) is None
    assert history_cut(wal_state(), {"a"}, retention=1) is None
