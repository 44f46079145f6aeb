"""The push queue after outages and on slow links, against real git: a backlog drains in
budgeted pushes, in order, each generation sent once; a slow remote that progresses is never
killed, a stalled one is killed and retried; a remote whose HEAD names ``master`` is clonable."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from snapops.config.schema import RemoteConfig
from snapops.daemon.gitops import SnapshotRepo
from snapops.daemon.pushprogress import PushProgress, drain_estimate, parse_progress
from snapops.daemon.pushq import PushQueue, choose_batch, gen_tag
from tests.daemon.gitserve import git, git_daemon  # noqa: F401
from tests.daemon.test_pushq import FAST, RUN, Reports, repo, tags, wait_until  # noqa: F401
from tests.daemon.throttle import ThrottledProxy


def commit_random(repo: SnapshotRepo, gens, size: int) -> None:
    """Generations of ``size`` incompressible bytes each (what a dense change pushes)."""
    for gen in gens:
        path = repo.path / "snapshots" / RUN / "s.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        repo.commit_generation([f"snapshots/{RUN}/s.bin"], f"{RUN} gen {gen}", gen_tag(RUN, gen))


def log_ref_updates(bare: Path) -> Path:
    """A post-receive hook in ``bare`` writing each push's ref updates, then a ``--`` line."""
    log = bare / "received.log"
    hook = bare / "hooks" / "post-receive"
    hook.write_text(f"#!/bin/sh\ncat >> '{log}'\necho -- >> '{log}'\n")
    hook.chmod(0o755)
    return log


def pushes(log: Path) -> list[list[str]]:
    """The refs each push updated, push by push."""
    result, current = [], []
    for line in log.read_text().splitlines():
        if line == "--":
            result.append(current)
            current = []
        else:
            current.append(line.split()[2])
    return result


@pytest.fixture
def bare_remote_with_log(tmp_path):
    bare = tmp_path / "logged.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    return bare, log_ref_updates(bare)


def test_progress_lines_are_read_into_phase_bytes_and_rate():
    assert parse_progress("Writing objects:  66% (12/18), 21.09 MiB | 1.83 MiB/s") == \
        {"phase": "Writing objects", "percent": 66, "sent": 22114468, "rate": 1918894}
    assert parse_progress("remote: Resolving deltas: 100% (3/3), done.") == \
        {"phase": "Resolving deltas", "percent": 100}
    for other in ("To git://127.0.0.1/x.git", "Total 3 (delta 0)", "", "Writing objects"):
        assert parse_progress(other) is None
    progress = PushProgress([4, 5], 3 << 20, started=100.0)
    assert not progress.feed("To /srv/remote.git")
    assert progress.feed("Counting objects: 50% (1/2)")
    assert progress.feed("Writing objects: 50% (1/2), 1.00 MiB | 512.00 KiB/s")
    assert progress.feed("remote: Resolving deltas: 10% (1/10)")  # a later phase keeps bytes
    shown = progress.snapshot(now=103.0)
    assert (shown["phase"], shown["sent"], shown["rate"], shown["seconds"]) == \
        ("Resolving deltas", 1 << 20, 512 << 10, 3.0)
    assert drain_estimate(3 << 20, 1 << 20) == 3.0 and drain_estimate(10, None) is None


def test_choose_batch_takes_the_oldest_and_what_fits():
    sizes = {1: 40, 2: 40, 3: 40, 4: 500, 5: 10}
    assert choose_batch({5, 3, 1, 2, 4}, sizes, budget=100, limit=10) == [1, 2]
    assert choose_batch({3, 4, 5}, sizes, budget=100, limit=10) == [3]
    assert choose_batch({4, 5}, sizes, budget=100, limit=10) == [4]  # too big: alone, still sent
    assert choose_batch({5}, sizes, budget=100, limit=10) == [5]
    assert choose_batch({1, 2, 3}, {}, budget=100, limit=2) == [1, 2]  # unsized: by count


