"""AEROSET saves interrupted at every step: the set at the path is the whole old set or the
whole new one, and what an abandoned save wrote is removed (by itself, or by the next save)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import snapops
from snapops.formats.aero import _aeroset_save

OPTS = {"shard_max": 4096, "part_shards": 1}
STEPS = ("write_file", "_rename", "fsync_dir", "atomic_write_bytes", "_remove")


class Interrupted(BaseException):
    """Stands for Ctrl-C, a full disk or a kill at one exact step."""


def state(values: tuple[float, ...]) -> dict[str, np.ndarray]:
    return {f"layer.{i}": np.full(1024, v, np.float32) for i, v in enumerate(values)}


OLD = state((0, 1, 2, 3))
NEW = state((0, 1, 7, 8, 9))          # two parts unchanged, two changed, one more


def same(back, expected: dict) -> bool:
    return sorted(back.arrays) == sorted(expected) and all(
        np.array_equal(back[k], v) for k, v in expected.items())


def which_state(path) -> str:
    """'old' or 'new' if the set at ``path`` verifies and loads as exactly one of them."""
    report = snapops.verify(path)
    assert report.ok, report.failure
    back = snapops.load(path)
    assert same(back, OLD) or same(back, NEW), sorted(back.arrays)
    return "old" if same(back, OLD) else "new"


def stray_files(path) -> set[str]:
    """Files of the folder that neither the set's JSON nor the test put there."""
    doc = json.loads(path.read_text())
    listed = {p["path"] for p in doc["parts"]} | {doc["global_tidx"]["path"], path.name}
    return {p.name for p in path.parent.iterdir()} - listed


def interrupt_at(monkeypatch, k: int, when: str) -> list[str]:
    """Make the k-th folder step of the next save raise, before or after it is done; returns
    the log of steps run."""
    log: list[str] = []
    for name in STEPS:
        real = getattr(_aeroset_save, name)

        def step(*args, _real=real, _name=name, **kwargs):
            log.append(_name)
            if len(log) == k and when == "before":
                raise Interrupted(f"step {k} ({_name}) before")
            result = _real(*args, **kwargs)
            if len(log) == k:
                raise Interrupted(f"step {k} ({_name}) after")
            return result

        monkeypatch.setattr(_aeroset_save, name, step)
    return log


def steps_of_a_save(tmp_path) -> list[str]:
    path = tmp_path / "count" / "m.aeroset.json"
    snapops.save(OLD, path, **OPTS)
    with pytest.MonkeyPatch.context() as mp:
        log = interrupt_at(mp, 0, "never")
        snapops.save(NEW, path, **OPTS)
    return log


@pytest.mark.slow
def test_a_save_over_a_set_interrupted_at_any_step_leaves_old_or_new(tmp_path):
    steps = steps_of_a_save(tmp_path)
    assert {"write_file", "_rename", "fsync_dir", "atomic_write_bytes", "_remove"} <= set(steps)
    seen = set()
    for k in range(1, len(steps) + 1):
        for when in ("before", "after"):
            path = tmp_path / f"{k}-{when}" / "m.aeroset.json"
            snapops.save(OLD, path, **OPTS)
            with pytest.MonkeyPatch.context() as mp:
                interrupt_at(mp, k, when)
                with pytest.raises(Interrupted, match=f"step {k} "):
                    snapops.save(NEW, path, **OPTS)
            got = which_state(path)
            seen.add(got)
            if steps[k - 1] != "_remove":         # the save cleaned up after itself
                assert stray_files(path) == set(), (k, when)
            snapops.save(NEW, path, **OPTS)
            assert which_state(path) == "new" and stray_files(path) == set(), (k, when)
    assert seen == {"old", "new"}


def test_interrupting_the_first_save_leaves_no_set_and_no_files(tmp_path, monkeypatch):
    path = tmp_path / "m.aeroset.json"
    interrupt_at(monkeypatch, 3, "after")
    with pytest.raises(Interrupted, match="step 3 "):
        snapops.save(OLD, path, **OPTS)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_save_leaves_files_the_next_save_removes(tmp_path, monkeypatch):
    """A kill runs no cleanup: its staged and tagged files stay until the next save."""
    path = tmp_path / "m.aeroset.json"
    snapops.save(OLD, path, **OPTS)
    with monkeypatch.context() as mp:
        mp.setattr(_aeroset_save._Save, "remove_unlisted", lambda self: None)
        interrupt_at(mp, 8, "before")    # parts 0-2 in place, part 3 staged, then killed
        with pytest.raises(Interrupted, match="step 8 "):
            snapops.save(NEW, path, **OPTS)
    assert which_state(path) == "old"
    left = stray_files(path)
    assert any(".staged." not in n for n in left) and left
    snapops.save(OLD, path, **OPTS)
    assert which_state(path) == "old" and stray_files(path) == set()


