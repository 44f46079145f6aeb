"""PyCauset metadata updates: alternating slots, O(1) cost, and a crash at every byte
or fsync leaving the old or the new metadata."""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from snapops.formats import pycauset as pc
from snapops.formats.errors import (DataError, UnsupportedVersionError)
from snapops.formats.pycauset import _codec
from snapops.formats.pycauset._update import FSYNC, apply_steps

from .test_pycauset import (  # noqa: F401  (shared helpers, not tests)
    PREAMBLE, SLOT, _fields, arrays_of, frame, matrix_file, parse, put_slot, slots, with_metadata, write,
)


# ---- metadata updates ----------------------------------------------------------------------------

def test_update_metadata_alternates_slots(tmp_path):
    path = matrix_file(tmp_path)
    before = path.read_bytes()
    r = pc.update_metadata(path, {"provenance": {"verified": True}, "cached": {"x": 1}})
    assert r == {"slot": "B", "generation": 2, "metadata_offset": r["metadata_offset"],
                 "metadata_length": r["metadata_length"], "previous_slot": "A"}
    assert pc.update_metadata(path, {"provenance": {"run": None}})["slot"] == "A"
    assert pc.update_metadata(path, {"cached": None})["generation"] == 4
    after = path.read_bytes()
    assert after[4096:4096 + 48] == before[4096:4096 + 48]            # payload untouched
    assert after[272:len(before)] == before[272:]                     # append-only
    back = pc.load(path)
    assert back.meta == {"verified": True} and "cached" not in pc.PycausetFile(path).meta
    report = pc.verify(path)
    assert report.ok and report.details["generation"] == 4 and report.notes == []


def test_update_refuses_identity_keys(tmp_path):
    path = matrix_file(tmp_path)
    before = path.read_bytes()
    for key in ("rows", "payload_layout", "payload_uuid", "view", "data_type"):
        with pytest.raises(DataError, match="identity"):
            pc.update_metadata(path, {key: 1})
    with pytest.raises(DataError, match="None"):
        pc.update_metadata(path, {"provenance": {"x": [None]}})
    with pytest.raises(DataError, match="mapping"):
        pc.update_metadata(path, [("a", 1)])
    assert path.read_bytes() == before


def test_update_never_commits_metadata_that_does_not_open(tmp_path):
    path = write(tmp_path)
    before = path.read_bytes()
    data = with_metadata(before, {**pc.PycausetFile(path).meta, "view": {"scalar": 2.0}})
    path.write_bytes(data)
    with pytest.raises(UnsupportedVersionError, match="scalar"):
        pc.update_metadata(path, {"provenance": {"x": 1}})
    assert path.read_bytes() == data


def test_update_is_o1_in_payload_size(tmp_path):
    small = matrix_file(tmp_path, "small.pycauset")
    big = tmp_path / "big.pycauset"                 # 1 GiB payload, sparse on disk
    meta = _codec.encode_metadata({**pc.PycausetFile(small).meta})
    with open(big, "wb") as f:
        header = bytearray(4096)
        struct.pack_into(PREAMBLE, header, 0, b"PYCAUSET", 1, 1, 4096, 0)
        # keep the small file's raw_dense metadata but point it at a 1 GiB payload: only the
        # header and the block are ever read by an update
        fields = (1, 4096, 48, 4096 + (1 << 30), 32 + len(meta), 0, 0)
        put_slot(header, "A", fields)
        put_slot(header, "B", (0, *fields[1:]))
        f.write(header)
        f.seek(4096 + (1 << 30))
        f.write(frame(meta))
    written = {}
    for path in (small, big):
        log = []

        def pwrite(fd, data, offset, log=log):
            log.append((len(data), offset))
            return os.pwrite(fd, data, offset)

        pc.update_metadata(path, {"provenance": {"pushed": "origin/main"}}, pwrite=pwrite)
        written[path.name] = [n for n, _ in log]
    assert written["small.pycauset"][1:] == written["big.pycauset"][1:] == [128]
    assert abs(written["small.pycauset"][0] - written["big.pycauset"][0]) < 16


class Crash(Exception):
    pass


def crashing_io(budget: int, fsync_budget: int = 99):
    """pwrite/fsync that stop the update after ``budget`` bytes or ``fsync_budget`` fsyncs."""
    state = {"bytes": budget, "fsyncs": fsync_budget}

    def pwrite(fd, data, offset):
        n = min(len(data), state["bytes"])
        if n:
            os.pwrite(fd, bytes(data[:n]), offset)
        state["bytes"] -= n
        if n < len(data):
            raise Crash(f"cut after {budget} bytes")
        return n

    def fsync(fd):
        if state["fsyncs"] == 0:
            raise Crash("cut at an fsync")
        state["fsyncs"] -= 1

    return pwrite, fsync


