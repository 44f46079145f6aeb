"""FOLD: round trips, ECC repair, hashes, limits and hostile input (the pyfolds interop is in
test_fold_interop.py)."""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import zipfile

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapops.formats import fold, registry
from snapops.formats.errors import (
    ChecksumError, DataError, FormatError, LimitError, TruncatedError, UnsupportedVersionError,
)
from snapops.formats.fold import _ecc
from snapops.formats.fold.verify import verify_file
from snapops.formats.model import Snapshot
from tests.formats import fold_forge as forge

DTYPES = ["?", "i1", "u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8",
          "<c8", "<c16", np.dtype(np.longdouble).str, np.dtype(np.clongdouble).str,
          "<M8[ns]", "<M8[D]", "<m8[s]", "<M8", "S5", "<U3", "V4"]
SHAPES = [(), (0,), (3, 0, 2), (7,), (5, 3)]


def load_with(path, **options):
    """FOLD's own reader with reader options (use_mmap, workers, trusted)."""
    with fold.FoldFile.open(path, **options) as f:
        return f.load()


def _sample(dtype: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    if dt.kind == "b":
        raw = raw % 2
    if dt.kind in "SU":
        raw = rng.integers(65, 90, raw.size, dtype=np.uint8) if dt.kind == "S" else \
            rng.integers(65, 90, raw.size // 4, dtype=np.uint32).view(np.uint8)
    return raw.view(dt).reshape(shape)


def state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "emb": rng.standard_normal((40, 24)).astype(np.float32),
        "bias": rng.standard_normal(57),
        "ids": rng.integers(0, 2**32, 900, dtype=np.uint32),
        "step": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 4), np.float32),
    }


def same(a, b) -> bool:
    return Snapshot.coerce(a).equal(Snapshot.coerce(b))


# -- round trips --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_shape_round_trips(dtype):
    snap = {f"a{i}": _sample(dtype, shape, i) for i, shape in enumerate(SHAPES)}
    back = fold.loads(fold.dumps(snap))
    assert same(snap, back)
    for name, array in snap.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        assert back[name].flags.writeable


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("ecc", ["none", "low", "rs(32)", "high", "rs(7)"])
def test_options_round_trip_through_files(tmp_path, compression, ecc):
    snap = state()
    path = tmp_path / "s.fold"
    info = fold.save(snap, path, compression=compression, ecc=ecc, segment=1000)
    assert info.details["chunks"] > len(snap)       # multi-piece arrays
    assert info.size == path.stat().st_size
    assert same(snap, fold.load(path))
    assert same(snap, load_with(path, use_mmap=False, workers=1))
    report = verify_file(path, use_mmap=ecc == "low")
    assert report.ok and not report.notes, report.summary()
    assert report.arrays == len(snap)
    assert [p.name for p in tmp_path.iterdir()] == ["s.fold"]


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "int4"])
def test_ml_dtypes_round_trip_by_name(name):
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, name))
    snap = {"x": np.arange(-3, 5).astype(np.float32).astype(dt).reshape(2, 4)}
    data = fold.dumps(snap)
    assert forge.index_of(data)["metadata"]["snapops"]["arrays"][0]["dtype"] == name
    back = fold.loads(data)
    assert back["x"].dtype == dt and same(snap, back)


def test_non_native_layouts_and_meta(tmp_path):
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    snap = Snapshot({"t": base.T, "strided": base[::2, ::3], "be": base.astype(">i4")},
                    {"gen": 3, "note": "ü", "lr": 0.5, "flag": True})
    back = fold.loads(fold.dumps(snap))
    assert np.array_equal(back["t"], base.T) and np.array_equal(back["strided"], base[::2, ::3])
    assert back["be"].dtype == np.dtype("<i4") and np.array_equal(back["be"], base)
    assert back.meta == snap.meta
    with pytest.raises(DataError, match=r"meta 'bad': only str keys and"):
        fold.dumps(Snapshot({"x": np.zeros(2)}, {"bad": [1]}))
    with pytest.raises(DataError, match=r"array 's': dtype \[\('a', '<i4'\)\] cannot"):
        fold.dumps({"s": np.zeros(2, [("a", "i4")])})


