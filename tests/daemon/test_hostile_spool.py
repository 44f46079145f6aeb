"""A real daemon facing hostile spool files and WAL records: each bad generation is dropped
with its reason, the daemon keeps running (and comes up again on the same state), and the next
valid generation is committed and pushed to a real bare remote."""

from __future__ import annotations

import json
import os

from snapops.daemon.lifecycle import DROPPED
from snapops.daemon.spool import spool_name, write_spool
from snapops.daemon.wal import WalReader

from .daemon_env import DaemonEnv, state_for
from .gitserve import init_bare
from .hostile import cli_status, dropped, inject, request_pushed, set_daemon_options, spool_bytes

TS = "2026-01-02T03:04:05Z"
HEADER_CASES = {  # name: (header line, what the drop reason's error names)
    "deep_json": (b"[" * 200_000, "nesting"),
    "gen_infinity": (b'{"gen":Infinity,"meta":{},"arrays":[]}', "Infinity"),
    "offset_1e400": (b'{"gen":1,"meta":{},"arrays":[{"name":"w","dtype":"<f4","shape":[1],'
                     b'"offset":1e400,"nbytes":4,"crc32c":0}]}', "1e400"),
    "huge_int": (b'{"gen":' + b"9" * 5000 + b',"meta":{},"arrays":[]}', "20_digits"),
    "bool_gen": (b'{"gen":true,"meta":{},"arrays":[]}', "gen"),
}


def _env(tmp_path, **kwargs) -> DaemonEnv:
    return DaemonEnv(tmp_path, {"origin": str(init_bare(tmp_path / "remote.git"))}, **kwargs)


def _pushed_past_bad_gen_1(env: DaemonEnv, reason: str, named: str) -> None:
    """Run the daemon with a bad gen 1 in the spool: gen 2 is pushed, gen 1 is dropped with
    ``reason`` and an error naming ``named``, the daemon still runs and stops on SIGTERM."""
    try:
        env.start()
        request_pushed(env, 2)
        details = dropped(cli_status(env), 1)
        assert details["reason"] == reason and named in details["error"], details
        assert env.proc.poll() is None and env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(env.remotes["origin"]) == ["t/gen-000002"]


def _drops_of(env: DaemonEnv, gen: int) -> int:
    return sum(1 for r in WalReader(env.spool / "wal.log").read_new()
               if r.event == DROPPED and r.gen == gen)


def test_hostile_headers_are_dropped_and_survive_a_restart(tmp_path):
    """Every hostile header at once, there before the daemon starts (the crash-loop case):
    each is dropped naming what is wrong, the next valid generation is pushed, and a restart
    on the same state does not trip over them again."""
    cases = sorted(HEADER_CASES)
    env = _env(tmp_path)
    for gen, case in enumerate(cases, 1):
        inject(env, gen, spool_bytes(HEADER_CASES[case][0]))
    good = len(cases) + 1
    try:
        env.start()
        request_pushed(env, good)
        status = cli_status(env)
        for gen, case in enumerate(cases, 1):
            details = dropped(status, gen)
            assert details["reason"] == "bad_spool", (case, details)
            assert HEADER_CASES[case][1] in details["error"], (case, details)
        assert env.proc.poll() is None and env.terminate() == 0
        env.start()
        request_pushed(env, good + 1)
        assert env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(env.remotes["origin"]) == [f"t/gen-{good:06d}",
                                                      f"t/gen-{good + 1:06d}"]
    assert all(_drops_of(env, gen) == 1 for gen in range(1, good))
    assert env.state().rejected_total == 0
    assert "Traceback" not in env.log.read_text()


def test_fifo_spool_never_blocks_and_sigterm_stops_the_daemon(tmp_path):
    env = _env(tmp_path)
    env.spool.mkdir()
    os.mkfifo(env.spool / spool_name(1))
    inject(env, 1)
    _pushed_past_bad_gen_1(env, "bad_spool", "FIFO")


def test_path_outside_the_spool_is_never_read(tmp_path):
    env = _env(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    write_spool(outside / "x.spool", 1, state_for(1), {"ts": TS})  # valid: must still not count
    env.spool.mkdir()
    inject(env, 1, file="../outside/x.spool")
    _pushed_past_bad_gen_1(env, "bad_record", "spool_file_name")
    assert (outside / "x.spool").exists()


def test_symlinked_spool_file_is_refused(tmp_path):
    env = _env(tmp_path)
    outside = tmp_path / "outside.spool"
    write_spool(outside, 1, state_for(1), {"ts": TS})
    env.spool.mkdir()
    (env.spool / spool_name(1)).symlink_to(outside)
    inject(env, 1)
    _pushed_past_bad_gen_1(env, "bad_spool", "symbolic_links")


def test_generation_going_backwards_is_dropped_as_out_of_order(tmp_path):
    env = _env(tmp_path)
    try:
        env.start()
        request_pushed(env, 2)
        write_spool(env.spool / spool_name(1), 1, state_for(1), {"ts": TS})
        inject(env, 1)  # a valid spool, but gen 2 is already committed
        env.wait(lambda: env.state().gens[1].state == DROPPED, 60, what="gen 1 dropped")
        request_pushed(env, 3)
        details = dropped(cli_status(env), 1)
        assert details["reason"] == "out_of_order" and "committed_gen_2" in details["error"]
        assert env.proc.poll() is None and env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(env.remotes["origin"]) == ["t/gen-000002", "t/gen-000003"]


def test_bad_ts_with_fold_is_dropped(tmp_path):
    env = _env(tmp_path, fmt="fold")
    env.spool.mkdir()
    write_spool(env.spool / spool_name(1), 1, state_for(1), {"ts": "2026-13-45T99:00:00Z"})
    inject(env, 1)
    _pushed_past_bad_gen_1(env, "bad_spool", "meta.ts")


def test_generation_that_keeps_failing_is_dropped_after_max_attempts(tmp_path):
    """The WAL is lost while the snapshot repository keeps gen 5: gen 1 is refused by the
    ledger at every attempt ([order]), dropped as failed after 2, and gen 6 goes on."""
    env = _env(tmp_path)
    set_daemon_options(env, max_attempts=2, retry_initial=0.1)
    try:
        env.start()
        request_pushed(env, 5)
        assert env.terminate() == 0
        (env.spool / "wal.log").unlink()
        env.start()
        with env.client() as client:
            client.request(state_for(1), 1)
        env.wait(lambda: env.state().gens[1].state == DROPPED, 60, what="gen 1 dropped")
        request_pushed(env, 6)
        details = dropped(cli_status(env), 1)
        assert details["reason"] == "failed" and "failed_2_times" in details["error"]
        assert "order" in details["error"]
        daemon = json.loads((tmp_path / "state" / "status.json").read_text())
        assert any(f["gen"] == 1 and f["stage"] == "failed" for f in daemon["failures"])
        assert env.proc.poll() is None and env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(env.remotes["origin"]) == ["t/gen-000005", "t/gen-000006"]
