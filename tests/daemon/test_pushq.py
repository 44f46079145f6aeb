"""PushQueue against real remotes: a bare repository and ``git daemon`` on 127.0.0.1 going down
and coming back; in-order draining, exactly-once reports, growing backoff on an injected clock."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from snapops.config.schema import PushConfig, RemoteConfig
from snapops.daemon.gitops import SnapshotRepo
from snapops.daemon.pushq import PushQueue, backoff_delay, gen_tag
from snapops.formats.errors import ConfigError
from tests.daemon.gitserve import bare_remote, git, git_daemon  # noqa: F401

RUN = "run1"
FAST = PushConfig(backoff_initial=0.05, backoff_max=0.4, backoff_factor=2.0, jitter=0.2,
                  timeout=20.0)


class FakeClock:
    """Unix time that only moves when told to (next_retry is then exactly now + delay)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FixedRng:
    """Jitter source that always draws +0.5: each delay is base * (1 + 0.5 * jitter)."""

    def uniform(self, a: float, b: float) -> float:
        return 0.5


class Reports:
    """Records on_pushed calls; checks each (remote, gen) is reported once, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.lock = threading.Lock()

    def __call__(self, remote: str, gens: list[int]) -> None:
        with self.lock:
            self.calls.append((remote, list(gens)))

    def gens(self, remote: str) -> list[int]:
        with self.lock:
            return [g for name, gens in self.calls if name == remote for g in gens]


def expected_delay(failures: int, config: PushConfig = FAST) -> float:
    return min(config.backoff_max,
               config.backoff_initial * config.backoff_factor ** failures) * (1 + 0.5 * config.jitter)


@pytest.fixture
def repo(tmp_path):
    with SnapshotRepo(tmp_path / "repo") as snapshot_repo:
        yield snapshot_repo


def commit(repo: SnapshotRepo, *gens: int) -> None:
    for gen in gens:
        path = repo.path / "snapshots" / RUN / "s.wtxt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"gen {gen}\n".encode())
        repo.commit_generation([f"snapshots/{RUN}/s.wtxt"], f"{RUN} gen {gen}", gen_tag(RUN, gen))


def tags(*gens: int) -> set[str]:
    return {gen_tag(RUN, g) for g in gens}


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# -- backoff -------------------------------------------------------------------------------------

def test_backoff_delay_grows_caps_and_jitters_within_bounds():
    exact = PushConfig(backoff_initial=1.0, backoff_max=300.0, backoff_factor=2.0, jitter=0.0)
    rng = random.Random(1)
    assert [backoff_delay(exact, n, rng) for n in range(10)] == \
        [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert backoff_delay(exact, 10**6, rng) == 300.0  # no OverflowError
    jittered = PushConfig(backoff_initial=1.0, backoff_max=8.0, backoff_factor=3.0, jitter=0.25)
    for failures in range(6):
        base = min(8.0, 3.0 ** failures)
        samples = [backoff_delay(jittered, failures, rng) for _ in range(300)]
        assert all(base * 0.75 <= s <= base * 1.25 for s in samples)
        assert max(samples) - min(samples) > base * 0.3  # it really jitters
    # the same seed gives the same delays: the rng is the only source of randomness
    a, b = random.Random(7), random.Random(7)
    assert [backoff_delay(jittered, 2, a) for _ in range(5)] == \
        [backoff_delay(jittered, 2, b) for _ in range(5)]


# -- healthy remotes -----------------------------------------------------------------------------

def test_pushes_in_order_to_bare_repo_and_git_daemon_each_gen_once(repo, bare_remote, git_daemon):
    reports = Reports()
    remotes = (RemoteConfig("bare", str(bare_remote)),
               RemoteConfig("daemon", git_daemon.url("served.git")))
    commit(repo, 1, 2, 3)
    queue = PushQueue(repo, remotes, FAST, on_pushed=reports, run=RUN)
    for gen in (3, 1, 2):  # before start: pushed together, ascending
        queue.enqueue(gen)
    with queue:
        assert queue.flush(15)
        assert reports.gens("bare") == reports.gens("daemon") == [1, 2, 3]
        commit(repo, 4, 5)
        queue.enqueue(4)
        queue.enqueue(5)
        queue.enqueue(2)  # already pushed: ignored
        assert queue.flush(15)
        status = queue.status()
    for name, url in (("bare", str(bare_remote)), ("daemon", git_daemon.url("served.git"))):
        assert reports.gens(name) == [1, 2, 3, 4, 5]
        assert repo.remote_tags(url) == tags(1, 2, 3, 4, 5)
        assert status[name]["last_pushed"] == 5 and status[name]["depth"] == 0
        assert status[name]["attempts"] == 0 and status[name]["last_error"] is None
    assert git("rev-parse", "main", cwd=git_daemon.base / "served.git") == repo.head_commit()


def test_batches_are_capped_and_still_ascending(repo, bare_remote):
    reports = Reports()
    commit(repo, 1, 2, 3, 4, 5)
    queue = PushQueue(repo, (RemoteConfig("bare", str(bare_remote)),), FAST,
                      on_pushed=reports, run=RUN, max_batch=2)
    for gen in (5, 4, 3, 2, 1):
        queue.enqueue(gen)
    with queue:
        assert queue.flush(15)
    assert reports.calls == [("bare", [1, 2]), ("bare", [3, 4]), ("bare", [5])]


# -- remotes going down and coming back ---------------------------------------------------------

def test_git_daemon_down_queue_grows_backoff_grows_then_drains_in_order(repo, git_daemon):
    reports, clock = Reports(), FakeClock()
    url = git_daemon.url("served.git")
    commit(repo, 1, 2, 3, 4, 5, 6)
    queue = PushQueue(repo, (RemoteConfig("d", url),), FAST, on_pushed=reports, run=RUN,
                      clock=clock, rng=FixedRng())
    git_daemon.stop()
    queue.start()
    try:
        queue.enqueue(1)
        seen: dict[int, float] = {}
        enqueued = [1]
        deadline = time.monotonic() + 15
        while len(seen) < 5 or max(seen) < 5:
            assert time.monotonic() < deadline, f"backoff did not progress: {seen}"
            st = queue.status()["d"]
            if st["attempts"]:
                # each observed state is consistent: next_retry = clock + backoff(attempts - 1)
                assert st["next_retry"] == pytest.approx(1000.0 + expected_delay(st["attempts"] - 1))
                assert st["backoff"] == pytest.approx(expected_delay(st["attempts"] - 1))
                assert url in st["last_error"] and "refused" in st["last_error"]
                if st["attempts"] not in seen and len(enqueued) < 6:
                    enqueued.append(len(enqueued) + 1)
                    queue.enqueue(enqueued[-1])  # requests keep coming while the remote is down
                seen[st["attempts"]] = st["next_retry"]
            time.sleep(0.005)
        delays = [seen[a] - 1000.0 for a in sorted(seen)]
        assert delays == sorted(delays) and delays[-1] == pytest.approx(expected_delay(10))
        assert delays[0] < delays[-1] / 4  # grew from 0.055 s towards the 0.44 s cap
        assert reports.calls == []  # nothing reported while down, nothing lost
        wait_until(lambda: queue.status()["d"]["depth"] == 6)
        assert queue.status()["d"]["pending"] == [1, 2, 3, 4, 5, 6]

        git_daemon.start()  # the remote is back
        assert queue.flush(15)
        assert reports.gens("d") == [1, 2, 3, 4, 5, 6]
        assert repo.remote_tags(url) == tags(1, 2, 3, 4, 5, 6)
        st = queue.status()["d"]
        assert (st["attempts"], st["last_error"], st["next_retry"]) == (0, None, None)
        assert st["last_pushed"] == 6 and st["last_success"] == 1000.0
    finally:
        queue.stop()


def test_bare_repo_missing_then_back_drains_in_order_exactly_once(repo, bare_remote):
    reports = Reports()
    commit(repo, 1, 2, 3, 4)
    queue = PushQueue(repo, (RemoteConfig("bare", str(bare_remote)),), FAST,
                      on_pushed=reports, run=RUN)
    with queue:
        queue.enqueue(1)
        assert queue.flush(15) and reports.gens("bare") == [1]
        away = bare_remote.with_name("away.git")
        bare_remote.rename(away)  # the remote disappears
        queue.enqueue(2)
        wait_until(lambda: queue.status()["bare"]["attempts"] >= 2)
        assert "does not appear to be a git repository" in queue.status()["bare"]["last_error"]
        queue.enqueue(3)
        queue.enqueue(4)
        wait_until(lambda: queue.status()["bare"]["attempts"] >= 3)
        assert queue.status()["bare"]["pending"] == [2, 3, 4]
        away.rename(bare_remote)  # and comes back
        assert queue.flush(15)
    assert reports.gens("bare") == [1, 2, 3, 4]
    assert repo.remote_tags(str(bare_remote)) == tags(1, 2, 3, 4)


def test_one_remote_down_does_not_hold_back_the_other(repo, bare_remote, tmp_path):
    reports = Reports()
    missing = tmp_path / "later.git"
    commit(repo, 1, 2, 3)
    queue = PushQueue(repo, (RemoteConfig("up", str(bare_remote)),
                             RemoteConfig("down", str(missing))), FAST,
                      on_pushed=reports, run=RUN)
    with queue:
        for gen in (1, 2, 3):
            queue.enqueue(gen)
        wait_until(lambda: reports.gens("up") == [1, 2, 3])
        wait_until(lambda: queue.status()["down"]["attempts"] >= 2)
        assert reports.gens("down") == [] and queue.status()["down"]["depth"] == 3
        git("init", "-q", "--bare", str(missing))
        assert queue.flush(15)
    assert reports.gens("down") == [1, 2, 3] and reports.gens("up") == [1, 2, 3]
    assert repo.remote_tags(str(missing)) == tags(1, 2, 3)


# -- callbacks, restarts, validation ------------------------------------------------------------

def test_callback_runs_outside_the_lock_and_its_errors_are_logged(repo, bare_remote, caplog):
    commit(repo, 1, 2, 3)
    seen: list[tuple[str, list[int], int]] = []
    holder: dict[str, PushQueue] = {}

    def on_pushed(remote, gens):
        queue = holder["q"]
        seen.append((remote, gens, queue.status()[remote]["depth"]))  # would deadlock under a lock
        if gens == [1]:
            queue.enqueue(2)
            queue.enqueue(3)
            raise RuntimeError("WAL full")

    queue = holder["q"] = PushQueue(repo, (RemoteConfig("bare", str(bare_remote)),), FAST,
                                    on_pushed=on_pushed, run=RUN)
    with caplog.at_level(logging.ERROR, logger="snapops.daemon.pushq"), queue:
        queue.enqueue(1)
        assert queue.flush(15)
    assert [(r, g) for r, g, _ in seen] == [("bare", [1]), ("bare", [2, 3])]
    assert "on_pushed(bare, [1]) failed" in caplog.text and "WAL full" in caplog.text


def test_stop_keeps_pending_and_start_resumes_with_shared_scheduler(repo, bare_remote):
    reports = Reports()
    commit(repo, 1, 2, 3)
    scheduler = BackgroundScheduler()
    scheduler.start()
    try:
        away = bare_remote.with_name("away.git")
        bare_remote.rename(away)
        queue = PushQueue(repo, (RemoteConfig("bare", str(bare_remote)),), FAST,
                          on_pushed=reports, run=RUN, scheduler=scheduler)
        queue.start()
        queue.enqueue(1)
        queue.enqueue(2)
        wait_until(lambda: queue.status()["bare"]["attempts"] >= 1)
        queue.stop()
        assert scheduler.get_jobs() == []  # only this queue's jobs were removed
        queue.enqueue(3)  # accepted while stopped
        away.rename(bare_remote)
        time.sleep(0.3)
        assert reports.calls == [] and queue.status()["bare"]["pending"] == [1, 2, 3]
        queue.start()
        assert queue.flush(15)
        queue.stop()
        assert scheduler.running
    finally:
        scheduler.shutdown()
    assert reports.gens("bare") == [1, 2, 3]


def test_owned_scheduler_restarts_and_leaves_no_threads(repo, bare_remote):
    reports = Reports()
    commit(repo, 1, 2)
    queue = PushQueue(repo, (RemoteConfig("bare", str(bare_remote)),), FAST,
                      on_pushed=reports, run=RUN)
    for gen in (1, 2):
        queue.start()
        queue.enqueue(gen)
        assert queue.flush(15)
        queue.stop()
        queue.stop()  # idempotent
    assert reports.gens("bare") == [1, 2]


def test_enqueue_for_selected_remotes_and_validation(repo, bare_remote, tmp_path):
    reports = Reports()
    other = tmp_path / "other.git"
    git("init", "-q", "--bare", str(other))
    commit(repo, 1)
    remotes = (RemoteConfig("a", str(bare_remote)), RemoteConfig("b", str(other)))
    queue = PushQueue(repo, remotes, FAST, on_pushed=reports, run=RUN)
    with queue:
        queue.enqueue(1, remotes=["b"])  # after a restart: a already had PUSHED for gen 1
        assert queue.flush(15)
        with pytest.raises(KeyError, match=r'"unknown remote .c."'):
            queue.enqueue(1, remotes=["c"])
        for bad in (-1, 1.0, True, "1"):
            with pytest.raises(ValueError, match=r"generation must be a non\-negative int"):
                queue.enqueue(bad)
    assert reports.calls == [("b", [1])]
    assert repo.remote_tags(str(bare_remote)) == set()
    with pytest.raises(ConfigError, match="duplicate remote"):
        PushQueue(repo, remotes + (RemoteConfig("a", "x"),), FAST, on_pushed=reports, run=RUN)
