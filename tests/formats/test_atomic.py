"""The atomic writer: temp files of killed writers are removed by the next write of the same
target or by a sweep; a live writer's temp never is (it holds its lock until the rename)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from snapops.formats.atomic import atomic_write, atomic_write_bytes, remove_leftover_temps

from ..processes import killed_after

KILLED_WRITER = textwrap.dedent("""\
    import sys, threading
    from snapops.formats.atomic import atomic_write
    with atomic_write(sys.argv[1]) as handle:
        handle.write(b"partial")
        handle.flush()
        print("writing", flush=True)
        threading.Event().wait()
    """)


def killed_mid_write(target: Path) -> Path:
    """Run a writer of ``target`` until it is writing, SIGKILL it; its aged leftover temp."""
    before = set(target.parent.glob(f".{target.name}.*.tmp"))
    killed_after(KILLED_WRITER, str(target), ready="writing")
    [leftover] = set(target.parent.glob(f".{target.name}.*.tmp")) - before
    os.utime(leftover, (1, 1))  # leftovers younger than 2 s are left alone
    return leftover


def test_next_write_of_the_same_target_removes_the_killed_writers_temp(tmp_path):
    target, other = tmp_path / "x.wtxt", tmp_path / "y.wtxt"
    leftover, other_leftover = killed_mid_write(target), killed_mid_write(other)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and not leftover.exists()
    assert other_leftover.exists()  # another target's: for its own next write or a sweep
    assert remove_leftover_temps(tmp_path) == [other_leftover] and not other_leftover.exists()


def test_a_live_writers_temp_is_never_removed(tmp_path):
    target = tmp_path / "x.wtxt"
    with atomic_write(target) as handle:
        handle.write(b"first")
        [live] = tmp_path.glob(".x.wtxt.*.tmp")
        os.utime(live, (1, 1))
        assert remove_leftover_temps(tmp_path) == []
        atomic_write_bytes(target, b"second")  # a concurrent write of the same target
        assert live.exists()
    assert target.read_bytes() == b"first" and list(tmp_path.glob("*.tmp")) == []


def test_sweep_descends_but_skips_git_fresh_and_foreign_entries(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    old = [tmp_path / "a" / ".s.wtxt.0123456789ab.tmp", tmp_path / "a" / "b" / ".m.0123456789ab.tmp"]
    kept = [tmp_path / ".git" / ".index.0123456789ab.tmp", tmp_path / ".s.wtxt.tmp",
            tmp_path / ".s.wtxt.0123456789AB.tmp"]
    for path in old + kept:
        path.write_bytes(b"x")
        os.utime(path, (1, 1))
    fresh = tmp_path / "a" / ".f.0123456789ab.tmp"
    fresh.write_bytes(b"x")
    (tmp_path / ".d.0123456789ab.tmp").mkdir()
    (tmp_path / ".l.0123456789ab.tmp").symlink_to(old[0])
    assert sorted(remove_leftover_temps(tmp_path, recursive=True)) == sorted(old)
    assert all(p.exists() for p in kept + [fresh]) and not any(p.exists() for p in old)
    assert (tmp_path / ".d.0123456789ab.tmp").is_dir()
    assert (tmp_path / ".l.0123456789ab.tmp").is_symlink()


@pytest.mark.parametrize("call", ["open", "dup", "fdopen"])
def test_an_interrupt_as_a_call_returns_leaves_no_temp_file(tmp_path, monkeypatch, call):
    """Ctrl-C's handler can run as a call returns, before its result is stored."""
    (tmp_path / "x.bin").write_bytes(b"old")
    real = getattr(os, call)

    def interrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        if call == "fdopen":
            result.close()          # the lost file object, collected
        raise KeyboardInterrupt

    monkeypatch.setattr(os, call, interrupted)
    with pytest.raises(KeyboardInterrupt, match=r"^$"), atomic_write(tmp_path / "x.bin") as f:
        f.write(b"new")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]
    assert (tmp_path / "x.bin").read_bytes() == b"old"