def test_backlog_after_an_outage_drains_in_budgeted_pushes_in_order_once(repo, git_daemon):
    served = git_daemon.base / "served.git"
    received = log_ref_updates(served)
    url = git_daemon.url("served.git")
    commit_random(repo, range(1, 8), 64 << 10)
    one = repo.generation_bytes(gen_tag(RUN, 2))
    assert one > 64 << 10
    config = replace(FAST, batch_bytes=int(one * 2.5))  # two per push; the backlog is seven
    reports = Reports()
    queue = PushQueue(repo, (RemoteConfig("net", url),), config, on_pushed=reports, run=RUN)
    git_daemon.stop()  # the remote is unreachable while the backlog grows
    with queue:
        for gen in range(1, 8):
            queue.enqueue(gen)
        wait_until(lambda: queue.status()["net"]["attempts"] >= 3)
        status = queue.status()["net"]
        assert reports.calls == [] and status["depth"] == 7
        assert status["pending_bytes"] >= 7 * (64 << 10) and status["unmeasured"] == 0
        git_daemon.start()
        assert queue.flush(60)
        status = queue.status()["net"]
    assert reports.calls == [("net", [1, 2]), ("net", [3, 4]), ("net", [5, 6]), ("net", [7])]
    per_push = pushes(received)
    assert [sorted(r for r in refs if "/tags/" in r) for refs in per_push] == \
        [[f"refs/tags/{gen_tag(RUN, g)}" for g in batch] for batch in ([1, 2], [3, 4], [5, 6], [7])]
    assert all("refs/heads/main" in refs for refs in per_push)  # the branch moved each time
    assert repo.remote_tags(url) == tags(*range(1, 8))
    assert git("rev-parse", "main", cwd=served) == repo.head_commit()
    git("fsck", "--strict", cwd=served)
    assert [h["gens"] for h in status["history"] if h["ok"]] == [[1, 2], [3, 4], [5, 6], [7]]
    assert status["depth"] == 0 and status["pending_bytes"] == 0 and status["eta"] == 0.0


STALL = replace(FAST, stall_timeout=1.0, timeout=0.0)


def push_one_through(repo, proxy: ThrottledProxy, name: str, seen: list | None = None
                     ) -> tuple[list[dict], Reports]:
    """Push generation 1 through ``proxy`` with a 1 s stall limit; the attempts' history.
    ``seen`` collects the push in flight as status shows it at each change."""
    reports = Reports()
    holder: dict[str, PushQueue] = {}

    def on_change() -> None:
        flight = holder["q"].status()[name]["in_flight"]
        if flight and seen is not None:
            seen.append(flight)

    queue = holder["q"] = PushQueue(repo, (RemoteConfig(name, proxy.url("served.git")),),
                                    STALL, on_pushed=reports, run=RUN, on_change=on_change)
    try:
        with queue:
            queue.enqueue(1)
            assert queue.flush(120)
    finally:
        proxy.stop()
    return queue.status()[name]["history"], reports


class LingeringQueue(PushQueue):
    """Each attempt's job returns late, after it scheduled the next one (a busy machine)."""

    def _attempt(self, name: str) -> None:
        super()._attempt(name)
        time.sleep(0.3)


def test_an_attempt_that_returns_late_does_not_stall_the_queue(repo, bare_remote_with_log):
    bare, _ = bare_remote_with_log
    commit_random(repo, range(1, 5), 1000)
    reports = Reports()
    queue = LingeringQueue(repo, (RemoteConfig("b", str(bare)),), FAST, on_pushed=reports,
                           run=RUN, max_batch=1)
    with queue:
        for gen in range(1, 5):
            queue.enqueue(gen)
        assert queue.flush(30)
    assert reports.calls == [("b", [1]), ("b", [2]), ("b", [3]), ("b", [4])]


def test_a_slow_remote_that_progresses_is_not_killed(repo, git_daemon):
    """git hands the whole pack to the kernel at once and then prints nothing while the
    link drains it: the socket queue shrinking is progress too."""
    size = 600_000
    commit_random(repo, [1], size)
    proxy = ThrottledProxy(git_daemon.port, rate=200_000.0).start()
    seen: list[dict] = []
    history, reports = push_one_through(repo, proxy, "slow", seen)
    assert [h["ok"] for h in history] == [True], history   # one attempt, never aborted
    assert history[0]["seconds"] > STALL.stall_timeout     # it outlasted the stall limit
    assert proxy.forwarded >= size
    assert seen and all(f["gens"] == [1] and f["bytes"] > size for f in seen)  # in status
    assert reports.gens("slow") == [1]
    assert repo.remote_tags(git_daemon.url("served.git")) == tags(1)


