"""One daemon per spool folder: a second daemon with its own state folder and repository but
the same spool is refused at start (it would commit every generation again and fight over the
shared WAL); the first keeps serving. Real daemon processes, real bare remotes."""

from __future__ import annotations

import subprocess
import sys

from snapops.daemon.lifecycle import PUSHED

from .daemon_env import DaemonEnv, state_for
from .gitserve import git, init_bare


def _on_spool(env: DaemonEnv, spool) -> None:
    """Point ``env``'s config at ``spool`` (its state folder and repository stay its own)."""
    env.config.write_text(env.config.read_text().replace(
        "[daemon]\n", f'[daemon]\nspool_dir = "{spool}"\n', 1))
    env.spool = spool


def _run_daemon(env: DaemonEnv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapops", "daemon", "run", "--config",
                           str(env.config)], capture_output=True, text=True, timeout=60)


def test_second_daemon_on_the_same_spool_is_refused(tmp_path):
    first = DaemonEnv(tmp_path / "a", {"origin": str(init_bare(tmp_path / "a.git"))})
    second = DaemonEnv(tmp_path / "b", {"origin": str(init_bare(tmp_path / "b.git"))})
    _on_spool(second, first.spool)
    try:
        first.start()
        first.wait_ready()
        with first.client(policy="block") as client:
            client.request(state_for(1), 1)
        first.wait(first.all_pushed, what="gen 1 pushed by the first daemon")

        refused = _run_daemon(second)
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert lines == [f"snapops: error: another snapops daemon serves the spool "
                         f"{first.spool} (it holds {first.spool}/daemon.lock)"]
        assert not (tmp_path / "b" / "repo").exists()  # refused before touching its repo

        with first.client(policy="block") as client:  # the first one keeps working
            client.request(state_for(2), 2)
        first.wait(lambda: first.state().gens.get(2) is not None
                   and first.state().gens[2].state == PUSHED, what="gen 2 pushed")
        assert first.terminate() == 0
    finally:
        first.kill()
    state = first.state()
    assert state.rejected_total == 0, list(state.rejected)  # no conflicting WAL records
    assert first.remote_tags(str(tmp_path / "a.git")) == ["t/gen-000001", "t/gen-000002"]
    assert git("for-each-ref", "refs/", cwd=tmp_path / "b.git") == ""


def test_spool_lock_is_released_and_a_state_folder_spool_still_starts(tmp_path):
    """The spool lock goes with the daemon: another daemon on the spool starts afterwards.
    A config whose spool is its state folder (one lock file for both) starts normally."""
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    _on_spool(env, tmp_path / "state")
    try:
        env.start()
        env.wait_ready()
        with env.client(policy="block") as client:
            client.request(state_for(1), 1)
        env.wait(env.all_pushed, what="gen 1 pushed (spool = state folder)")
        refused = _run_daemon(env)   # the state folder's lock refuses it first, as before
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            f"snapops: error: another snapops daemon holds {tmp_path}/state/daemon.lock"]
        assert env.terminate() == 0
        env.start()                  # nothing left locked by the stopped daemon
        env.wait_ready()
        with env.client(policy="block") as client:
            client.request(state_for(2), 2)
        env.wait(lambda: env.state().gens[2].state == PUSHED, what="gen 2 after a restart")
        assert env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(str(bare)) == ["t/gen-000001", "t/gen-000002"]
