"""Writers of a spool: a second one is refused, a killed one's requests are retired (by the
next trainer or by the daemon once it is gone), a full disk costs one generation only."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from snapops.daemon.client import SpoolFailed, Snapshotter
from snapops.daemon.lifecycle import DROPPED, REQ, SPOOLED
from snapops.daemon.wal import Wal, WalError, replay
from snapops.daemon.writers import WriterBusy

from ..formats.test_atomic import killed_mid_write
from ..processes import killed_after, running_until
from .daemon_env import DaemonEnv, state_for
from .gitserve import init_bare
from .hostile import cli_status, dropped, request_pushed, set_daemon_options

# A trainer whose spool writer never finishes: killed after request(), as a crash would.
STUCK_TRAINER = textwrap.dedent("""\
    import sys, threading
    import numpy as np
    import snapops.daemon.client as client
    client.write_spool = lambda *a, **k: threading.Event().wait()
    snap = client.Snapshotter(sys.argv[1])
    snap.request({"w": np.zeros(4, np.float32)}, int(sys.argv[2]))
    print("requested", flush=True)
    threading.Event().wait()
    """)


def _second_trainer(spool) -> subprocess.CompletedProcess:
    code = "import sys; from snapops.daemon.client import Snapshotter; Snapshotter(sys.argv[1])"
    return subprocess.run([sys.executable, "-c", code, str(spool)], capture_output=True,
                          text=True, timeout=120)


def _env(tmp_path) -> DaemonEnv:
    return DaemonEnv(tmp_path, {"origin": str(init_bare(tmp_path / "remote.git"))})


def test_second_writer_is_refused_in_the_same_and_in_another_process(tmp_path):
    with Snapshotter(tmp_path) as first:
        with pytest.raises(WriterBusy, match="already has a live writer 0"):
            Snapshotter(tmp_path)
        other = _second_trainer(tmp_path)
        assert other.returncode != 0 and "WriterBusy" in other.stderr
        first.request(state_for(1), 1)
    with Snapshotter(tmp_path) as again:  # the lock went with the first one
        again.request(state_for(2), 2)
    state, _ = replay(tmp_path / "wal.log")
    assert {g: s.state for g, s in state.gens.items()} == {1: SPOOLED, 2: SPOOLED}
    assert all(s.fields["w"] == "0" for s in state.gens.values())


@pytest.mark.slow
def test_daemon_reports_a_foreign_writer_and_pushes_the_real_one(tmp_path):
    env = _env(tmp_path)
    try:
        env.start()
        with env.client() as client:
            assert "already has a live writer" in _second_trainer(env.spool).stderr
            forged = Wal(env.spool / "wal.log", writer="1")  # ignores the lock: rejected
            forged.append(REQ, 7, pid=1, arrays=1, bytes=1)
            forged.close()
            client.request(state_for(1), 1)
            client.request(state_for(2), 2)
        env.wait(lambda: env.all_pushed(), 90, what="gens 1 and 2 pushed")
        status = cli_status(env)
        assert status["wal_rejected"] == 1 and 7 not in status["waiting_to_serialize"]
        [rejected] = status["wal_rejected_records"]
        assert rejected["gen"] == 7 and rejected["writer"] == "1" and "may not write" in \
            rejected["why"]
        assert env.proc.poll() is None and env.terminate() == 0
    finally:
        env.kill()
    assert "writer 1 may not write" in env.log.read_text()
    assert env.remote_tags(env.remotes["origin"]) == ["t/gen-000001", "t/gen-000002"]


def test_next_trainer_retires_the_request_of_a_killed_one(tmp_path):
    env = _env(tmp_path)
    set_daemon_options(env, abandon_after=3600)  # only the new trainer may retire it
    try:
        env.start()
        killed_after(STUCK_TRAINER, str(env.spool), "1", ready="requested")
        assert env.state().gens[1].state == REQ
        request_pushed(env, 2)  # its Snapshotter retires gen 1 first
        details = dropped(cli_status(env), 1)
        assert details["reason"] == "abandoned"
        assert env.proc.poll() is None and env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(env.remotes["origin"]) == ["t/gen-000002"]


def test_daemon_retires_a_request_whose_writer_is_gone(tmp_path):
    env = _env(tmp_path)
    set_daemon_options(env, abandon_after=0.5)
    try:
        env.start()
        env.wait_ready()
        with running_until(STUCK_TRAINER, str(env.spool), "1", ready="requested") as proc:
            env.wait(lambda: _seen_alive(env, 1), 60, what="the daemon to find the writer")
            assert env.state().gens[1].state == REQ  # its writer lives: never retired
        env.wait(lambda: env.state().gens[1].state == DROPPED, 60, what="gen 1 retired")
        record = env.state().gens[1]
        assert record.fields["reason"] == "abandoned" and record.fields["w"] == "daemon"
        assert record.fields["writer_pid"] == str(proc.pid)
        request_pushed(env, 2)
        assert env.proc.poll() is None and env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(env.remotes["origin"]) == ["t/gen-000002"]


def _seen_alive(env: DaemonEnv, gen: int) -> bool:
    """The daemon waited past abandon_after for ``gen`` and found its writer alive."""
    status = json.loads((env.root / "state" / "status.json").read_text())
    return any(w["gen"] == gen and w["writer_alive"] for w in status["waiting_for_spool"])


def test_snapshotter_recovers_after_the_spool_disk_was_full(tmp_path):
    mnt = tmp_path / "spool"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        snap = Snapshotter(mnt)
        big = {"w": np.ones((512, 256), np.float32)}  # 512 KiB: cannot fit
        snap.request(big, 1)
        with pytest.raises(SpoolFailed, match="gen 1: .*No space left"):
            snap.flush(60)
        assert snap.flush(60)  # reported once
        subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)
        snap.request(big, 2)
        snap.close(60)
        state, _ = replay(mnt / "wal.log")
        assert state.gens[1].state == DROPPED and state.gens[1].fields["reason"] == "spool_failed"
        assert "No_space_left" in state.gens[1].fields["error"]
        assert state.gens[2].state == SPOOLED
        assert [p.name for p in mnt.iterdir() if p.name.endswith(".tmp")] == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_for_the_wal_refuses_the_request_then_works_again(tmp_path):
    mnt = tmp_path / "spool"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        with Snapshotter(mnt) as snap:
            with open(mnt / "wal.log", "ab") as f:  # the next REQ crosses into a new page
                f.write(b"p" * (4096 - 20 - (mnt / "wal.log").stat().st_size - 1) + b"\n")
            with open(mnt / "filler", "wb", buffering=0) as f:
                with pytest.raises(OSError, match="No space"):
                    while True:
                        f.write(b"\0" * 4096)
            small = {"w": np.arange(4, dtype=np.float32)}
            with pytest.raises(WalError, match="No space left"):
                snap.request(small, 1)
            (mnt / "filler").unlink()
            snap.request(small, 1)
        state, _ = replay(mnt / "wal.log")
        assert state.gens[1].state == SPOOLED
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_daemon_start_removes_leftovers_of_killed_writers(tmp_path):
    env = _env(tmp_path)
    for folder in (env.spool, tmp_path / "state", env.repo / "snapshots" / "t"):
        folder.mkdir(parents=True)
    leftovers = [killed_mid_write(env.spool / "gen-000000000001.spool"),
                 killed_mid_write(tmp_path / "state" / "status.json"),
                 killed_mid_write(env.repo / "snapshots" / "t" / "MANIFEST")]
    try:
        env.start()
        env.wait_ready()
        assert not any(path.exists() for path in leftovers)
        status = json.loads((tmp_path / "state" / "status.json").read_text())
        assert sorted(status["leftovers_removed"]) == sorted(map(str, leftovers))
        request_pushed(env, 1)
        assert env.terminate() == 0
    finally:
        env.kill()