def _update_bytes(path: Path, changes) -> int:
    log = []
    pc.update_metadata(path, changes, pwrite=lambda fd, d, o: log.append(len(d)) or
                       os.pwrite(fd, d, o), fsync=lambda fd: None)
    return sum(log)


@pytest.mark.parametrize("updates_before", [0, 1])
def test_update_crash_at_every_byte(tmp_path, updates_before):
    original = matrix_file(tmp_path)
    for i in range(updates_before):
        pc.update_metadata(original, {"provenance": {"step": i}})
    start = original.read_bytes()
    old_meta = pc.load(original).meta
    changes = {"provenance": {"verified": "sha:abc", "step": None}, "cached": {"n": 1.5}}
    probe = tmp_path / "probe.pycauset"
    probe.write_bytes(start)
    total = _update_bytes(probe, changes)
    new_meta = pc.load(probe).meta
    assert new_meta != old_meta
    seen = set()
    victim = tmp_path / "victim.pycauset"
    for cut in range(total + 1):
        victim.write_bytes(start)
        pwrite, fsync = crashing_io(cut)
        with contextlib.suppress(Crash):
            pc.update_metadata(victim, changes, pwrite=pwrite, fsync=fsync)
        snap = pc.load(victim)
        assert snap.meta in (old_meta, new_meta), cut
        assert (snap["w"] == np.arange(12).reshape(3, 4)).all()
        assert pc.verify(victim).ok
        seen.add("new" if snap.meta == new_meta else "old")
        # the commit point: the last byte of the new slot's CRC (its 68 reserved bytes are
        # zero before and after)
        assert snap.meta == (new_meta if cut >= total - 68 else old_meta), cut
        # a crashed file still takes the next update
        pc.update_metadata(victim, {"provenance": {"after": cut}})
        assert pc.load(victim).meta["after"] == cut
    assert seen == {"old", "new"}
    for fsyncs in range(2):                          # cut at each fsync
        victim.write_bytes(start)
        pwrite, fsync = crashing_io(1 << 20, fsyncs)
        with pytest.raises(Crash, match=r"cut at an fsync"):
            pc.update_metadata(victim, changes, pwrite=pwrite, fsync=fsync)
        assert pc.load(victim).meta == (old_meta if fsyncs == 0 else new_meta)


def test_torn_slot_write_in_any_sector_order(tmp_path):
    # the slot is written by one pwrite; if the device tears it, any subset of its bytes may
    # land: every 8-byte-granular mix of old and new slot bytes opens old or new, never broken
    path = matrix_file(tmp_path)
    start = path.read_bytes()
    old = pc.load(path).meta
    pc.update_metadata(path, {"provenance": {"v": 2}})
    done = path.read_bytes()
    new = pc.load(path).meta
    lo, hi = 144, 272                                 # slot B
    rng = np.random.default_rng(0)
    for _ in range(300):
        mask = rng.random(16) < 0.5
        mixed = bytearray(done)
        for i, keep_old in enumerate(mask):
            if keep_old:
                mixed[lo + 8 * i:lo + 8 * i + 8] = start[lo + 8 * i:lo + 8 * i + 8]
        c = parse(bytes(mixed))
        assert c.snapshot_meta() in (old, new)


def test_apply_steps_continues_short_writes(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        from snapops.formats.pycauset._update import Write
        apply_steps(fd, [Write(0, b"abcdef"), FSYNC],
                    pwrite=lambda f, d, o: os.pwrite(f, bytes(d[:2]), o))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abcdef"


def test_verify_notes_interrupted_update(tmp_path):
    path = matrix_file(tmp_path)
    pwrite, fsync = crashing_io(1 << 20, 0)         # block appended, slot never written
    with pytest.raises(Crash, match=r"cut at an fsync"):
        pc.update_metadata(path, {"provenance": {"x": 1}}, pwrite=pwrite, fsync=fsync)
    report = pc.verify(path)
    assert report.ok and any("after the active metadata block" in n for n in report.notes)
    data = bytearray(path.read_bytes())
    put_slot(data, "B", _fields(data, "B"), crc=5)
    path.write_bytes(data)
    assert any("inactive slot B is not valid" in n for n in pc.verify(path).notes)
