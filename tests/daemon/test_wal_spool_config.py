"""WAL records and replay, the lifecycle table, spool files, and the config loader."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from snapops.config import load_config
from snapops.daemon.lifecycle import (
    COMMITTED, DROPPED, PUSHED, REQ, SERIALIZED, SPOOLED, Generation, IllegalTransition,
)
from snapops.daemon.spool import Spool, write_spool
from snapops.daemon.wal import Wal, format_record, parse_line, replay
from snapops.formats.errors import ConfigError, FormatError


def test_record_roundtrip_and_crc():
    line = format_record(SPOOLED, 12, {"file": "gen-000000000012.spool", "bytes": 99})
    record = parse_line(line[:-1], 1)
    assert record.event == SPOOLED and record.gen == 12 and record.fields["bytes"] == "99"
    assert parse_line(line[:-1].replace(b"bytes=99", b"bytes=98"), 1) is None
    with pytest.raises(ValueError, match=r"WAL field note='has space' is not"):
        format_record(REQ, 1, {"note": "has space"})


def test_transition_table():
    g = Generation(1)
    for event in (REQ, SPOOLED, SERIALIZED, SERIALIZED, COMMITTED, PUSHED, PUSHED):
        g.apply(event, {"remote": "a"} if event == PUSHED else {})
    assert g.state == PUSHED and g.fully_pushed({"a"}) and not g.fully_pushed({"a", "b"})
    with pytest.raises(IllegalTransition, match=r"gen 2: SPOOLED is not allowed"):
        Generation(2).apply(SPOOLED, {})
    d = Generation(3)
    d.apply(REQ, {})
    d.apply(DROPPED, {"reason": "coalesced"})
    with pytest.raises(IllegalTransition, match=r"gen 3: SPOOLED is not allowed"):
        d.apply(SPOOLED, {})


def test_replay_skips_corrupt_torn_and_illegal_records(tmp_path):
    wal = Wal(tmp_path / "wal.log")
    wal.append(REQ, 1)
    wal.append(SPOOLED, 1, file="f")
    wal.append(COMMITTED, 7)  # illegal: gen 7 never requested
    wal.close()
    with open(tmp_path / "wal.log", "ab") as f:
        f.write(b"garbage line\n")
        f.write(format_record(REQ, 2, {}).replace(b"gen=2", b"gen=3"))  # crc mismatch
        f.write(b"REQ gen=4 crc=")  # torn: no LF yet
    state, reader = replay(tmp_path / "wal.log")
    assert state.gens[1].state == SPOOLED
    assert 3 not in state.gens and 7 not in state.gens  # a rejected record leaves no gen
    assert len(reader.bad) == 2 and len(state.rejected) == 1
    with open(tmp_path / "wal.log", "ab") as f:
        f.write(b"deadbeef\n")  # completes the torn line as garbage
    assert reader.read_new() == [] and len(reader.bad) == 3


def test_spool_roundtrip_and_corruption(tmp_path):
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "s": np.array(5, np.int64),
              "e": np.zeros((0, 2), np.uint8), "m": np.array([True, False])}
    path = tmp_path / "g.spool"
    write_spool(path, 9, arrays, {"ts": "2026-01-02T03:04:05Z"})
    with Spool(path) as spool:
        got = spool.arrays()
        assert spool.gen == 9 and spool.meta["ts"] == "2026-01-02T03:04:05Z"
        for name, array in arrays.items():
            assert np.array_equal(got[name], array) and got[name].dtype == array.dtype
        del got
    data = bytearray(path.read_bytes())
    data[-60] ^= 0xFF
    path.write_bytes(bytes(data))
    with Spool(path) as spool, pytest.raises(FormatError, match="crc32c"):
        spool.arrays()
    for bad in (b"", b"SNAPSPOOL 1\n{not json}\n", b"SNAPSPOOL 1\n" + b"x" * 100,
                b'SNAPSPOOL 1\n{"gen":1,"meta":{},"arrays":[{"name":"a","dtype":"O",'
                b'"shape":[1],"offset":0,"nbytes":8,"crc32c":0}]}\n',
                b'SNAPSPOOL 1\n{"gen":1,"meta":{},"arrays":[{"name":"a","dtype":"<f4",'
                b'"shape":[1000000],"offset":0,"nbytes":4000000,"crc32c":0}]}\n'):
        path.write_bytes(bad)
        with pytest.raises(FormatError, match=r"\[(grammar|limit|truncated|extent)\]"):
            Spool(path).arrays()


def _one_entry_spool(path, **extra) -> None:
    """A spool of one 2-byte array whose entry carries ``extra`` keys."""
    entry = {"name": "a", "dtype": "<u2", "shape": [1], "offset": 0, "nbytes": 2,
             "crc32c": 0, **extra}
    head = b"SNAPSPOOL 1\n" + json.dumps({"gen": 1, "meta": {}, "arrays": [entry]}).encode()
    path.write_bytes(head + b"\n" + bytes(-(len(head) + 1) % 64) + b"\x80\x3f")


def test_logical_dtypes_travel_as_their_bits_and_must_match_their_width(tmp_path):
    import ml_dtypes

    bits = np.arange(256, dtype=np.uint8)
    arrays = {"f8": bits.view(ml_dtypes.float8_e8m0fnu), "h": bits.view(np.uint16).view(
        ml_dtypes.bfloat16), "c": bits.view(np.uint64).view(np.complex64)}
    logical = {"f8": "f8e8m0fnu", "h": "bf16", "c": "c64"}
    stored = {n: a.view(f"<u{a.dtype.itemsize}") for n, a in arrays.items()}
    write_spool(tmp_path / "g.spool", 1, stored, {"ts": "2026-01-02T03:04:05Z"}, logical)
    with Spool(tmp_path / "g.spool") as spool:
        got = spool.arrays()
        for name, array in arrays.items():
            assert got[name].dtype == array.dtype and got[name].tobytes() == array.tobytes()
        del got
    path = tmp_path / "h.spool"
    _one_entry_spool(path, bf16=True)          # what clients before "logical" wrote
    with Spool(path) as spool:
        assert spool.entries[0].logical == "bf16"
    for extra, says in (({"logical": "f8e4m3fn"}, r"logical: .*got f8e4m3fn as <u2"),
                        ({"logical": "c128"}, r"logical: .*got c128 as <u2"),
                        ({"logical": 7}, r"logical: .*got 7 as <u2"),
                        ({"bf16": True, "logical": "bf16"}, r"bf16: a boolean, and no logical"),
                        ({"bf16": 1}, r"bf16: a boolean")):
        _one_entry_spool(path, **extra)
        with pytest.raises(FormatError, match=says):
            Spool(path)


def test_config_layers_and_errors(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[snapshot]\nformat = "aero"\nshard_max = "1MiB"\n'
                    '[[repo.remote]]\nname = "origin"\nurl = "/x.git"\n')
    config = load_config(path, env={"SNAPOPS_SNAPSHOT_RUN": "exp7",
                                    "SNAPOPS_CLIENT_MAX_IN_FLIGHT": "3"})
    assert config.snapshot.format == "aero" and config.snapshot.shard_max == 1 << 20
    assert config.snapshot.run == "exp7" and config.client.max_in_flight == 3
    assert config.repo.remotes[0].url == "/x.git" and config.base_dir == str(tmp_path)
    assert load_config(path, overrides={"snapshot.format": "wtxt"}).snapshot.format == "wtxt"
    for text, key in [('[snapshot]\nformat = "zip"\n', "snapshot.format"),
                      ('[snapshot]\nshard_max = "lots"\n', "snapshot.shard_max"),
                      ('[client]\nmax_in_flight = 0\n', "client.max_in_flight"),
                      ('[snapshot]\nbuild = "v1 (rc)"\n', "snapshot.build: expected a token"),
                      ('[nope]\n', "nope"), ('[daemon]\ncolour = 1\n', "daemon.colour"),
                      ('[[repo.remote]]\nname = "a"\n', "repo.remote[0]"),
                      ('[snapshot\n', "invalid TOML"),
                      ('[[repo.remote]]\nname = "a"\nurl = "--upload-pack=touch x"\n',
                       "repo.remote[0].url: expected a git URL or path"),
                      ('[[repo.remote]]\nname = "a"\nurl = "/srv/a.git\\nx"\n',
                       "repo.remote[0].url"),
                      ('[[repo.remote]]\nname = "a"\nurl = ""\n', "repo.remote[0].url")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            load_config(path, env={})


@pytest.mark.parametrize("text,why", [
    # found by the fuzzer: TOML's inf and a 400-digit size raised OverflowError
    ("[cluster]\nworld_size = 1e400\n", r"cluster\.world_size: expected int, got inf"),
    (f'[snapshot]\nshard_max = "{"9" * 400}MiB"\n',
     r"snapshot\.shard_max: .*larger than any file \(at most 8 EiB\)"),
    (f"[push]\nbatch_bytes = {2**63}\n", r"push\.batch_bytes: .*larger than any file"),
    # nan passed every bound (each comparison is false); inf is no delay a daemon can wait
    ("[daemon]\npoll_interval = nan\n", r"daemon\.poll_interval: expected float, got nan"),
    ("[push]\nbackoff_max = inf\n", r"push\.backoff_max: expected float, got inf"),
    # tomllib descends into nested arrays and inline tables recursively: RecursionError
    ("[daemon]\nx = " + "[" * 5000 + "]" * 5000 + "\n", r"invalid TOML: .* nested too deeply"),
    ("[daemon]\nx = " + "{a=" * 5000 + "1" + "}" * 5000 + "\n", r"nested too deeply"),
    # found by the fuzzer (--seed 44): tomllib's int() past 4300 digits raised ValueError
    ("[cluster]\nworld_size = " + "9" * 5000 + "\n", r"invalid TOML: Exceeds the limit"),
])
def test_config_values_beyond_any_bound_are_one_line(tmp_path, text, why):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=why):
        load_config(path, env={})



@pytest.mark.parametrize("text,why", [
    # each was accepted, and then every generation failed or was dropped, one by one
    ('[snapshot]\nrun = "../evil"\n', r"snapshot\.run: expected a run name"),
    ('[seal]\nage_recipients = ["notarecipient"]\n',
     r"seal\.age_recipients\[0\]: unsupported recipient"),
    ('[push]\njitter = 5\n', r"push\.jitter: expected <= 1\.0, got 5\.0"),
    ('[repo]\nbranch = "-f"\n', r"repo\.branch: expected text not starting with '-'"),
    ('[repo]\nbranch = "a..b"\n', r"repo\.branch: expected a git branch name"),
    ('[repo]\nauthor_name = "x\\ny"\n', r"repo\.author_name: .*without control characters"),
])
def test_config_values_the_daemon_would_fail_on_later_are_refused_at_load(tmp_path, text, why):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=why):
        load_config(path, env={})


def test_a_key_given_as_recipient_is_refused_without_echoing_it(tmp_path):
    secret = "AGE-SECRET-KEY-1" + "Q" * 58
    path = tmp_path / "c.toml"
    path.write_text(f'[seal]\nage_recipients = ["{secret}"]\n')
    with pytest.raises(ConfigError, match=r"age_recipients\[0\]: a secret key was given") as info:
        load_config(path, env={})
    assert secret[16:] not in str(info.value)

def test_config_file_that_is_not_a_small_utf8_regular_file_is_one_line(tmp_path):
    """A FIFO would block the daemon's start, /dev/zero would be read without end, and a
    Latin-1 file raised a bare UnicodeDecodeError."""
    fifo = tmp_path / "c.fifo"
    os.mkfifo(fifo)
    latin = tmp_path / "latin.toml"
    latin.write_bytes('[snapshot]\nbuild = "caf\xe9"\n'.encode("latin-1"))
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    for path, why in [(fifo, r"not a regular file \(a FIFO\)"),
                      ("/dev/zero", r"not a regular file \(a device\)"),
                      (tmp_path, r"not a regular file \(a folder\)"),
                      (tmp_path / "missing.toml", r"cannot read: No such file"),
                      (latin, r"config file: not UTF-8 text \(byte 23\)"),
                      (huge, r"config file: larger than 1048576 bytes")]:
        with pytest.raises(ConfigError, match=re.escape(str(path)) + r": .*" + why):
            load_config(path, env={})


def test_shipped_example_config_loads():
    from pathlib import Path

    import snapops.config

    example = Path(snapops.config.__file__).with_name("snapops.toml")
    config = load_config(example, env={})
    assert config.snapshot.format == "wtxt" and config.client.policy == "coalesce"
