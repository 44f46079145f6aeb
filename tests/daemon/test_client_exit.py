"""A training script that never reaches ``close()`` still spools what it handed over and exits:
a normal end, an uncaught exception, ``sys.exit``, a refused request; a hanging spool write is
given up on after ``EXIT_TIMEOUT`` (the daemon's recovery retires it). Real child processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from snapops.daemon.client import Snapshotter
from snapops.daemon.lifecycle import DROPPED, SPOOLED
from snapops.daemon.spool import Spool, spool_files
from snapops.daemon.wal import replay
from snapops.daemon.writers import try_writer_lock
from snapops.formats.errors import SnapopsError

# The arrays of generation ``gen``, rebuilt identically here and in the child.
STATE = textwrap.dedent("""\
    import numpy as np
    def state(gen):
        rng = np.random.default_rng(gen)
        return {"w": rng.standard_normal((512, 1024)).astype(np.float32),
                "b": rng.integers(-2**40, 2**40, 4096, dtype=np.int64),
                "step": np.array(gen, np.int64)}
    """)
namespace: dict = {}
exec(STATE, namespace)
state = namespace["state"]

PREAMBLE = STATE + textwrap.dedent("""\
    import os, sys, threading, time
    import snapops.daemon.client as client
    from snapops import Snapshotter
    spool = sys.argv[1]
    """)


def _run(body: str, spool, limit: float = 20.0) -> subprocess.CompletedProcess:
    """Run the training script ``body``; it must end by itself within ``limit`` seconds."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PREAMBLE + textwrap.dedent(body), str(spool)],
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert took < limit, f"the script took {took:.1f}s to exit: {done.stderr[-2000:]}"
    return done


def _records(spool) -> list[str]:
    return (spool / "wal.log").read_text().splitlines()


def _assert_spooled_by_the_script(spool, gens: list[int]) -> None:
    """Every gen is SPOOLED by the script itself (no recovery) and its file reads back exact,
    through the reader the daemon uses."""
    wal, _ = replay(spool / "wal.log")
    assert {g: s.state for g, s in wal.gens.items()} == {g: SPOOLED for g in gens}
    assert not [r for r in _records(spool) if "recovered=" in r or "DROPPED" in r]
    files = dict(spool_files(spool))
    assert sorted(files) == gens
    for gen in gens:
        with Spool(files[gen]) as read:
            arrays = read.arrays(check=True)  # CRC32C of every array checked
            assert sorted(arrays) == ["b", "step", "w"]
            for name, want in state(gen).items():
                assert arrays[name].dtype == want.dtype and np.array_equal(arrays[name], want)


def _assert_lock_free(spool) -> None:
    lock = try_writer_lock(spool, "0")  # never waits: None while anyone holds it
    assert lock is not None, "writer-0.lock is still held"
    lock.release()
    with Snapshotter(spool) as again:  # and a new trainer can start on the spool
        again.request(state(99), 99)


