"""Hostile arguments to save/load/verify: every one is refused with a typed, one-line error
naming what was wrong (or round-trips bit-exactly), the same way for every format."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import snapops
from snapops.formats.contract import SaveOptions, VerifyOptions
from snapops.formats.dtypes import dtype_name
from snapops.formats.errors import DataError, LimitError, SnapopsError
from snapops.formats.model import Snapshot
from snapops.formats.registry import HANDLER_MODULES, handler

TS = "2026-01-02T03:04:05Z"
FORMATS = list(HANDLER_MODULES)
ONES = {"w": np.ones(2)}


def target(folder: Path, name: str, stem: str = "s") -> Path:
    if name == "aeroset":
        return folder / stem / "model.aeroset.json"
    return folder / f"{stem}{handler(name).suffixes[0]}"


def nothing_written(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.is_file()]


def one_line(exc: pytest.ExceptionInfo) -> None:
    assert "\n" not in str(exc.value)


# -- 1. big-endian arrays ---------------------------------------------------------------------

BIG_ENDIAN = ["f2", "f4", "f8", "c8", "c16", "i2", "i4", "i8", "u2", "u4", "u8"]


@pytest.mark.parametrize("name", FORMATS)
def test_big_endian_arrays_round_trip_bit_exactly(tmp_path, name):
    fmt = handler(name)
    kept = [c for c in BIG_ENDIAN if fmt.capabilities.holds(np.dtype(">" + c))]
    assert {"f2", "f4", "c8", "i2", "u4"} <= set(kept)
    rng = np.random.default_rng(1)
    state = {f"a_{c}": rng.integers(0, 256, 6 * int(c[1:]), dtype=np.uint8).view("<" + c)
             .astype(">" + c).reshape(2, 3) for c in kept}
    back = fmt.load(fmt.save(state, target(tmp_path, name), gen=1, ts=TS).path)
    for key, array in state.items():
        little = array.dtype.newbyteorder("<")
        assert dtype_name(back[key].dtype) == dtype_name(array.dtype), key
        assert back[key].dtype.isnative, key          # what torch.from_numpy takes
        assert back[key].astype(little).tobytes() == array.astype(little).tobytes(), key
    (tmp_path / "little").mkdir()
    same = fmt.save({k: a.astype(a.dtype.newbyteorder("<")) for k, a in state.items()},
                    target(tmp_path / "little", name), gen=1, ts=TS)
    if name != "fold":       # FOLD's header holds a random id: no two of its files are equal
        assert same.sha256 == fmt.save(state, target(tmp_path, name), gen=1, ts=TS).sha256


def test_a_foreign_npz_of_big_endian_arrays_loads_in_native_order(tmp_path):
    path = tmp_path / "numpy.npz"
    values = np.arange(12, dtype=">f4").reshape(3, 4)
    np.savez(path, w=values, t=np.asfortranarray(values.astype(">i8")))
    back = snapops.load(path)
    assert back["w"].dtype == np.float32 and back["w"].dtype.isnative
    assert back["t"].dtype == np.int64 and back["t"].dtype.isnative
    assert np.array_equal(back["w"], values) and np.array_equal(back["t"], values)
    with handler("npz").open_lazy(path) as lazy:
        assert lazy.spec("w") == (np.dtype("<f4"), (3, 4))


# -- 2. gen / ts / build: one rule, every format ----------------------------------------------

BAD_COMMON = [("gen", -1), ("gen", 1.5), ("gen", True), ("gen", [1]), ("gen", "x"),
              ("gen", b"1"), ("gen", 2**64), ("ts", "not a time"), ("ts", 12345),
              ("ts", "2026-13-45T99:99:99Z"), ("ts", "2026-1-02T03:04:05Z"),
              ("ts", "\u0662026-01-02T03:04:05Z"), ("build", 123), ("build", "a\nb"),
              ("build", "\x00"), ("build", "x" * 5000), ("build", "\ud800"), ("build", "")]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("key,value", BAD_COMMON, ids=[f"{k}-{i}" for i, (k, _) in
                                                        enumerate(BAD_COMMON)])
def test_gen_ts_build_are_checked_alike_by_every_format(tmp_path, name, key, value):
    with pytest.raises(DataError, match=rf"^{name} writer: {key}=.*: expected ") as exc:
        snapops.save(ONES, target(tmp_path, name), format=name, **{key: value})
    one_line(exc)
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("name", FORMATS)
def test_gen_ts_build_none_means_not_given_and_types_come_back(tmp_path, name):
    path = snapops.save(ONES, target(tmp_path, name), format=name, gen=None, ts=None,
                        build=None).path
    assert handler(name).load(path)["w"].tolist() == [1.0, 1.0]
    path = snapops.save(ONES, target(tmp_path, name, "b"), format=name, gen=5, ts=TS,
                        build="b1").path
    meta = handler(name).load(path).meta
    assert (meta["gen"], meta["ts"], meta["build"]) == (5, TS, "b1")
    assert type(meta["gen"]) is int


def test_gen_a_snapshot_carries_obeys_the_same_rule(tmp_path):
    with pytest.raises(DataError, match=r"aero: snapshot meta gen='x': expected an integer"):
        snapops.save(Snapshot({"w": np.ones(2)}, {"gen": "x"}), tmp_path / "m.aero")


def test_save_options_checked_when_built_directly():
    with pytest.raises(DataError, match=r"^gen=-1: expected an integer in 0\.\."):
        SaveOptions(gen=-1)


# -- 3. saves that would write a file that does not load --------------------------------------

@pytest.mark.parametrize("name,fields,match", [
    ("wtxt", {"build": "x" * 5000}, r"build='x+\.\.\.: expected a token"),
    ("wtxt", {"rows_per_chunk": True}, r"rows_per_chunk=True: expected an integer in 1\.\."),
    ("wtxt", {"rows_per_chunk": 0}, r"rows_per_chunk=0: expected an integer in 1\.\."),
    ("finf", {"build": "\ud800"}, r"build='\\ud800': expected a token"),
])
def test_options_that_would_write_an_unloadable_file_are_refused(tmp_path, name, fields,
                                                                match):
    with pytest.raises(DataError, match=match):
        snapops.save(ONES, target(tmp_path, name), **fields)
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("name", FORMATS)
def test_a_name_that_is_not_unicode_is_refused_by_every_format(tmp_path, name):
    with pytest.raises(DataError, match=r"array name '\\ud800' is not valid Unicode"):
        snapops.save({"\ud800": np.ones(2)}, target(tmp_path, name), format=name)
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("name", [n for n in FORMATS if n != "wtxt"])
def test_meta_text_that_is_not_unicode_is_refused(tmp_path, name):
    snap = Snapshot({"w": np.ones(2)}, {"note": ["ok", "\udfff"]})
    with pytest.raises(DataError, match=r"meta 'note' '\\udfff' is not valid Unicode"):
        snapops.save(snap, target(tmp_path, name), format=name)


# -- 4. writer option values ------------------------------------------------------------------

WRITER_OPTIONS = [
    ("wtxt", "merkle_prev", 5, "a string or None"), ("wtxt", "audit", 5, "a string or None"),
    ("wtxt", "hmac_key", 5, "bytes or a string"), ("wtxt", "sign_key", 5.0, "Ed25519PrivateKey"),
    ("wtxt", "threads", "x", r"an integer in 1\.\.1024"),
    ("wtxt", "threads", None, r"an integer in 1\.\.1024$"),
    ("wtxt", "row_blocking", "false", "True or False"), ("wtxt", "streaming", 1, "True or False"),
    ("wtxt", "schema", "a b", "a token"),
    ("aero", "zstd_level", None, r"an integer in -131072\.\.22$"),
    ("aero", "zstd_level", 1.5, "an integer"), ("aero", "zstd_level", "x", "an integer"),
    ("aero", "zstd_level", 2**70, "an integer"), ("aero", "zstd_level", 10**9, "an integer"),
    ("aero", "workers", "x", "an integer"), ("aero", "page_hashes", "yes", "True or False"),
    ("aero", "control_integrity", 0, "True or False"), ("aero", "page_size", 0, "1..1099"),
    ("aeroset", "zstd_level", "x", "an integer"), ("aeroset", "workers", 0, r"1\.\.1024"),
    ("aeroset", "part_shards", "2", "an integer >= 1"),
    ("fold", "segment", None, "an integer in 1"), ("fold", "segment", "x", "an integer in 1"),
    ("fold", "segment", 1.5, "an integer in 1"), ("fold", "level", 99, r"-131072\.\.22"),
    ("fold", "created_at", "now", "a number or None"),
    ("finf", "align", None, "an integer in 1"), ("finf", "align", 1.5, "an integer in 1"),
    ("finf", "align", 2**70, "an integer in 1"), ("finf", "reserve", None, "an integer in 0"),
    ("finf", "reserve", 2**70, "an integer in 0"), ("finf", "workers", -1, "an integer in 1"),
    ("finf", "zstd_level", "x", "an integer"), ("finf", "checksum", "false", "True or False"),
    ("pycauset", "checksum", "false", "True or False"), ("pycauset", "layout", 5, "a string"),
]


@pytest.mark.parametrize("name,key,value,expected", WRITER_OPTIONS,
                         ids=[f"{n}-{k}-{i}" for i, (n, k, _, _) in enumerate(WRITER_OPTIONS)])
def test_writer_option_values_are_typed(tmp_path, name, key, value, expected):
    with pytest.raises(DataError, match=rf"^{name} writer: {key}=.*: expected .*{expected}"):
        snapops.save(ONES, target(tmp_path, name), format=name, **{key: value})
    assert nothing_written(tmp_path)


def test_a_checksum_option_of_false_text_never_turns_checksums_on(tmp_path):
    with pytest.raises(DataError, match=r"checksum='false': expected True or False"):
        snapops.save(ONES, tmp_path / "c.finf", checksum="false")


# -- 5. verify / load options -----------------------------------------------------------------

VERIFY_OPTIONS = [("hmac_key", 5, "bytes or a string"), ("trusted_keys", 5, "key files"),
                  ("trusted_keys", [5], "key files"), ("wsum", 5, "a string"),
                  ("workers", "x", "an integer in 1"), ("limits", 5, "a DeclaredLimits"),
                  ("require_signature", "no", "True or False"), ("level", 1, "a string")]


@pytest.mark.parametrize("name", ["wtxt", "aero", "npz", "fold"])
@pytest.mark.parametrize("key,value,expected", VERIFY_OPTIONS,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(VERIFY_OPTIONS)])
def test_verify_and_load_option_values_are_typed(tmp_path, name, key, value, expected):
    path = snapops.save(ONES, target(tmp_path, name), format=name).path
    with pytest.raises(DataError, match=rf"^verify: {key}=.*: expected {expected}"):
        snapops.verify(path, **{key: value})
    with pytest.raises(DataError, match=rf"^{name} load: {key}=.*: expected {expected}"):
        handler(name).load(path, **{key: value})


def test_a_trusted_key_path_no_file_system_holds_is_refused_as_a_key_problem(tmp_path):
    """It was reported as the file under test being unreadable ("[io] ... File name too
    long"), which blamed the wrong file."""
    path = snapops.save(ONES, tmp_path / "k.wtxt").path
    report = snapops.verify(path, trusted_keys=[tmp_path / ("k" * 300)])
    assert not report.ok and report.failure.check == "keys"
    assert "trusted key path too long (at most 255 bytes a name" in str(report.failure)
    with pytest.raises(SnapopsError, match=r"trusted key path too long"):
        handler("wtxt").load(path, trusted_keys=[tmp_path / ("k" * 300)])


def test_verify_options_checked_when_built_directly():
    with pytest.raises(DataError, match=r"^limits=5: expected a DeclaredLimits or None"):
        VerifyOptions(limits=5)


@pytest.mark.parametrize("name", FORMATS)
def test_an_options_mapping_with_a_key_that_is_no_str_is_refused(tmp_path, name):
    with pytest.raises(DataError, match=r"writer: option names must be strings, got 1"):
        snapops.save(ONES, target(tmp_path, name), {1: 2}, format=name)
    path = snapops.save(ONES, target(tmp_path, name), format=name).path
    with pytest.raises(DataError, match=r"load: option names must be strings, got 1"):
        handler(name).load(path, {1: 2})
    with pytest.raises(DataError, match=r"verify: option names must be strings, got 1"):
        snapops.verify(path, {1: 2})


# -- 6. state contents ------------------------------------------------------------------------

@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("state,match", [
    ({"w": [1, [2, 3]]}, r"array 'w': expected an array-like of one shape"),
    (Snapshot({1: np.ones(2)}), r"array names must be str, got 1"),
    (Snapshot({"w": np.ones(2)}, {1: 2}), r"meta keys must be str, got 1"),
    ({"w": np.ma.masked_array([1.0, 2.0], [False, True])}, r"masked array would lose its mask"),
    (Snapshot({"w": np.ones(2)}, [("a", 1)]), r"arrays and meta must be mappings"),
], ids=["ragged", "int-name", "int-meta-key", "masked", "meta-list"])
def test_state_contents_are_refused_the_same_way(tmp_path, name, state, match):
    with pytest.raises(DataError, match=match) as exc:
        snapops.save(state, target(tmp_path, name), format=name)
    one_line(exc)
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("name", FORMATS)
def test_a_snapshot_of_lists_is_coerced_like_a_mapping(tmp_path, name):
    path = snapops.save(Snapshot({"w": [1, 2]}), target(tmp_path, name), format=name).path
    assert handler(name).load(path)["w"].tolist() == [1, 2]


def test_wtxt_keeps_its_own_meta_and_writes_no_other(tmp_path):
    snapops.save(Snapshot({"w": np.ones(2)}, {"lr": 0.1, "run": "r1"}), tmp_path / "m.wtxt")
    assert "lr" not in snapops.load(tmp_path / "m.wtxt").meta
    first = snapops.load(snapops.save(ONES, tmp_path / "a.wtxt", gen=4, ts=TS).path)
    again = snapops.load(snapops.save(first, tmp_path / "b.wtxt").path)
    assert (again.meta["gen"], again.meta["ts"]) == (4, TS)


# -- 7. arrays larger than any reader accepts -------------------------------------------------

@pytest.mark.parametrize("name", FORMATS)
def test_a_zero_stride_giant_is_a_limit_error_before_any_copy(tmp_path, name):
    giant = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(10**12,),
                                            strides=(0,))
    with pytest.raises(LimitError, match=r"array 'w' is larger than readers accept.*"
                                         r"at most 68719476736 bytes"):
        snapops.save({"w": giant}, target(tmp_path, name), format=name)
    assert nothing_written(tmp_path)


