"""The human ``snapops daemon status``: times as ISO and "in 31 s", per remote the backlog and
the push in flight, a per-generation table, dropped/failure entries of any shape; and the
config keys the push queue and the idle loop read."""

from __future__ import annotations

import json
import re

import pytest

from snapops.cli import main
from snapops.cli.daemon_status import iso_time, relative, render_status
from snapops.config import load_config
from snapops.daemon.wal import Record, WalState
from snapops.formats.errors import ConfigError

NOW = 1_780_000_000.0


def wal_state() -> WalState:
    state = WalState()
    records = [("REQ", 1, {}), ("SPOOLED", 1, {"file": "gen-000000000001.spool"}),
               ("SERIALIZED", 1, {}),
               ("COMMITTED", 1, {"commit": "c1" * 20}), ("PUSHED", 1, {"remote": "origin"}),
               ("REQ", 2, {}), ("DROPPED", 2, {"reason": "coalesced", "by": "3"}),
               ("REQ", 3, {}), ("SPOOLED", 3, {"file": "gen-000000000003.spool"}),
               ("SERIALIZED", 3, {}),
               ("COMMITTED", 3, {"commit": "c3" * 20})]
    for line, (event, gen, fields) in enumerate(records, 1):
        state.apply(Record(event, gen, fields, line))
    return state


def status() -> dict:
    push = {"url": "https://user:***@host/snap.git", "pending": [3], "depth": 1,
            "pending_bytes": 187 << 20, "unmeasured": 0,
            "in_flight": {"gens": [3], "bytes": 187 << 20, "started": NOW - 12, "seconds": 12.0,
                          "phase": "Writing objects", "percent": 37, "sent": 69 << 20,
                          "rate": 12 << 20, "last_line": ""},
            "rate": float(12 << 20), "eta": 9.7, "attempts": 2,
            "last_error": "push to https://user:***@host/snap.git: stalled",
            "next_retry": NOW + 31, "backoff": 30.0, "last_pushed": 1,
            "last_success": NOW - 3600, "pushed": 1, "default_branch": "refs/heads/master",
            "history": []}
    return {"last_requested": 3, "last_spooled": 3, "last_committed": 3,
            "last_pushed": {"origin": 1}, "waiting_to_serialize": [], "push_queue_depth": 1,
            "push_queue": [3], "wal_rejected": 0, "wal_corrupt_lines": 1,
            "dropped": [2, 7],
            "dropped_details": [{"gen": 2, "reason": "coalesced", "by": "3"},
                                {"gen": 7, "reason": "failed", "error": "bad ts"}],
            "daemon_running": True,
            "daemon": {"pid": 4242, "started": NOW - 7500, "retry_at": NOW + 5,
                       "failures": [{"gen": 5, "stage": "serialize/commit",
                                     "error": "No space left", "time": NOW - 120}],
                       "push": {"origin": push},
                       "waiting_for_spool": [{"gen": 4, "writer": "0", "waiting_s": 12.5,
                                              "writer_alive": True}]}}


def test_human_status_shows_times_backlog_progress_and_a_table():
    text = render_status(status(), wal_state(), ["origin"], now=NOW)
    assert f"daemon: running (pid 4242, up 2 h 5 min, since {iso_time(NOW - 7500)})" in text
    assert "last generation: requested 3, spooled 3, committed 3, pushed origin 1" in text
    assert "serialize/commit: next retry in 5 s" in text
    assert "remote origin: https://user:***@host/snap.git" in text
    assert "pending: 1 generation(s), 187.0 MiB: 3" in text
    assert ("pushing gen 3 (187.0 MiB): Writing objects 37%, 69.0 MiB sent at 12.0 MiB/s, "
            "for 12 s") in text
    assert "time to drain: ~10 s at 12.0 MiB/s" in text
    assert f"next retry in 31 s (at {iso_time(NOW + 31)})" in text
    assert f"last pushed: gen 1 at {iso_time(NOW - 3600)}" in text
    assert "also updates refs/heads/master" in text
    assert "dropped (last 2 of 2):\n  gen 2 by=3 reason=coalesced\n" \
        "  gen 7 error=bad ts reason=failed" in text
    assert "waiting for their spool file: gen 4 waiting_s=12.5 writer=0 writer_alive=True" in text
    assert f"{iso_time(NOW - 120)} gen 5 error=No space left stage=serialize/commit" in text
    assert "WAL: 1 corrupt line(s) skipped" in text
    table = text[text.index("generations (last 3 of 3):"):].splitlines()
    assert table[1].split() == ["gen", "state", "pushed", "to", "note"]
    assert table[2].split() == ["1", "PUSHED", "origin"]
    assert table[3].split() == ["2", "DROPPED", "-", "coalesced"]
    assert table[4].split() == ["3", "COMMITTED", "-"]