def test_script_ending_without_close_spools_queued_generations_and_exits(tmp_path):
    done = _run("""\
        real = client.write_spool
        def slow(*args, **kwargs):  # a slow disk: gens 2 and 3 still wait when the script ends
            time.sleep(0.3)
            return real(*args, **kwargs)
        client.write_spool = slow
        snap = Snapshotter(spool, max_in_flight=4)
        for gen in (1, 2, 3):
            snap.request(state(gen), gen)
        print(sorted(f for f in os.listdir(spool) if f.endswith(".spool")))
        """, tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == "[]\n"  # nothing was on disk yet when the script ended
    _assert_spooled_by_the_script(tmp_path, [1, 2, 3])
    _assert_lock_free(tmp_path)


def test_the_audit_one_liner_exits(tmp_path):
    done = _run("""\
        s = Snapshotter(spool); s.request(state(1), gen=1)
        """, tmp_path, limit=10)
    assert (done.returncode, done.stderr) == (0, "")
    _assert_spooled_by_the_script(tmp_path, [1])
    _assert_lock_free(tmp_path)


def test_uncaught_exception_after_request_exits_1_with_the_spool_complete(tmp_path):
    done = _run("""\
        snap = Snapshotter(spool)
        snap.request(state(1), 1)
        snap.request(state(2), 2)
        raise RuntimeError("loss is nan")
        """, tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1 and "RuntimeError: loss is nan" in done.stderr
    assert "snapops" not in done.stderr.replace("snapops.", "")  # no line of ours
    _assert_spooled_by_the_script(tmp_path, [1, 2])
    _assert_lock_free(tmp_path)


def test_sys_exit_keeps_its_code_and_spools(tmp_path):
    done = _run("""\
        snap = Snapshotter(spool)
        snap.request(state(4), 4)
        sys.exit(3)
        """, tmp_path)
    assert (done.returncode, done.stderr) == (3, "")
    _assert_spooled_by_the_script(tmp_path, [4])
    _assert_lock_free(tmp_path)


def test_refused_request_ending_the_script_keeps_the_earlier_generation(tmp_path):
    done = _run("""\
        snap = Snapshotter(spool)
        snap.request(state(5), gen=5)
        snap.request(state(3), gen=3)  # DataError: generations must increase
        """, tmp_path)
    assert done.returncode == 1
    assert "DataError: gen 3 is not greater than the last requested gen 5" in done.stderr
    assert done.stderr.count("Traceback") == 1
    _assert_spooled_by_the_script(tmp_path, [5])
    _assert_lock_free(tmp_path)


def test_a_hanging_spool_write_is_given_up_on_at_exit(tmp_path):
    done = _run("""\
        client.EXIT_TIMEOUT = 1.0
        client.write_spool = lambda *a, **k: threading.Event().wait()  # the disk never answers
        snap = Snapshotter(spool, max_in_flight=4)
        snap.request(state(1), 1)
        snap.request(state(2), 2)
        """, tmp_path, limit=15)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"snapops: at exit, spool {tmp_path}: gave up waiting")
    assert "generations [1, 2] not spooled" in line
    assert spool_files(tmp_path) == []
    # the lock went with the process: the next trainer retires both, as after a crash
    with Snapshotter(tmp_path):
        pass
    wal, _ = replay(tmp_path / "wal.log")
    assert {g: (s.state, s.fields.get("reason")) for g, s in wal.gens.items()} == \
        {1: (DROPPED, "abandoned"), 2: (DROPPED, "abandoned")}


def test_a_failed_spool_at_exit_is_one_line_without_traceback(tmp_path):
    (tmp_path / "gen-000000000001.spool").mkdir()  # the rename onto it fails: spool_failed
    done = _run("""\
        snap = Snapshotter(spool)
        snap.request(state(1), 1)
        """, tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("snapops: at exit")]
    assert len(ours) == 1 and "spool writer failed for gen 1" in ours[0]
    wal, _ = replay(tmp_path / "wal.log")
    assert wal.gens[1].state == DROPPED and wal.gens[1].fields["reason"] == "spool_failed"
    _assert_lock_free(tmp_path)


@pytest.mark.parametrize("how", ["with", "close"])
def test_closed_snapshotters_exit_as_before(tmp_path, how):
    body = {"with": """\
        with Snapshotter(spool) as snap:
            snap.request(state(1), 1)
        """, "close": """\
        snap = Snapshotter(spool)
        snap.request(state(1), 1)
        snap.close()
        try:
            snap.request(state(2), 2)
        except Exception as exc:
            print(type(exc).__name__, exc)
        """}[how]
    done = _run(body, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == ("" if how == "with" else "SnapopsError Snapshotter is closed\n")
    _assert_spooled_by_the_script(tmp_path, [1])
    _assert_lock_free(tmp_path)


def test_close_in_process_still_raises_after_close(tmp_path):
    snap = Snapshotter(tmp_path)
    snap.request(state(1), 1)
    snap.close()
    assert not snap._thread.is_alive()
    with pytest.raises(SnapopsError, match="Snapshotter is closed"):
        snap.request(state(2), 2)
    _assert_spooled_by_the_script(tmp_path, [1])