def test_deterministic_and_canonical_order(monkeypatch):
    snap = state()
    one = fold.dumps(snap, ecc="rs(16)")
    assert one == fold.dumps(dict(reversed(list(snap.items()))), ecc="rs(16)")
    assert fold.dumps(snap, workers=1) == fold.dumps(snap, workers=2)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert forge.index_of(fold.dumps(snap))["created_at_unix"] == 1700000000.0


def test_index_keys_and_hashes_follow_the_peer():
    data = fold.dumps(state(), ecc="rs(32)")
    index = forge.index_of(data)
    assert list(index) == ["format", "version", "created_at_unix", "metadata", "chunks"]
    assert (index["format"], index["version"]) == ("fold", "1.2.0")
    assert list(index["metadata"])[-2:] == ["chunk_hashes", "manifest_hash"]
    assert index["metadata"]["manifest_hash"] == forge.manifest(index["metadata"])
    for entry in index["chunks"]:
        assert list(entry) == ["name", "ctype", "flags", "offset", "header_len", "comp_len",
                               "uncomp_len", "crc32c", "sha256", "ecc_algo", "ecc_len"]
        at = entry["offset"] + 32
        comp = data[at:at + entry["comp_len"]]
        assert entry["crc32c"] == forge.crc32c(comp)
        assert index["metadata"]["chunk_hashes"][entry["name"]] == entry["sha256"]
        assert struct.unpack(">4sIQQII", data[entry["offset"]:at]) == (
            b"NDAR", 1, entry["uncomp_len"], entry["comp_len"], entry["crc32c"],
            entry["ecc_len"])
        assert entry["ecc_len"] == -(-entry["comp_len"] // 223) * 32
    assert forge.crc32c(b"123456789") == 0xE3069283


def test_segmented_names_and_collisions():
    snap = {"w": np.zeros(3000, np.uint8), "w#1x": np.ones(1, np.uint8)}
    index = forge.index_of(fold.dumps(snap, segment=1024))
    table = index["metadata"]["snapops"]["arrays"]
    assert table[0] == {"name": "w", "dtype": "|u1", "shape": [3000],
                        "chunks": ["w", "w#1", "w#2"]}
    with pytest.raises(DataError, match="used twice"):
        fold.dumps({"w": np.zeros(3000, np.uint8), "w#1": np.ones(1)}, segment=1024)


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "a.fold"
    fold.save({"x": np.ones(3)}, path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk on fire")
    monkeypatch.setattr("snapops.formats.fold._write.index_bytes", boom)
    with pytest.raises(OSError, match=r"disk on fire"):
        fold.save({"x": np.zeros(3)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.fold"]


# -- ECC ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("nsym", [1, 16, 32, 64, 200])
def test_parity_matches_reedsolo(nsym):
    import reedsolo  # a test extra (pyproject), installed by .ci/setup

    k = 255 - nsym
    rng = np.random.default_rng(nsym)
    for size in (1, k - 1, k, k + 1, 3 * k + 5):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        want = b"".join(bytes(reedsolo.RSCodec(nsym).encode(bytearray(data[i:i + k])))[-nsym:]
                        for i in range(0, size, k))
        assert _ecc.parity(data, nsym) == want


def _payload_offsets(data: bytes, name: str) -> tuple[int, int, int]:
    entry = next(c for c in forge.index_of(data)["chunks"] if c["name"] == name)
    return entry["offset"] + 32, entry["comp_len"], entry["ecc_len"]


def _flip(data: bytes, positions) -> bytes:
    out = bytearray(data)
    for p in positions:
        out[p] ^= 0x5A
    return bytes(out)


@pytest.mark.parametrize("ecc,nsym", [("low", 16), ("med", 32), ("high", 64)])
def test_ecc_corrects_and_reports(tmp_path, ecc, nsym):
    snap = {"w": np.random.default_rng(1).standard_normal(2000)}
    data = fold.dumps(snap, ecc=ecc, compression="none")
    start, comp_len, _ = _payload_offsets(data, "w")
    k = 255 - nsym
    # nsym/2 errors in block 0, one in block 3, one in the parity of block 5
    hits = [start + i * 3 for i in range(nsym // 2)] + [start + 3 * k + 7,
                                                        start + comp_len + 5 * nsym + 1]
    path = tmp_path / "hit.fold"
    path.write_bytes(_flip(data, hits))
    assert same(snap, fold.load(path))
    assert same(snap, load_with(path, use_mmap=False))
    with fold.FoldFile.open(path) as f:
        assert np.array_equal(f["w"], snap["w"])
        assert f.events.results[0].repair.data_bytes == nsym // 2 + 1
    report = fold.verify(path)
    assert report.ok, report.summary()
    [found] = report.details["ecc"]
    assert (found["chunk"], found["bad_blocks"]) == ("w", 3)
    assert found["corrected_data_bytes"] == nsym // 2 + 1
    assert found["corrected_parity_bytes"] == 1
    assert found["corrected_offsets"][:2] == [0, 3]
    assert "corrected" in report.notes[0]


def test_too_many_errors_is_a_typed_error(tmp_path):
    data = fold.dumps({"w": np.arange(500.0)}, ecc="rs(16)", compression="none")
    start, _, _ = _payload_offsets(data, "w")
    path = tmp_path / "bad.fold"
    path.write_bytes(_flip(data, range(start, start + 9)))     # 9 > 16/2 in one block
    with pytest.raises(ChecksumError, match=r"\[ecc\] chunk 0: chunk 'w' is") as err:
        fold.load(path)
    assert err.value.check == "ecc" and err.value.path == str(path)
    report = fold.verify(path)
    assert not report.ok and report.failure.check == "ecc"


def test_ecc_repair_cap():
    data = fold.dumps({"w": np.arange(5000.0)}, ecc="rs(16)", compression="none")
    start, comp_len, _ = _payload_offsets(data, "w")
    hurt = _flip(data, range(start, start + comp_len, 239))   # one error in every block
    assert same({"w": np.arange(5000.0)}, fold.loads(hurt))
    with pytest.raises(ChecksumError, match="at most 3"):
        fold.loads(hurt, limits=fold.Limits(max_ecc_repairs=3))
    # the budget is per file: two damaged arrays share it
    two = fold.dumps({"a": np.arange(50.0), "b": np.arange(50.0)}, ecc="rs(16)",
                     compression="none")
    (sa, _, _), (sb, _, _) = _payload_offsets(two, "a"), _payload_offsets(two, "b")
    hurt = _flip(two, [sa, sa + 239, sb])
    assert fold.loads(hurt, limits=fold.Limits(max_ecc_repairs=3))["b"][0] == 0
    with pytest.raises(ChecksumError, match="per file"):
        fold.loads(hurt, limits=fold.Limits(max_ecc_repairs=2))


def test_damaged_parity_with_intact_data_is_accepted(tmp_path):
    data = fold.dumps({"w": np.arange(500.0)}, ecc="rs(16)", compression="none")
    start, comp_len, ecc_len = _payload_offsets(data, "w")
    path = tmp_path / "p.fold"
    path.write_bytes(_flip(data, range(start + comp_len, start + comp_len + ecc_len)))
    assert same({"w": np.arange(500.0)}, fold.load(path))
    report = fold.verify(path)
    assert report.ok and report.details["ecc"][0]["ecc_unusable"]
    assert "unusable" in report.notes[0]


def test_crc_without_ecc_and_sha_mismatch():
    data = fold.dumps({"w": np.arange(50.0)}, compression="none")
    start, _, _ = _payload_offsets(data, "w")
    with pytest.raises(ChecksumError, match=r"\[crc32c\] chunk 0: chunk 'w' CRC32C") as err:
        fold.loads(_flip(data, [start + 4]))
    assert err.value.check == "crc32c"
    # a forged entry whose CRC holds but whose SHA-256 (and chunk_hashes) were changed
    index = forge.index_of(data)
    index["chunks"][0]["sha256"] = "0" * 64
    index["metadata"]["chunk_hashes"]["w"] = "0" * 64
    with pytest.raises(ChecksumError,
                       match=r"\[chunk_sha256\] chunk 0: chunk 'w' SHA\-256") as err:
        fold.loads(forge.with_index(data, forge.dump(forge.rehash(index))))
    assert err.value.check == "chunk_sha256"


# -- index hashes -------------------------------------------------------------------------------

def test_manifest_hash_tamper_is_an_error(tmp_path):
    data = fold.dumps(Snapshot({"w": np.zeros(3)}, {"gen": 1}))
    index = forge.index_of(data)
    index["metadata"]["snapops"]["meta"]["gen"] = 2
    path = tmp_path / "t.fold"
    path.write_bytes(forge.with_index(data, forge.dump(index)))
    with pytest.raises(ChecksumError,
                       match=r"\[manifest_hash\] manifest_hash does not match the") as err:
        fold.load(path)
    assert err.value.check == "manifest_hash"
    assert fold.verify(path).failure.check == "manifest_hash"
    index["metadata"]["manifest_hash"] = "f" * 64
    with pytest.raises(ChecksumError, match=r"\[manifest_hash\] manifest_hash does not match the"):
        fold.loads(forge.with_index(data, forge.dump(index)))


def test_chunk_hashes_must_match_entries():
    data = fold.dumps({"w": np.zeros(3)})
    index = forge.index_of(data)
    index["metadata"]["chunk_hashes"]["w"] = "1" * 64
    with pytest.raises(FormatError,
                       match=r"\[chunk_hashes\] chunk 0: chunk_hashes\['w'\] differs from") as err:
        fold.loads(forge.with_index(data, forge.dump(forge.rehash(index))))
    assert err.value.check == "chunk_hashes"
    del index["metadata"]["chunk_hashes"]
    with pytest.raises(FormatError, match=r"\[chunk_hashes\] metadata lacks chunk_hashes"):
        fold.loads(forge.with_index(data, forge.dump(forge.rehash(index))))


# -- truncation, extents, limits, JSON ----------------------------------------------------------

def test_truncation_at_every_offset_and_trailing_bytes():
    data = fold.dumps(state(), ecc="rs(16)", segment=700)
    for n in range(len(data)):
        with pytest.raises(FormatError, match=r"\[truncated\]"):
            fold.loads(data[:n])
    with pytest.raises(TruncatedError, match=r"\[truncated\] file shorter than the FOLD"):
        fold.loads(data[:10])
    with pytest.raises(FormatError, match="after the index"):
        fold.loads(data + b"\0")


def test_truncated_file_on_disk(tmp_path):
    data = fold.dumps(state())
    path = tmp_path / "cut.fold"
    for n in (0, 5, 28, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:n])
        with pytest.raises(FormatError, match=r"\[truncated\]") as err:
            fold.load(path)
        assert err.value.path == str(path)
        assert not fold.verify(path).ok


def _patch_entry(data: bytes, **fields) -> bytes:
    index = forge.index_of(data)
    index["chunks"][0].update(fields)
    return forge.with_index(data, forge.dump(index))


@pytest.mark.parametrize("fields,error", [
    ({"offset": 0}, FormatError),
    ({"offset": 10**15}, FormatError),
    ({"offset": 29}, FormatError),
    ({"comp_len": 2**40}, LimitError),
    ({"uncomp_len": 2**60}, LimitError),
    ({"ecc_len": 2**31 + 1}, LimitError),
    ({"comp_len": -1}, FormatError),
    ({"flags": 7}, UnsupportedVersionError),
    ({"ecc_algo": "rs(255)"}, UnsupportedVersionError),
    ({"ecc_algo": "ldpc"}, UnsupportedVersionError),
    ({"header_len": 31}, FormatError),
    ({"ctype": "TOOLONG"}, FormatError),
    ({"sha256": "ABC"}, FormatError),
    ({"crc32c": True}, FormatError),
])
def test_bad_entries_are_typed_errors(fields, error):
    data = fold.dumps({"a": np.zeros(100), "b": np.ones(100)})
    with pytest.raises(error, match=r"\[(grammar|limit|version)\]"):
        fold.loads(_patch_entry(data, **fields))


def test_overlapping_and_swapped_extents():
    data = fold.dumps({"a": np.zeros(100), "b": np.ones(100)}, compression="none")
    index = forge.index_of(data)
    index["chunks"][1]["offset"] = index["chunks"][0]["offset"] + 8
    with pytest.raises(FormatError, match="overlaps|hole|runs into"):
        fold.loads(forge.with_index(data, forge.dump(index)))
    index = forge.index_of(data)
    a, b = index["chunks"]
    a["offset"], b["offset"] = b["offset"], a["offset"]     # headers no longer agree
    with pytest.raises(FormatError, match=r"\[chunk_header\] chunk 0: chunk header of") as err:
        fold.loads(forge.with_index(data, forge.dump(index)))
    assert err.value.check == "chunk_header"


def test_terabyte_declarations_fail_fast():
    header = struct.pack(">8sIQQ", forge.MAGIC, 28, 28, 2**42)
    with pytest.raises(LimitError, match=r"\[limit\] index too large"):
        fold.loads(header + b"{}")
    with pytest.raises(TruncatedError, match=r"\[truncated\] index extends past the end"):
        fold.loads(struct.pack(">8sIQQ", forge.MAGIC, 28, 2**50, 100))
    with pytest.raises(FormatError, match=r"\[grammar\] index_off points into the header"):
        fold.loads(struct.pack(">8sIQQ", forge.MAGIC, 28, 3, 0))
    with pytest.raises(FormatError, match=r"\[grammar\] bad header_len"):
        fold.loads(struct.pack(">8sIQQ", forge.MAGIC, 29, 28, 0))


def test_zstd_bombs_are_bounded():
    bomb = zstandard.ZstdCompressor().compress(bytes(1 << 24))       # 16 MiB of zeros
    meta = {"snapops": {"layout": "ndarray/1", "meta": {},
                        "arrays": [{"name": "z", "dtype": "|u1", "shape": [1000],
                                    "chunks": ["z"]}]}}
    data = forge.build([forge.chunk("z", "NDAR", bomb, flags=1, uncomp_len=1000)], meta)
    with pytest.raises(FormatError, match="decompressed size"):
        fold.loads(data)
    # a declared size no zstd frame of that length can reach
    meta["snapops"]["arrays"][0]["shape"] = [len(bomb) * 40000]
    data = forge.build([forge.chunk("z", "NDAR", bomb, flags=1,
                                    uncomp_len=len(bomb) * 40000)], meta)
    with pytest.raises(LimitError, match="bomb"):
        fold.loads(data)
    # a short frame
    meta["snapops"]["arrays"][0]["shape"] = [(1 << 24) + 1]
    data = forge.build([forge.chunk("z", "NDAR", bomb, flags=1, uncomp_len=(1 << 24) + 1)],
                       meta)
    with pytest.raises(FormatError, match="decompressed size"):
        fold.loads(data)


def test_write_limits():
    with pytest.raises(DataError, match="MAX_INDEX_SIZE"):
        fold.dumps(state(), limits=fold.Limits(max_index=200))
    with pytest.raises(DataError, match="segment"):
        fold.dumps(state(), segment=2000, limits=fold.Limits(max_chunk=1000))
    with pytest.raises(LimitError, match=r"\[limit\] chunk 0: chunk uncomp_len too"):
        fold.loads(fold.dumps(state()), limits=fold.Limits(max_chunk=100))
    with pytest.raises(DataError, match=r"ecc must be none, low, med"):
        fold.dumps(state(), ecc="rs(300)")
    with pytest.raises(DataError, match=r"compression must be 'zstd' or 'none'"):
        fold.dumps(state(), compression="lz4")


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"\xff\xfe", b"[]", b"[" * 100000 + b"]" * 100000,
    b'{"format":"fold","format":"fold"}', b'{"format":"fold","version":"9.0.0",'
    b'"metadata":{},"chunks":[]}', b'{"format":"fold","version":"1.2.0","metadata":[],'
    b'"chunks":[]}', b'{"format":"fold","version":"1.2.0","metadata":{},"chunks":{}}',
    b'{"format":"fold","version":"1.2.0","metadata":{},"chunks":[1]}',
    b'{"format":"fold","version":"1.2.0","metadata":{},"chunks":[],"x":' + b"9" * 5000 + b"}",
])
def test_malformed_index_json(raw):
    data = fold.dumps({})
    with pytest.raises(FormatError, match=r"\[(grammar|version)\]"):
        fold.loads(forge.with_index(data, raw))


@pytest.mark.parametrize("patch", [
    lambda m: m["snapops"].update(layout="ndarray/9"),
    lambda m: m["snapops"]["arrays"][0].update(dtype="O"),
    lambda m: m["snapops"]["arrays"][0].update(dtype=">f8"),
    lambda m: m["snapops"]["arrays"][0].update(dtype="<f8,<i4"),
    lambda m: m["snapops"]["arrays"][0].update(dtype="float64"),
    lambda m: m["snapops"]["arrays"][0].update(dtype="nosuchtype"),
    lambda m: m["snapops"]["arrays"][0].update(shape=[2**61, 4]),
    lambda m: m["snapops"]["arrays"][0].update(shape=[3]),
    lambda m: m["snapops"]["arrays"][0].update(shape=[1] * 65),
    lambda m: m["snapops"]["arrays"][0].update(chunks=["nope"]),
    lambda m: m["snapops"]["arrays"][0].update(chunks=[]),
    lambda m: m["snapops"]["arrays"].append(dict(m["snapops"]["arrays"][0])),
    lambda m: m["snapops"]["arrays"].pop(),
    lambda m: m["snapops"].update(meta={"x": [1]}),
    lambda m: m.pop("snapops"),
])
def test_bad_array_table(patch):
    data = fold.dumps({"w": np.zeros(4)})
    index = forge.index_of(data)
    patch(index["metadata"])
    with pytest.raises(FormatError, match=r"\[(grammar|limit|version)\]"):
        fold.loads(forge.with_index(data, forge.dump(forge.rehash(index))))


# -- peer chunk kinds, .mind, lazy --------------------------------------------------------------

def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def test_npz0_chunks_load_without_pickle():
    good = forge.build([forge.chunk("nuclear_arrays", "NPZ0", _npz(N=np.arange(3.0))),
                        forge.chunk("llm_manifest", "JSON", b'{"a":1}')])
    snap = fold.loads(good)
    assert list(snap.arrays) == ["nuclear_arrays/N"]
    assert np.array_equal(snap["nuclear_arrays/N"], np.arange(3.0))
    with pytest.raises(FormatError, match="pickle"):
        fold.loads(forge.build([forge.chunk("n", "NPZ0",
                                            _npz(o=np.array([{}, 1], dtype=object)))]))
    # a member whose header declares a terabyte array
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        header = np.lib.format.header_data_from_array_1_0(np.zeros(1))
        header["shape"] = (2**37,)
        member = io.BytesIO()
        np.lib.format.write_array_header_1_0(member, header)
        z.writestr("x.npy", member.getvalue() + bytes(8))
    with pytest.raises(FormatError, match="npy data size"):
        fold.loads(forge.build([forge.chunk("n", "NPZ0", buf.getvalue())]))
    with pytest.raises(FormatError, match=r"\[npz\] chunk 0: chunk 'n' is"):
        fold.loads(forge.build([forge.chunk("n", "NPZ0", b"PK\x03\x04junk")]))


def test_tsav_without_torch_is_a_clear_error(monkeypatch):
    data = forge.build([forge.chunk("torch_state", "TSAV", b"PK not really")])
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(UnsupportedVersionError, match="needs torch"):
        fold.loads(data)
    assert fold.loads(forge.build([forge.chunk("j", "JSON", b"{}")])).arrays == {}


def test_verify_checks_json_chunks(tmp_path):
    path = tmp_path / "j.fold"
    path.write_bytes(forge.build([forge.chunk("telemetry", "JSON", b"{nope")]))
    report = fold.verify(path)
    assert not report.ok and "JSON" in str(report.failure)


def test_mind_detection_and_registry(tmp_path):
    mind, plain = tmp_path / "g.mind", tmp_path / "g.fold"
    fold.save({"ai_graph": np.eye(2), "w": np.ones(2)}, mind)
    fold.save({"w": np.ones(2)}, plain)
    assert fold.inspect(mind)["kind"] == "mind" and fold.inspect(plain)["kind"] == "fold"
    assert fold.verify(mind).details["kind"] == "mind"
    odd = tmp_path / "odd.mind"
    fold.save({"w": np.ones(2)}, odd)
    assert any(".mind" in n for n in fold.verify(odd).notes)
    for p in (mind, plain):
        assert registry.detect(p).name == "fold"
    assert registry.handler_for_suffix("x.mind").name == "fold"
    assert fold.inspect(mind)["arrays"][0] == {"name": "ai_graph", "dtype": "f64", "bytes": 32,
                                               "shape": [2, 2], "chunks": ["ai_graph"]}


def test_open_lazy_reads_only_what_it_needs(tmp_path):
    data = fold.dumps({"good": np.arange(10.0), "bad": np.arange(10.0)}, compression="none")
    start, _, _ = _payload_offsets(data, "bad")
    path = tmp_path / "l.fold"
    path.write_bytes(_flip(data, [start]))
    with fold.FoldFile.open(path) as f:
        assert f.names == ["bad", "good"] and "good" in f and len(f) == 2
        assert np.array_equal(f["good"], np.arange(10.0))
        with pytest.raises(ChecksumError, match=r"\[crc32c\] chunk 0: chunk 'bad' CRC32C"):
            f["bad"]
        with pytest.raises(FormatError, match=r"\[grammar\] array missing: no such array"):
            f["missing"]
    with pytest.raises(ChecksumError, match=r"\[crc32c\] chunk 0: chunk 'bad' CRC32C"):
        fold.load(path)


# -- property: any bytes -> Snapshot or FormatError ---------------------------------------------

SEED_FILES = [
    fold.dumps(state(1), ecc="rs(8)", segment=300),
    fold.dumps({"x": np.arange(6, dtype=np.int16)}, compression="none"),
    forge.build([forge.chunk("nuclear_arrays", "NPZ0", _npz(N=np.arange(3.0))),
                 forge.chunk("m", "JSON", b'{"a":[1,2]}')]),
]


@st.composite
def mutated(draw):
    """Raw byte damage: flips keep the length (so they reach the chunks), cuts and inserts."""
    data = bytearray(draw(st.sampled_from(SEED_FILES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "set", "cut", "insert"]))
        pos = draw(st.integers(0, len(data) - 1)) if data else 0
        if kind == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


JSONISH = st.one_of(st.none(), st.booleans(), st.integers(-2, 2**64 + 1),
                    st.sampled_from([2**31, 2**42, 28, 32, 255]), st.floats(allow_nan=False),
                    st.text(max_size=8), st.sampled_from(["NDAR", "TSAV", "NPZ0", "rs(16)",
                                                          "none", "<f8", "|u1", "x"]),
                    st.lists(st.integers(-1, 5), max_size=3), st.builds(dict))


def _slots(node, out):
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        out.append((node, key))
        if isinstance(value, (dict, list)):
            _slots(value, out)
    return out


@st.composite
def forged_index(draw):
    """A seed file whose index has one value replaced or removed, re-hashed or not."""
    data = draw(st.sampled_from(SEED_FILES))
    index = forge.index_of(data)
    for _ in range(draw(st.integers(1, 3))):
        node, key = draw(st.sampled_from(_slots(index, [])))
        if isinstance(node, dict) and draw(st.booleans()) and draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(JSONISH)
    if draw(st.booleans()):
        try:
            forge.rehash(index)
        except (KeyError, TypeError, AttributeError):
            pass
    return forge.with_index(data, forge.dump(index))


@st.composite
def forged_payload(draw):
    """A well-hashed file whose chunk payload (or declared size) is hostile."""
    data = draw(st.sampled_from(SEED_FILES))
    index = forge.index_of(data)
    chunks = []
    for e in index["chunks"]:
        at = e["offset"] + 32
        chunks.append(forge.chunk(e["name"], e["ctype"], data[at:at + e["comp_len"]],
                                  flags=e["flags"], uncomp_len=e["uncomp_len"],
                                  ecc_algo=e["ecc_algo"],
                                  ecc=data[at + e["comp_len"]:at + e["comp_len"] + e["ecc_len"]]))
    victim = chunks[draw(st.integers(0, len(chunks) - 1))]
    raw = draw(st.binary(max_size=300))
    victim["comp"] = draw(st.sampled_from([
        raw, zstandard.ZstdCompressor().compress(raw), victim["comp"][:len(raw)]]))
    victim["flags"] = draw(st.sampled_from([0, 1, victim["flags"]]))
    victim["uncomp_len"] = draw(st.sampled_from([len(victim["comp"]), len(raw),
                                                 victim["uncomp_len"], 2**20]))
    victim["ecc_algo"], victim["ecc"] = "none", b""
    meta = {k: v for k, v in index["metadata"].items()
            if k not in ("chunk_hashes", "manifest_hash")}
    return forge.build(chunks, meta)


@settings(max_examples=300, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(mutated(), forged_index(), forged_payload(), st.binary(max_size=100),
                      st.binary(max_size=100).map(lambda b: forge.MAGIC + b)))
def test_any_bytes_give_a_snapshot_or_a_format_error(data):
    try:
        snap = fold.loads(data)
    except FormatError:
        return
    assert isinstance(snap, Snapshot)


def test_report_serialises(tmp_path):
    path = tmp_path / "r.fold"
    fold.save(state(), path, ecc="low")
    assert json.loads(json.dumps(fold.verify(path).to_dict()))["ok"]
    assert json.dumps(fold.inspect(path))
    assert os.path.getsize(path) == fold.inspect(path)["file_size"]


@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(mutated(), forged_index(), forged_payload()))
def test_verify_never_raises(data):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "f.fold")
        with open(path, "wb") as f:
            f.write(data)
        report = fold.verify(path)
        assert report.ok or isinstance(report.failure, FormatError)


def test_flusher_starts_writeback_and_stops(tmp_path):
    from snapops.formats.fold._write import Flusher

    with open(tmp_path / "f", "wb") as f:
        flusher = Flusher(f.fileno(), every=10)
        f.write(b"x" * 100)
        flusher.wrote(100)
        flusher.close()
        assert flusher._thread is None and flusher.error is None
    flusher = Flusher(None)
    flusher.wrote(1 << 40)
    flusher.close()