def test_times_and_durations_read_naturally():
    assert iso_time(0) == "1970-01-01T00:00:00Z" and iso_time(None) == "-"
    assert iso_time("x") == "-" and iso_time(float("inf")) == "-"
    assert [relative(s) for s in (0.4, 31, 250, 7500)] == ["0 s", "31 s", "4 min 10 s",
                                                          "2 h 5 min"]


def test_status_command_without_a_daemon_and_json_form(tmp_path, capsys):
    config = tmp_path / "snapops.toml"
    config.write_text('[[repo.remote]]\nname = "origin"\nurl = "/nowhere.git"\n')
    assert main(["daemon", "status", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("daemon: not running\n") and "remote origin:" in out
    assert "generations: none yet" in out
    assert main(["daemon", "status", "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["daemon_running"] is False and data["last_pushed"] == {"origin": None}



def test_a_wal_that_cannot_be_read_is_exit_2_not_an_empty_history(tmp_path, capsys):
    (tmp_path / "spoolfile").write_text("")
    config = tmp_path / "snapops.toml"
    config.write_text('[daemon]\nspool_dir = "spoolfile/x"\n')
    assert main(["daemon", "status", "--config", str(config)]) == 2
    assert "the generations shown are unknown, not absent" in capsys.readouterr().err
    assert main(["daemon", "status", "--config", str(config), "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert "Not a directory" in data["wal_unreadable"]

@pytest.mark.parametrize("content,why", [
    ('{"pid": "x", "push": "zzz", "failures": {"a": 1}}', "AttributeError"),
    ('[1, 2]', "not a JSON object"), ("not json", "JSONDecodeError"),
    ("[" * 100000, "RecursionError"), (None, r"not a regular file \(a FIFO\)"),
])
def test_status_file_of_another_shape_is_set_aside_with_a_warning(tmp_path, capsys, content,
                                                                  why):
    """state/status.json is the daemon's own, but a damaged or planted one must not crash
    (it raised AttributeError) or block (a FIFO) `daemon status`: the WAL's side is shown."""
    import os

    config = tmp_path / "snapops.toml"
    config.write_text('[daemon]\nstate_dir = "state"\n'
                      '[[repo.remote]]\nname = "origin"\nurl = "/nowhere.git"\n')
    (tmp_path / "state").mkdir()
    status = tmp_path / "state" / "status.json"
    if content is None:
        os.mkfifo(status)
    else:
        status.write_text(content)
    assert main(["daemon", "status", "--config", str(config)]) == 0
    captured = capsys.readouterr()
    assert "remote origin:" in captured.out and "generations: none yet" in captured.out
    assert captured.err.count("\n") == 1 and str(status) in captured.err
    assert re.search(why, captured.err) and "shown without it" in captured.err
    assert main(["daemon", "status", "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    if why == "AttributeError":       # valid JSON: --json hands it over as the daemon wrote it
        assert data["daemon"]["push"] == "zzz" and "daemon_status_unreadable" not in data
    else:
        assert re.search(why, data["daemon_status_unreadable"])


def test_status_numbers_beyond_any_value_show_as_unknown(tmp_path, capsys):
    """Found by the fuzzer: a status file with 1e400 (JSON's way to inf) for a time, or a
    400-digit byte count, raised OverflowError in the text view."""
    config = tmp_path / "snapops.toml"
    config.write_text('[daemon]\nstate_dir = "state"\n'
                      '[[repo.remote]]\nname = "origin"\nurl = "/nowhere.git"\n')
    (tmp_path / "state").mkdir()
    push = dict(status()["daemon"]["push"]["origin"], next_retry=float("inf"), eta=float("nan"))
    push["in_flight"] = dict(push["in_flight"], bytes=10**400, seconds=float("inf"))
    text = json.dumps({"pid": 4242, "started": NOW, "push": {"origin": push}})
    (tmp_path / "state" / "status.json").write_text(text.replace("Infinity", "1e400"))
    assert main(["daemon", "status", "--config", str(config)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "remote origin:" in captured.out
    assert "pushing gen 3 (-): Writing objects 37%" in captured.out
    assert "next retry in - (at -)" in captured.out and ", for -\n" in captured.out


def test_push_and_idle_config_keys(tmp_path):
    path = tmp_path / "snapops.toml"
    path.write_text('[push]\nbatch_bytes = "64MiB"\nstall_timeout = 30\n'
                    '[daemon]\ncpu_policy = "normal"\nio_class = "idle"\n'
                    '[repo]\ngc_interval = 0\n')
    config = load_config(path, env={})
    assert config.push.batch_bytes == 64 << 20 and config.push.stall_timeout == 30.0
    assert config.push.timeout == 0.0 and config.daemon.nice == 10
    assert (config.daemon.cpu_policy, config.daemon.io_class) == ("normal", "idle")
    for text, key in [('[daemon]\nio_class = "realtime"\n', "daemon.io_class"),
                      ('[push]\nstall_timeout = 0\n', "push.stall_timeout"),
                      ('[push]\nbatch_bytes = "lots"\n', "push.batch_bytes")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=key):
            load_config(path, env={})
