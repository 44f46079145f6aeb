"""WAL records are whole or absent: a torn tail never swallows the next record, a short write
on a full disk (a real tmpfs) leaves nothing behind, hostile fields and files are refused."""

from __future__ import annotations

import os
import subprocess

import pytest

from snapops.daemon.lifecycle import DROPPED, PUSHED, REQ, SPOOLED
from snapops.daemon.spool import spool_name, write_spool
from snapops.daemon.wal import Wal, WalError, WalReader, format_record, replay

from .daemon_env import DaemonEnv, state_for
from .gitserve import init_bare
from .hostile import cli_status, request_pushed


def _records(path):
    return [(r.event, r.gen) for r in WalReader(path).read_new()]


def test_append_seals_a_torn_tail_so_the_next_record_survives(tmp_path):
    path = tmp_path / "wal.log"
    path.write_bytes(format_record(REQ, 1, {})[:-9])  # killed mid-record: no crc, no LF
    wal = Wal(path)
    wal.append(REQ, 2)
    wal.close()
    state, reader = replay(path)
    assert [g for g in state.gens] == [2] and len(reader.bad) == 1
    assert path.read_bytes().count(b"\n") == 2  # the fragment became a line of its own


def test_reader_resynchronises_on_a_glued_record(tmp_path):
    """An appender that does not seal (an older version, a foreign tool) glues the next record
    to the fragment: the reader still finds the record and reports the garbage."""
    path = tmp_path / "wal.log"
    path.write_bytes(format_record(REQ, 1, {"w": "0", "pid": 42})[:-12]
                     + format_record(REQ, 2, {"w": "0"})
                     + format_record(SPOOLED, 2, {"file": spool_name(2)}))
    reader = WalReader(path)
    assert [(r.event, r.gen) for r in reader.read_new()] == [(REQ, 2), (SPOOLED, 2)]
    assert len(reader.bad) == 1 and reader.bad[0][1].startswith("REQ gen=1")


@pytest.mark.parametrize("chunks", [1, 7, 1000])
def test_reader_gives_the_same_records_whatever_the_write_pieces(tmp_path, chunks):
    lines = b"".join(format_record(REQ, g, {"w": "0"}) for g in range(1, 40)) + b"junk\n"
    path = tmp_path / "wal.log"
    reader, seen = WalReader(path), []
    with open(path, "wb") as f:
        for at in range(0, len(lines), chunks):
            f.write(lines[at:at + chunks])
            f.flush()
            seen += [r.gen for r in reader.read_new()]
    assert seen == list(range(1, 40)) and len(reader.bad) == 1


def test_overlong_unterminated_garbage_is_skipped(tmp_path):
    path = tmp_path / "wal.log"
    path.write_bytes(b"x" * 100_000)
    reader = WalReader(path)
    assert reader.read_new() == [] and len(reader.bad) == 1
    with open(path, "ab") as f:
        f.write(b"\n" + format_record(REQ, 3, {}))
    assert [r.gen for r in reader.read_new()] == [3]


def test_every_field_is_bounded(tmp_path):
    path = tmp_path / "wal.log"
    bad = [(REQ, 0, {"pid": "0"}), (SPOOLED, 1, {"file": "../../outside/x.spool"}),
           (REQ, 2, {"arrays": "99999999999"}), (REQ, 3, {"colour": "red"}),
           (SPOOLED, 4, {}), (DROPPED, 5, {"reason": "because"}), (REQ, 6, {"t": "1e400"})]
    with open(path, "wb") as f:
        for event, gen, fields in bad:
            if event != REQ:
                f.write(format_record(REQ, gen, {}))
            f.write(format_record(event, gen, fields))
    state, _ = replay(path)
    problems = {gen: record.problem for gen, record in state.gens.items()}
    assert all(problems.values()), problems
    assert "not a spool file name" in problems[1] and "unknown field colour" in problems[3]
    assert "SPOOLED without file" in problems[4]


def test_foreign_writer_and_illegal_transitions_are_rejected_and_counted(tmp_path):
    path = tmp_path / "wal.log"
    Wal(path, writer="1").append(REQ, 1)
    Wal(path).append(SPOOLED, 9, file=spool_name(9))
    state, _ = replay(path)
    assert state.gens == {} and state.rejected_total == 2
    assert "writer 1 may not write" in state.rejected[0][1]


def test_wal_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "wal.log"
    os.mkfifo(path)
    with pytest.raises(WalError, match="not a regular file"):
        Wal(path)
    reader = WalReader(path)
    assert reader.read_new() == [] and "not a regular file" in reader.problem


def test_short_write_on_a_full_disk_leaves_no_partial_record(tmp_path):
    """The record crosses a page boundary of a full tmpfs: the first part fits, the rest hits
    ENOSPC; the file is cut back to where the record began."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        path = mnt / "wal.log"
        wal = Wal(path)
        wal.append(REQ, 1)
        with open(path, "ab") as f:  # pad to 40 bytes short of a page
            f.write(b"p" * (4096 - 40 - path.stat().st_size - 1) + b"\n")
        _fill(mnt / "filler")
        before = path.read_bytes()
        with pytest.raises(WalError, match="No space left"):
            wal.append(REQ, 2, pid=os.getpid(), arrays=3, bytes=12345)
        assert path.read_bytes() == before
        (mnt / "filler").unlink()
        wal.append(REQ, 2, pid=os.getpid(), arrays=3, bytes=12345)
        wal.close()
        assert _records(path) == [(REQ, 1), (REQ, 2)]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path) -> None:
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_daemon_recovers_the_generation_of_a_torn_spooled_record(tmp_path):
    """A trainer killed while appending SPOOLED gen 1 (its spool file complete): the next
    trainer seals the tail, records gen 1 as recovered, and gen 1 and 2 are both pushed."""
    env = DaemonEnv(tmp_path, {"origin": str(init_bare(tmp_path / "remote.git"))})
    env.spool.mkdir()
    wal = Wal(env.spool / "wal.log")
    wal.append(REQ, 1, pid=os.getpid(), arrays=3, bytes=1)
    wal.close()
    size = write_spool(env.spool / spool_name(1), 1, state_for(1), {"ts": "2026-01-02T03:04:05Z"})
    with open(env.spool / "wal.log", "ab") as f:
        f.write(format_record(SPOOLED, 1, {"w": "0", "file": spool_name(1), "bytes": size})[:-5])
    try:
        env.start()
        request_pushed(env, 2)
        env.wait(lambda: env.state().gens[1].state == PUSHED, 60, what="gen 1 pushed")
        status = cli_status(env)
        assert status["wal_corrupt_lines"] == 1 and status["dropped"] == []
        assert env.proc.poll() is None and env.terminate() == 0
    finally:
        env.kill()
    assert env.state().gens[1].fields["recovered"] == "1"
    assert env.remote_tags(env.remotes["origin"]) == ["t/gen-000001", "t/gen-000002"]
