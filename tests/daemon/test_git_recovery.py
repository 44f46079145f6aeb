"""The daemon recovers from git helpers that die while it runs: a SIGKILLed ``git cat-file
--batch-check`` reader is restarted on next use; git lock files a dead git left are removed
before the retry, never while a live git process may hold them. Real daemon processes, real
bare remotes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from snapops.daemon.lifecycle import PUSHED

from .daemon_env import DaemonEnv, state_for
from .gitserve import init_bare


def _fast_retries(env: DaemonEnv) -> None:
    env.config.write_text(env.config.read_text().replace(
        "[daemon]\n", "[daemon]\nretry_initial = 0.3\nretry_max = 1.0\n", 1))


def _env_and_index_lock(tmp_path):
    """A bare remote, a daemon retrying fast that pushes to it, and where its work
    repository's index lock goes."""
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    _fast_retries(env)
    return bare, env, env.repo / ".git" / "index.lock"


def _children(pid: int, pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid), "-f", pattern], capture_output=True,
                           text=True)
    return [int(line) for line in found.stdout.split()]


def _pushed(env: DaemonEnv, gen: int) -> bool:
    record = env.state().gens.get(gen)
    return record is not None and record.state == PUSHED


def _log_has(env: DaemonEnv, text: str) -> bool:
    return text in env.log.read_text()


def _first_gen(env: DaemonEnv) -> None:
    env.start()
    env.wait_ready()
    with env.client(policy="block") as client:
        client.request(state_for(1), 1)
    env.wait(lambda: _pushed(env, 1), what="gen 1 pushed")


def _request(env: DaemonEnv, gen: int) -> None:
    with env.client(policy="block") as client:
        client.request(state_for(gen), gen)


def test_killed_cat_file_reader_is_restarted(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    try:
        _first_gen(env)
        readers = _children(env.proc.pid, "cat-file --batch-check")
        assert len(readers) == 1, readers
        os.kill(readers[0], signal.SIGKILL)
        _request(env, 2)
        env.wait(lambda: _pushed(env, 2), timeout=60, what="gen 2 pushed after the kill")
        _request(env, 3)   # and the restarted reader keeps serving
        env.wait(lambda: _pushed(env, 3), timeout=60, what="gen 3 pushed")
        assert env.terminate() == 0
    finally:
        env.kill()
    log = env.log.read_text()
    assert "Broken pipe" not in log and "failed, retrying" not in log, log[-3000:]
    restarts = [line for line in log.splitlines() if "git object reader restarted" in line]
    assert len(restarts) == 1 and f"pid {readers[0]}" in restarts[0], restarts
    assert env.remote_tags(str(bare)) == ["t/gen-000001", "t/gen-000002", "t/gen-000003"]


def test_dead_gits_index_lock_is_cleared_before_the_retry(tmp_path):
    bare, env, lock = _env_and_index_lock(tmp_path)
    try:
        _first_gen(env)
        lock.write_bytes(b"")   # what a git killed mid-command leaves behind
        _request(env, 2)
        env.wait(lambda: _pushed(env, 2), timeout=60, what="gen 2 pushed past the lock")
        assert env.terminate() == 0
    finally:
        env.kill()
    log = env.log.read_text()
    assert "gen 2: serialize/commit failed, retrying" in log and "index.lock" in log
    assert f"removed 1 git lock file(s) left by a git that is no longer running: {lock}" in log
    assert not lock.exists()
    assert env.remote_tags(str(bare)) == ["t/gen-000001", "t/gen-000002"]


def test_a_lock_a_live_process_may_hold_is_kept(tmp_path):
    """A git process of someone else working in the repository, then a process holding the
    lock open: the lock stays (and the generation waits); once they are gone it is removed."""
    bare, env, lock = _env_and_index_lock(tmp_path)
    other_git = holder = None
    try:
        _first_gen(env)
        other_git = subprocess.Popen(["git", "cat-file", "--batch"], cwd=env.repo,
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        lock.write_bytes(b"")
        _request(env, 2)
        env.wait(lambda: _log_has(env, f"(git) works in {env.repo}"), timeout=30,
                 what="the lock kept for a live git in the repository")
        assert lock.exists() and not _pushed(env, 2)

        with open(lock, "rb") as held:
            holder = subprocess.Popen(["sleep", "600"], stdin=held)
        other_git.stdin.close()
        other_git.wait(10)
        env.wait(lambda: _log_has(env, f"{lock}: held open by pid {holder.pid}"), timeout=30,
                 what="the lock kept for the process holding it open")
        assert lock.exists() and not _pushed(env, 2)

        holder.kill()
        holder.wait(10)
        env.wait(lambda: _pushed(env, 2), timeout=60, what="gen 2 pushed once nobody holds it")
        assert env.terminate() == 0
    finally:
        env.kill()
        for proc in (other_git, holder):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert not lock.exists()
    assert env.remote_tags(str(bare)) == ["t/gen-000001", "t/gen-000002"]


def test_a_fresh_lock_waits_for_the_next_retry(tmp_path):
    """A lock younger than a second is not removed (a git may just have taken it); the retry
    after it removes it."""
    bare, env, lock = _env_and_index_lock(tmp_path)
    try:
        _first_gen(env)
        lock.write_bytes(b"")
        now = time.time()
        os.utime(lock, (now + 2.0, now + 2.0))   # "created" 2 s from now: young for a while
        _request(env, 2)
        env.wait(lambda: _log_has(env, f"{lock}: younger than 1 s"), timeout=30,
                 what="a young lock kept")
        env.wait(lambda: _pushed(env, 2), timeout=60, what="gen 2 pushed once it aged")
        assert env.terminate() == 0
    finally:
        env.kill()
    assert not lock.exists()
