"""WTXT round trips, determinism, lazy access and writer input validation."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from snapops.formats import wtxt
from snapops.formats.errors import DataError, FormatError, UnsupportedVersionError
from snapops.formats.model import Snapshot
from tests.conftest import sample_state

TS = "2026-01-02T03:04:05Z"
ALL_DTYPES = ["<f8", "<f4", "<i8", "<u8", "<i4", "<u4", "<i2", "<u2", "i1", "u1"]


def _roundtrip(tmp_path, state, **opts):
    path = tmp_path / "rt.wtxt"
    wtxt.save(state, path, gen=5, ts=TS, **opts)
    report = wtxt.verify(path)
    assert report.ok, report.failure
    loaded = wtxt.load(path)
    assert list(loaded.arrays) == sorted(state)
    for name, array in state.items():
        got = loaded[name]
        assert got.shape == array.shape and got.dtype == array.dtype.newbyteorder("<")
        assert got.tobytes() == np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
    return path


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("blocking", [{}, {"row_blocking": True}, {"rows_per_chunk": 3}])
def test_every_dtype_roundtrips(tmp_path, dtype, blocking):
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info:
        values = rng.integers(info.min, info.max, (33, 7), dtype=np.dtype(dtype), endpoint=True)
    else:
        values = rng.standard_normal((33, 7)).astype(dtype)
        values.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    scalar = values.reshape(-1)[5].copy().reshape(())
    _roundtrip(tmp_path, {"m": values, "s": scalar, "e": values[:0]}, **blocking)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 56, 57, 58, 113, 114, 115, 32767, 32768, 32769,
                                  65535, 65536, 65537, 3 * 32768 + 57])
@pytest.mark.parametrize("blocking", [{}, {"row_blocking": True}])
def test_boundary_sizes_roundtrip(tmp_path, size, blocking):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    path = _roundtrip(tmp_path, {"a": data, "b": data.reshape(-1, 1)}, **blocking)
    keywords = (b"WTXT", b"meta ", b"cap ", b"root ", b"arr ", b"idx ", b"ch ", b"endch",
                b"endarr", b"endwtxt")
    body = [line for line in path.read_bytes().split(b"\n")[:-1] if not line.startswith(keywords)]
    assert all(re.fullmatch(rb"[A-Za-z0-9+/=]{1,76} [0-9a-f]", line) for line in body)
    per_array = sum(-(-min(32768, size - off) // 57) for off in range(0, size, 32768))
    assert len(body) == 2 * per_array


def test_nan_payloads_keep_their_bits(tmp_path):
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001], dtype=np.uint32)
    state = {"f": bits.view(np.float32)}
    path = _roundtrip(tmp_path, state)
    assert wtxt.load(path)["f"].view(np.uint32).tolist() == bits.tolist()


def test_same_bytes_twice_and_input_order_irrelevant(tmp_path):
    state = sample_state()
    reversed_state = dict(reversed(list(state.items())))
    a, b = io.BytesIO(), io.BytesIO()
    wtxt.write(state, a, gen=1, ts=TS, row_blocking=True)
    wtxt.write(reversed_state, b, gen=1, ts=TS, row_blocking=True)
    wtxt.save(state, tmp_path / "c.wtxt", gen=1, ts=TS, row_blocking=True, threads=1)
    assert a.getvalue() == b.getvalue() == (tmp_path / "c.wtxt").read_bytes()


def test_non_seekable_output_gives_same_bytes(tmp_path, keydir):
    class Pipe(io.RawIOBase):
        def __init__(self):
            self.parts = []

        def writable(self):
            return True

        def seekable(self):
            return False

        def write(self, b):
            self.parts.append(bytes(b))
            return len(b)

    opts = dict(gen=9, ts=TS, row_blocking=True, hmac_key=keydir / "hmac.key",
                sign_key=keydir / "signing.key")
    pipe = Pipe()
    wtxt.write(sample_state(), pipe, **opts)
    wtxt.save(sample_state(), tmp_path / "f.wtxt", **opts)
    assert b"".join(pipe.parts) == (tmp_path / "f.wtxt").read_bytes()


def test_identical_across_processes(tmp_path):
    np.savez(tmp_path / "s.npz", **sample_state())
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"p{seed}.wtxt"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-m", "snapops", "convert", str(tmp_path / "s.npz"),
                        str(out), "--gen", "3", "--ts", TS, "--row-blocking"],
                       check=True, env=env, capture_output=True)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_source_date_epoch_sets_default_ts(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767323045")
    wtxt.save({"a": np.ones(3)}, tmp_path / "a.wtxt", gen=1)
    assert wtxt.read_header(tmp_path / "a.wtxt").ts == "2026-01-02T03:04:05Z"


def test_lazy_reads_one_array_without_decoding_others(tmp_path):
    state = sample_state()
    path = tmp_path / "lazy.wtxt"
    wtxt.save(state, path, gen=1, ts=TS, row_blocking=True)
    data = bytearray(path.read_bytes())
    # Corrupt the 'ids' array; 'emb' must still load lazily (its bytes are never touched).
    at = data.index(b"arr name=ids")
    at = data.index(b"\n", data.index(b"\nch ", at) + 1) + 5
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    path.write_bytes(bytes(data))
    with wtxt.open_lazy(path) as lazy:
        assert lazy.names == sorted(state)
        assert np.array_equal(lazy["emb"], state["emb"])
        with pytest.raises(FormatError, match=r"\[parity\] array ids, chunk 0") as err:
            lazy["ids"]
    assert "ids" in str(err.value)
    with pytest.raises(FormatError, match=r"lazy.wtxt: \[grammar\] file is closed"):
        lazy["emb"]


def test_torch_names_round_trip_without_flags(tmp_path):
    state = {"layer.0.weight": np.ones((2, 2), np.float32), "head.bias": np.zeros(2)}
    wtxt.save(state, tmp_path / "x.wtxt", gen=1, ts=TS)
    assert sorted(wtxt.load(tmp_path / "x.wtxt").arrays) == sorted(state)
    text = (tmp_path / "x.wtxt").read_bytes()
    assert b"arr name=layer__0__weight " in text and b"audit snapops_names=dots\n" in text
    with wtxt.open_lazy(tmp_path / "x.wtxt") as lazy:
        assert sorted(lazy.names) == sorted(state)


@pytest.mark.parametrize("name", ["a.b", "with space", "é", "", "a-b", "x" * 256, "a__b",
                                  "a_.b", "blocks.0"])
def test_names_wtxt_cannot_spell_are_recorded(tmp_path, name):
    state = {name: np.ones(1), "blocks__0": np.zeros(1), "plain": np.arange(3)}
    wtxt.save(state, tmp_path / "x.wtxt", gen=1, ts=TS)
    back = wtxt.load(tmp_path / "x.wtxt")
    assert Snapshot(state).equal(back)
    stored = [row.get("stored_name", row["name"]) for row in wtxt.inspect(tmp_path / "x.wtxt")[
        "arrays"]]
    assert all(re.fullmatch(r"[A-Za-z0-9_]{1,255}", n) for n in stored)


def test_names_that_need_no_mapping_leave_the_file_alone(tmp_path):
    wtxt.save({"w": np.ones(2), "a__b": np.zeros(1)}, tmp_path / "x.wtxt", gen=1, ts=TS)
    assert b"audit" not in (tmp_path / "x.wtxt").read_bytes()
    assert sorted(wtxt.load(tmp_path / "x.wtxt").arrays) == ["a__b", "w"]


@pytest.mark.parametrize("array,logical", [
    (np.ones(2, bool), "bool"), (np.ones(2, np.float16), "f16"), (np.ones(2, np.complex64), "c64"),
])
def test_dtypes_wtxt_does_not_define_are_recorded(tmp_path, array, logical):
    wtxt.save({"w": array}, tmp_path / "x.wtxt", gen=1, ts=TS)
    back = wtxt.load(tmp_path / "x.wtxt")
    assert back["w"].dtype == array.dtype and back["w"].tobytes() == array.tobytes()
    assert "unbound metadata" in back.meta["snapops_dtypes_note"]
    report = wtxt.verify(tmp_path / "x.wtxt")
    assert report.ok and any(f"w: {logical}" in note for note in report.notes)


@pytest.mark.parametrize("array,match", [
    (np.ones(2, np.complex128), "c128"), (np.array(["a"]), "<U1"),
])
def test_unsupported_dtypes_refused_by_name(tmp_path, array, match):
    with pytest.raises(DataError, match=match) as err:
        wtxt.save({"bad_one": array}, tmp_path / "x.wtxt", gen=1, ts=TS)
    assert "bad_one" in str(err.value) and "FOLD" in str(err.value)
    assert not list(tmp_path.iterdir()), "no partial file may be left behind"


@pytest.mark.parametrize("opts,match", [
    ({"gen": -1}, "gen=-1"), ({"ts": "2026-13-01T00:00:00Z"}, "ts="),
    ({"ts": "2026-01-01 00:00:00"}, "ts="), ({"build": "has space"}, "build="),
    ({"host": ""}, "host="), ({"merkle_prev": "AB" * 32}, "merkle_prev"),
    ({"rows_per_chunk": 0}, "rows_per_chunk"), ({"audit": 'bad"quote'}, "audit="),
    ({"audit": "no_value"}, "audit="), ({"nonsense": 1}, "unknown option 'nonsense'"),
])
def test_bad_options_refused(tmp_path, opts, match):
    opts = {"gen": 1, "ts": TS} | opts
    with pytest.raises(DataError, match=match):
        wtxt.save({"a": np.ones(1)}, tmp_path / "x.wtxt", **opts)
    assert not (tmp_path / "x.wtxt").exists()


def test_large_single_row_chunk_streams(tmp_path):
    # One row of 2 MiB: a chunk bigger than the writer's batch goes through the piece path.
    row = np.random.default_rng(3).standard_normal((2, 300_000)).astype(np.float32)
    _roundtrip(tmp_path, {"wide": row}, row_blocking=True)


def test_header_from_an_open_stream(tmp_path, keydir):
    wtxt.save(sample_state(), tmp_path / "s.wtxt", gen=12, ts=TS, sign_key=keydir / "signing.key")
    with open(tmp_path / "s.wtxt", "rb") as f:
        info = wtxt.read_header_from(f)
    assert info == wtxt.read_header(tmp_path / "s.wtxt")
    assert info.gen == 12 and info.keyid is not None
    with pytest.raises(UnsupportedVersionError, match=r"pipe:1: \[version\]"):
        wtxt.read_header_from(io.BytesIO(b"WTXT 2\n"), "pipe")