def test_cleanup_never_touches_files_it_cannot_prove_are_its_own(tmp_path):
    path = tmp_path / "m.aeroset.json"
    foreign = {"notes.txt": b"mine", "part-009.aero": b"not listed by any set",
               "part-000.0123456789abcdef.aero": b"a tag its bytes do not match",
               "other.part-000.staged.aero": b"another set's name"}
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
    for values in (OLD, NEW, OLD):
        snapops.save(values, path, **OPTS)
    assert stray_files(path) == set(foreign)
    assert all((tmp_path / n).read_bytes() == d for n, d in foreign.items())


def test_resaving_the_same_state_keeps_every_name_and_byte(tmp_path):
    path = tmp_path / "m.aeroset.json"
    snapops.save(OLD, path, **OPTS)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    snapops.save(OLD, path, **OPTS)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert sorted(before) == ["m.aeroset.json", "m.index.aero"] + [
        f"m.part-00{i}.aero" for i in range(4)]


def test_changed_parts_get_tagged_names_and_unchanged_ones_keep_theirs(tmp_path):
    path = tmp_path / "model.aeroset.json"
    snapops.save(OLD, path, **OPTS)
    snapops.save(NEW, path, **OPTS)
    doc = json.loads(path.read_text())
    names = [p["path"] for p in doc["parts"]]
    assert names[:2] == ["part-000.aero", "part-001.aero"]
    for name, part in zip(names[2:], doc["parts"][2:]):
        assert name == f"{name[:8]}.{part['sha256'][:16]}.aero"
    assert doc["global_tidx"]["path"] == f"index.{doc['global_tidx']['sha256'][:16]}.aero"
    assert which_state(path) == "new" and stray_files(path) == set()


KILLED_FIRST_SAVE = """
import os, signal, sys
import numpy as np, snapops
from snapops.formats.aero import _aeroset_save
_aeroset_save._Save.publish = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
snapops.save({f"layer.{i}": np.full(1024, i, np.float32) for i in range(5)}, sys.argv[1],
             shard_max=4096, part_shards=1)
"""


def test_a_first_save_killed_before_its_json_is_cleaned_up_by_the_next(tmp_path):
    path = tmp_path / "m.aeroset.json"
    killed = subprocess.run([sys.executable, "-c", KILLED_FIRST_SAVE, str(path)], timeout=120)
    assert killed.returncode == -signal.SIGKILL and not path.exists()
    assert len(list(tmp_path.glob("m.part-*.aero"))) == 5    # all written, none listed yet
    snapops.save(OLD, path, **OPTS)                          # 4 parts: part-004 is left over
    assert which_state(path) == "old" and stray_files(path) == set()


INTERRUPTED_SAVE = """
import faulthandler, gc, signal, sys, warnings
import numpy as np, snapops

def interrupt(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
sys.unraisablehook = lambda unraisable: None  # the signal landed in a finaliser: no matter
# A signal between open() and its `with` leaves the file object to the collector, which
# closes it with a ResourceWarning: Python's, not a file left behind.
warnings.simplefilter("ignore", ResourceWarning)
faulthandler.dump_traceback_later(90, exit=True)  # a hang fails with where it hangs
signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]))
try:
    snapops.save({f"a{i}": np.ones(1 << 18, np.float32) for i in range(8)}, sys.argv[1],
                 shard_max=1 << 20, part_shards=1)
    print("saved")
except BaseException as exc:
    print(type(exc).__name__)
signal.setitimer(signal.ITIMER_REAL, 0)
gc.collect()
"""


@pytest.mark.parametrize("delay", [0.002, 0.005, 0.01, 0.02, 0.03, 0.08])
def test_a_real_signal_during_a_save_leaves_old_or_new(tmp_path, delay):
    """Ctrl-C as Python delivers it: between any two bytecodes, also inside the standard
    library's locks (there CPython may turn it into a RuntimeError). The save ends, and so
    does the process; the set is old or new."""
    big_old = {f"a{i}": np.zeros(1 << 18, np.float32) for i in range(8)}
    big_new = {k: v + 1 for k, v in big_old.items()}
    path = tmp_path / "m.aeroset.json"
    snapops.save(big_old, path, shard_max=1 << 20, part_shards=1)
    child = subprocess.run([sys.executable, "-c", INTERRUPTED_SAVE, str(path), str(delay)],
                           capture_output=True, text=True, timeout=150)
    # -SIGINT: the interrupt landed in an exec() of source text (dataclasses build their
    # methods so), which makes Python end the process as Ctrl-C would, once it is done
    assert child.returncode in (0, -signal.SIGINT), child.stderr[-3000:]
    assert child.stdout.split() in (["saved"], ["KeyboardInterrupt"], ["RuntimeError"])
    assert snapops.verify(path).ok, snapops.verify(path).failure
    back = snapops.load(path)
    assert same(back, big_old) or same(back, big_new)
    snapops.save(big_new, path, shard_max=1 << 20, part_shards=1)
    assert same(snapops.load(path), big_new) and stray_files(path) == set()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