def test_a_stalled_push_is_killed_and_retried(repo, git_daemon):
    commit_random(repo, [1], 400_000)
    proxy = ThrottledProxy(git_daemon.port, rate=400_000.0, stall_after=100_000).start()
    history, reports = push_one_through(repo, proxy, "flaky")
    assert proxy.stalled.is_set()
    assert [h["ok"] for h in history] == [False, True], history
    assert "stalled: no progress for 1 s" in history[0]["error"]
    assert reports.gens("flaky") == [1]
    served = git_daemon.base / "served.git"
    assert repo.remote_tags(git_daemon.url("served.git")) == tags(1)
    git("fsck", "--strict", cwd=served)


def test_a_remote_whose_head_names_master_is_clonable(repo, tmp_path):
    bare = tmp_path / "master.git"
    git("init", "-q", "--bare", "-b", "master", str(bare))
    commit_random(repo, [1, 2], 1000)
    reports = Reports()
    queue = PushQueue(repo, (RemoteConfig("m", str(bare)),), FAST, on_pushed=reports, run=RUN)
    with queue:
        queue.enqueue(1)
        queue.enqueue(2)
        assert queue.flush(30)
        assert queue.status()["m"]["default_branch"] == "refs/heads/master"
        clone = tmp_path / "clone"
        git("clone", "-q", str(bare), str(clone))
        assert (clone / "snapshots" / RUN / "s.bin").read_bytes() == \
            (repo.path / "snapshots" / RUN / "s.bin").read_bytes()
        assert git("rev-parse", "HEAD", cwd=clone) == repo.head_commit()
        commit_random(repo, [3], 1000)
        queue.enqueue(3)
        assert queue.flush(30)  # master follows main
    assert git("rev-parse", "master", cwd=bare) == git("rev-parse", "main", cwd=bare) \
        == repo.head_commit()
    git("pull", "-q", cwd=clone)
    assert git("rev-parse", "HEAD", cwd=clone) == repo.head_commit()


def test_a_default_branch_holding_other_work_is_left_alone(repo, tmp_path):
    bare = tmp_path / "shared.git"
    git("init", "-q", "--bare", "-b", "master", str(bare))
    other = tmp_path / "other"
    git("init", "-q", "-b", "master", str(other))
    (other / "README").write_text("someone else's branch\n")
    git("add", "README", cwd=other)
    git("-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "theirs", cwd=other)
    git("push", "-q", str(bare), "master", cwd=other)
    theirs = git("rev-parse", "master", cwd=bare)
    commit_random(repo, [1], 1000)
    queue = PushQueue(repo, (RemoteConfig("s", str(bare)),), FAST, on_pushed=Reports(), run=RUN)
    with queue:
        queue.enqueue(1)
        assert queue.flush(30)
        assert queue.status()["s"]["default_branch"] is None
    assert git("rev-parse", "master", cwd=bare) == theirs
    assert git("rev-parse", "main", cwd=bare) == repo.head_commit()


def test_generations_the_remote_already_has_are_not_sent_again(repo, bare_remote_with_log):
    bare, received = bare_remote_with_log
    commit_random(repo, [1, 2, 3], 1000)
    repo.push(str(bare), [gen_tag(RUN, 1), gen_tag(RUN, 2)],
              branch_commit=repo.tag_commit(gen_tag(RUN, 2)))  # e.g. by a daemon killed after
    reports = Reports()
    queue = PushQueue(repo, (RemoteConfig("b", str(bare)),), FAST, on_pushed=reports, run=RUN)
    with queue:
        for gen in (1, 2, 3):
            queue.enqueue(gen)
        assert queue.flush(30)
    assert reports.calls == [("b", [1, 2]), ("b", [3])]
    assert [sorted(r for r in refs if "/tags/" in r) for refs in pushes(received)] == \
        [[f"refs/tags/{gen_tag(RUN, 1)}", f"refs/tags/{gen_tag(RUN, 2)}"],
         [f"refs/tags/{gen_tag(RUN, 3)}"]]