# -- 8. messages name the formats that really keep a dtype ------------------------------------

@pytest.mark.parametrize("name,dtype,match", [
    ("aero", np.complex128, r"cannot hold dtype c128 .*; FOLD, PyCauset, npz and pt keep it$"),
    ("safetensors", np.complex128, r"dtype c128 .*; FOLD, PyCauset, npz and pt keep it$"),
    ("pt", np.longdouble, r"pt cannot hold dtype float128 .*; FOLD keeps it$"),
    ("pycauset", ml_dtypes.int4, r"cannot hold dtype int4 .*; FOLD keeps it$"),
    ("wtxt", ml_dtypes.float8_e4m3b11fnuz, r"cannot hold dtype float8_e4m3b11fnuz "),
    ("aero", np.dtype([("a", "<i4"), ("b", "<f8")]),
     r"cannot hold dtype structured \[\('a', '<i4'\), \('b', '<f8'\)\]"),
    ("pt", "datetime64[s]", r"pt cannot hold dtype <M8\[s\] .*; FOLD keeps it$"),
])
def test_a_refused_dtype_is_named_and_so_are_the_formats_keeping_it(tmp_path, name, dtype,
                                                                   match):
    with pytest.raises(DataError, match=match):
        snapops.save({"t": np.zeros(2, dtype)}, target(tmp_path, name), format=name)
