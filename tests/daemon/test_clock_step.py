"""The wall clock stepped under a running daemon (an NTP correction at boot, a VM resumed from a
snapshot, an operator's ``date -s``): a push retry already scheduled still runs after its real
delay, not after the delay plus the step. The daemon runs under libfaketime (Debian's
``faketime``), which moves its wall clock, and its git's, while its monotonic clock stays
real."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from .daemon_env import DaemonEnv, down_remote, state_for
from .gitserve import init_bare

FAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))),
                Path("/usr/lib/faketime/libfaketimeMT.so.1"))
RETRY = 3.0                                          # seconds between push attempts


def faked_clock(offset: Path) -> dict[str, str]:
    """The environment that runs a process under libfaketime with its wall clock ``offset``'s
    content ahead or behind (``+0``, ``-3600``: read again on every call), its monotonic
    clock real."""
    return {"LD_PRELOAD": str(FAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset),
            "FAKETIME_NO_CACHE": "1", "DONT_FAKE_MONOTONIC": "1"}


def set_clock(offset: Path, seconds: str) -> None:
    """Set the faked clock's offset atomically: libfaketime reads the file on every call and
    must never see it half written."""
    part = offset.with_suffix(".part")
    part.write_text(f"{seconds}\n")
    os.replace(part, offset)


def push_status(env: DaemonEnv) -> dict:
    try:
        return json.loads((env.root / "state" / "status.json").read_text())["push"]["net"]
    except (OSError, ValueError, KeyError):
        return {}


@pytest.mark.skipif(not FAKETIME.exists(), reason="needs libfaketime (apt-get install faketime)")
def test_a_retry_due_before_the_clock_went_back_an_hour_runs_when_it_is_due(tmp_path):
    _, server, env = down_remote(tmp_path)
    env.config.write_text(env.config.read_text()
                          .replace("backoff_initial = 0.2", f"backoff_initial = {RETRY}")
                          .replace("backoff_max = 1.0", f"backoff_max = {RETRY}"))
    offset = tmp_path / "faketime.rc"
    set_clock(offset, "+0")
    try:
        env.start(faked_clock(offset))
        with env.client(policy="block") as client:
            client.request(state_for(1), 1)
        env.wait(lambda: push_status(env).get("attempts", 0) >= 1, what="a failed push")
        set_clock(offset, "-3600")                   # the daemon's wall clock goes back 1 h
        server.start()
        stepped = time.monotonic()
        env.wait(env.all_pushed, timeout=6 * RETRY + 10, what="the retried push")
        assert time.monotonic() - stepped < 6 * RETRY + 10
        assert "wall clock stepped by -3600 s" in env.log.read_text()
        assert env.terminate() == 0
    finally:
        env.kill()
        server.stop()


@pytest.mark.skipif(not FAKETIME.exists(), reason="needs libfaketime (apt-get install faketime)")
def test_the_daemons_own_retry_of_a_failed_commit_survives_the_clock_going_back(tmp_path):
    """A generation whose commit failed (the snapshots folder immutable) is retried by the
    daemon's loop, not by apscheduler: its retry time and the time of its last attempt move
    with the clock too, or the retry would wait for new work that never comes."""
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    env.config.write_text(env.config.read_text().replace(
        "poll_interval = 0.2", f"poll_interval = 0.2\nretry_initial = {RETRY}\n"
                               f"retry_max = {RETRY}"))
    frozen = env.repo / "snapshots"
    frozen.mkdir(parents=True)
    subprocess.run(["chattr", "+i", str(frozen)], check=True)
    offset = tmp_path / "faketime.rc"
    set_clock(offset, "+0")
    try:
        env.start(faked_clock(offset))
        with env.client() as client:
            client.request(state_for(1), 1)
        env.wait(lambda: "serialize/commit failed" in env.log.read_text(), what="a failed commit")
        set_clock(offset, "-3600")
        subprocess.run(["chattr", "-i", str(frozen)], check=True)
        env.wait(env.all_pushed, timeout=6 * RETRY + 10, what="the retried commit and push")
        assert "wall clock stepped by -3600 s" in env.log.read_text()
        assert env.terminate() == 0
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], check=False)
        env.kill()


@pytest.mark.skipif(not FAKETIME.exists(), reason="needs libfaketime (apt-get install faketime)")
def test_a_clock_set_forward_does_not_time_out_the_ranks_of_a_waiting_generation(tmp_path):
    """A VM's clock stepped forward by NTP soon after boot: rank 0 requested gen 1 at 12:00,
    the clock now says 13:00 a second later. Rank 1's part is not an hour late, and the
    generation must wait the rank timeout it has left, not be dropped as missing a rank."""
    from snapops.daemon.client import Snapshotter
    from snapops.daemon.lifecycle import DROPPED
    from snapops.formats.generation.load import rank_shards

    from .ranks_env import RankedEnv

    bare = init_bare(tmp_path / "remote.git")
    env = RankedEnv(tmp_path, {"origin": str(bare)}, world=2, timeout=20)
    offset = tmp_path / "faketime.rc"
    set_clock(offset, "+0")
    state = state_for(1)
    try:
        env.start(faked_clock(offset))
        env.wait_ready()                             # the step comes while it runs
        with Snapshotter(env.spool, rank=0, world_size=2) as snap:
            snap.request(rank_shards(state, 0, 2), 1)
        env.wait(lambda: 1 in env.state().gens, what="rank 0's request")
        set_clock(offset, "+3600")
        env.wait(lambda: "wall clock stepped by +3600 s" in env.log.read_text(),
                 what="the step noticed")
        time.sleep(1.0)                              # a pass or five of the daemon's loop
        assert env.state().gens[1].state != DROPPED, env.state().gens[1].fields
        with Snapshotter(env.spool, rank=1, world_size=2) as snap:
            snap.request(rank_shards(state, 1, 2), 1)
        env.wait(env.all_pushed, what="gen 1 from both ranks")
        assert env.terminate() == 0
    finally:
        env.kill()


def test_shifted_jobs_of_a_real_scheduler_run_after_their_real_delay():
    """What the daemon does on a step, on apscheduler itself: a one-off job due in an hour,
    moved back by the hour less a second, runs a second later; an interval job keeps its
    period from the moved time."""
    import threading
    from datetime import datetime, timedelta, timezone

    from apscheduler.schedulers.background import BackgroundScheduler

    from snapops.daemon.clockwatch import shift_jobs

    ran = threading.Event()
    scheduler = BackgroundScheduler(timezone=timezone.utc)
    scheduler.start()
    try:
        soon = datetime.now(timezone.utc) + timedelta(hours=1)
        scheduler.add_job(ran.set, "date", run_date=soon, id="retry")
        scheduler.add_job(lambda: None, "interval", hours=2, id="cleanup")
        cleanup_due = scheduler.get_job("cleanup").next_run_time
        assert shift_jobs(scheduler, -3599.0) == 2
        assert ran.wait(10.0)
        assert scheduler.get_job("cleanup").next_run_time == cleanup_due - timedelta(
            seconds=3599)
        assert shift_jobs(scheduler, -1e12) == 0         # beyond datetime's years: left alone
        assert scheduler.get_job("cleanup").next_run_time == cleanup_due - timedelta(
            seconds=3599)
    finally:
        scheduler.shutdown(wait=False)


def test_the_watch_tells_steps_from_drift():
    from snapops.daemon.clockwatch import TOLERANCE, ClockWatch

    wall, mono = [1000.0], [10.0]
    watch = ClockWatch(lambda: wall[0], lambda: mono[0])
    mono[0] += 60.0
    wall[0] += 60.0 + TOLERANCE / 2            # NTP slewing: a fraction of a second a minute
    assert watch.look()[1] == 0.0
    wall[0] -= 3600.0                           # set back an hour
    assert watch.look() == (wall[0], -3600.0)
    assert watch.look()[1] == 0.0              # once: the new offset is the reference


def test_rank_waits_count_on_the_monotonic_clock_from_the_first_parts_stamp():
    from snapops.daemon.lifecycle import Generation
    from snapops.daemon.ranks import RankWaits

    mono = [100.0]
    waits = RankWaits(lambda: mono[0])
    gen = Generation(7, parts={"0": Generation(7, since="1000.0")})
    assert waits.waited(gen, now=1004.0) == 4.0            # stamped 4 s ago, by the wall clock
    mono[0] += 1.0
    assert waits.waited(gen, now=4605.0) == 5.0            # the wall clock set forward: no matter
    waits.stepped()
    late = Generation(8, parts={"0": Generation(8, since="1005.0")})
    mono[0] += 0.5
    assert waits.waited(late, now=4606.0) == 0.5           # stamped before the step: from the step
    waits.keep({8})
    assert waits.waited(gen, now=4606.0) == 0.5            # forgotten, then seen after the step
