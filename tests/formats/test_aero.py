"""AERO v0.1: round trips, layout, zero-copy reads, b3sum cross-checks, tampering, hostile input."""

from __future__ import annotations

import json
import mmap
import shutil
import struct
import subprocess
import tempfile
import tracemalloc
from pathlib import Path

import ml_dtypes
import msgpack
import numpy as np
import pytest
import zstandard
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from snapops.formats import aero, registry
from snapops.formats.aero import _spec
from snapops.formats.errors import (ChecksumError, DataError, FormatError, LimitError,
                                    TruncatedError, UnsupportedVersionError)
from snapops.formats.model import Snapshot
from tests.conftest import sample_state
from tests.formats import aero_build as B


def every_dtype_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {
        "f16": rng.standard_normal((3, 5)).astype(np.float16),
        "f32": rng.standard_normal(7).astype(np.float32),
        "bf16": rng.standard_normal((4, 4)).astype(ml_dtypes.bfloat16),
        "f64": np.array(3.5),                                   # 0-d
        "i8": np.arange(-5, 5, dtype=np.int8),
        "u8": np.arange(10, dtype=np.uint8).reshape(2, 5),
        "i16": np.arange(6, dtype=np.int16).reshape(2, 3),
        "u16": np.array([0, 1, 65535], np.uint16),
        "i32": np.array([-(2**31), 0, 2**31 - 1], np.int32),
        "u32": np.array([0, 2**32 - 1], np.uint32),
        "i64": np.array(-7, np.int64),                          # 0-d
        "u64": np.array([2**64 - 1], np.uint64),
        "bool": np.array([[True, False], [False, True]]),
        "empty": np.zeros((0, 4), np.float32),
        "empty_bf16": np.zeros((3, 0), ml_dtypes.bfloat16),
        "nan": np.array([np.nan, -0.0, np.inf], np.float32),
    }
    out["nan"].view(np.uint32)[0] = 0x7FC00001                 # a NaN payload must survive
    return out


def write(tmp_path: Path, state=None, name="m.aero", **opts) -> Path:
    path = tmp_path / name
    aero.save(Snapshot(every_dtype_state() if state is None else state, {"gen": 3}), path,
              **opts)
    return path


def toc(path: Path) -> list[dict]:
    """TOC entries parsed independently with struct."""
    data = path.read_bytes()
    count = struct.unpack_from("<I", data, 96)[0]
    st_off, st_len = struct.unpack_from("<QQ", data, 28)
    out = []
    for i in range(count):
        fourcc, flags, off, length, ulen, noff, nlen, res, digest = struct.unpack_from(
            B.TOC_ENTRY, data, 112 + 80 * i)
        name = data[st_off + noff:st_off + noff + nlen].decode()
        out.append(dict(i=i, fourcc=fourcc, flags=flags, offset=off, length=length, ulen=ulen,
                        name=name, blake3=digest, at=112 + 80 * i, name_end=st_off + noff + nlen))
    return out


def content(path: Path, e: dict) -> bytes:
    raw = path.read_bytes()[e["offset"]:e["offset"] + e["length"]]
    return zstandard.ZstdDecompressor().decompress(raw) if e["flags"] & 1 else raw


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


# ---- round trips ----------------------------------------------------------------------------

@pytest.mark.parametrize("opts", [{}, {"page_hashes": True, "page_size": 64},
                                  {"control_integrity": False, "shard_max": 40}])
def test_round_trip_every_dtype(tmp_path, opts):
    state = every_dtype_state()
    path = write(tmp_path, state, **opts)
    back = aero.load(path)
    assert Snapshot(state).equal(back)
    assert back.meta == {"gen": 3}
    assert list(back.arrays) == sorted(state)                  # canonical byte order
    assert back["bf16"].dtype == ml_dtypes.bfloat16 and back["f64"].shape == ()
    assert aero.verify(path).ok


def test_every_enum_value_written(tmp_path):
    codes = {t["dtype"] for t in aero.inspect(write(tmp_path))["arrays"]}
    assert codes == {name for name in _spec.DTYPE_NAMES.values() if name != "packed"}


def test_packed_tensor_round_trips_through_meta(tmp_path):
    packed = {"q": {"shape": [4, 8], "quant_id": 0, "quant_params": {"ggml_type": 2}}}
    snap = Snapshot({"q": np.arange(18, dtype=np.uint8), "w": np.ones(2, np.float32)},
                    {_spec.PACKED_META_KEY: json.dumps(packed)})
    path = tmp_path / "p.aero"
    aero.save(snap, path)
    entry = next(t for t in aero.inspect(path)["arrays"] if t["name"] == "q")
    assert entry["dtype"] == "u8" and entry["packed"]["shape"] == [4, 8]
    assert entry["data_len"] == 18
    back = aero.load(path)
    assert snap.equal(back)
    assert json.loads(back.meta[_spec.PACKED_META_KEY]) == packed
    assert aero.verify(path).ok


def test_big_endian_and_strided_inputs(tmp_path):
    a = np.arange(12, dtype=">i4").reshape(3, 4)
    b = np.arange(24, dtype=np.float64).reshape(4, 6)[::2, ::3]
    back = aero.load(write(tmp_path, {"a": a, "b": b}))
    assert back["a"].dtype == np.dtype("<i4") and np.array_equal(back["a"], a)
    assert np.array_equal(back["b"], b)


@pytest.mark.parametrize("array", [np.zeros(2, np.complex128), np.zeros(2, "datetime64[s]"),
                                   np.zeros(2, [("a", "<i4")]), np.zeros(1, np.float16)[:0]
                                   .astype("V2")])
def test_unsupported_dtypes_are_refused(tmp_path, array):
    with pytest.raises(DataError, match="dtype"):
        aero.save({"x": array}, tmp_path / "x.aero")
    assert not (tmp_path / "x.aero").exists()
    assert not list(tmp_path.iterdir())                        # atomic: no temp file left


def test_empty_snapshot(tmp_path):
    path = write(tmp_path, {})
    assert len(aero.load(path)) == 0
    assert aero.verify(path).ok


# ---- layout ---------------------------------------------------------------------------------

def test_layout_follows_spec(tmp_path):
    path = write(tmp_path, page_hashes=True, shard_max=64)
    data = path.read_bytes()
    (magic, major, minor, hsize, toc_off, toc_len, st_off, st_len, fflags, _uuid,
     reserved) = struct.unpack_from(B.HEADER, data, 0)
    assert (magic, major, minor, hsize, toc_off, fflags) == (b"AERO", 0, 1, 96, 96, 0)
    assert reserved == bytes(28)
    entries = toc(path)
    assert toc_len == 16 + 80 * len(entries)
    assert st_off == B.align(96 + toc_len, 8) and st_len % 8 == 0
    start = B.align(st_off + st_len, 16)
    assert entries[0]["fourcc"] == b"IHSH" and entries[0]["name"] == "control.integrity"
    assert entries[0]["flags"] == 8 and entries[0]["length"] == 256
    for e in entries:
        assert e["offset"] % 16 == 0 and e["offset"] >= start
        assert data[e["name_end"]] == 0                            # NUL-terminated names
    by = {e["name"]: e for e in entries}
    assert by["meta.json"]["fourcc"] == b"MJSN" and by["meta.json"]["flags"] == 0
    assert by["manifest"]["fourcc"] == b"MMSG" and by["manifest"]["flags"] == 1
    assert by["tensors"]["fourcc"] == b"TIDX" and by["tensors"]["flags"] == 1 | 4
    shards = [e for e in entries if e["fourcc"] == b"WTSH"]
    assert len(shards) > 1
    for s in shards:
        assert s["flags"] == 2 and s["length"] == s["ulen"]
        phsh = entries[s["i"] + 1]
        assert (phsh["fourcc"], phsh["name"], phsh["flags"]) == (b"PHSH", s["name"] + ".phsh", 8)
    meta = json.loads(content(path, by["meta.json"]))
    assert content(path, by["meta.json"]) == json.dumps(meta, sort_keys=True,
                                                        separators=(",", ":")).encode()
    manifest = msgpack.unpackb(content(path, by["manifest"]))
    assert manifest["format"] == {"name": "AERO", "version": [0, 1]}
    assert [c["toc_index"] for c in manifest["chunks"]] == list(range(len(entries)))
    tensors = msgpack.unpackb(content(path, by["tensors"]))["tensors"]
    assert all(len(t["hash_b3"]) == 64 for t in tensors)
    assert {t["shard_id"] for t in tensors} == set(range(len(shards)))
    assert len(data) == max(e["offset"] + e["length"] for e in entries)   # no trailing bytes


def test_multi_shard(tmp_path):
    state = {f"t{i}": np.full(100, i, np.float32) for i in range(6)}   # 400 B each
    state["huge"] = np.zeros(1000, np.float32)                          # > shard_max
    path = write(tmp_path, state, shard_max=1000)
    info = aero.inspect(path)
    shards = [c for c in info["chunks"] if c["fourcc"] == "WTSH"]
    assert len(shards) == 4
    assert all(c["length"] <= 1000 or c["length"] == 4000 for c in shards)
    assert [s["shard_id"] for s in info["manifest"]["shards"]] == [0, 1, 2, 3]
    for t in info["arrays"]:
        assert t["data_off"] % 64 == 0
    assert Snapshot(state).equal(aero.load(path))
    assert aero.verify(path).ok


# ---- determinism ----------------------------------------------------------------------------

def test_same_input_same_bytes(tmp_path):
    a = write(tmp_path, name="a.aero", page_hashes=True, shard_max=100)
    b = write(tmp_path, name="b.aero", page_hashes=True, shard_max=100)
    assert a.read_bytes() == b.read_bytes()


def test_uuid_options(tmp_path):
    fixed = "12345678-1234-5678-1234-567812345678"
    path = write(tmp_path, uuid=fixed)
    assert aero.inspect(path)["uuid"] == fixed.replace("-", "")
    r1 = write(tmp_path, name="r1.aero", uuid="random").read_bytes()
    r2 = write(tmp_path, name="r2.aero", uuid="random").read_bytes()
    diff = [i for i in range(len(r1)) if r1[i] != r2[i]]
    ihsh = toc(tmp_path / "r1.aero")[0]
    allowed = set(range(52, 68)) | set(range(ihsh["at"] + 48, ihsh["at"] + 80)) | set(
        range(ihsh["offset"], ihsh["offset"] + 256))
    assert diff and set(diff) <= allowed     # only the uuid and what hashes it differ
    with pytest.raises(DataError, match=r"uuid: badly formed hexadecimal UUID string"):
        write(tmp_path, name="bad.aero", uuid="nope")


# ---- zero copy ------------------------------------------------------------------------------

def test_open_lazy_gives_views_on_the_mmap(tmp_path):
    path = write(tmp_path)
    with aero.open_lazy(path) as f:
        assert f.names == sorted(every_dtype_state())
        whole = np.frombuffer(f.raw._mm, np.uint8)
        for name in ("f32", "bf16", "u64", "bool"):
            array = f[name]
            assert np.shares_memory(array, whole)
            assert isinstance(owner(array), mmap.mmap)
            assert not array.flags.writeable
        del whole, array
    loaded = aero.load(path)
    assert isinstance(owner(loaded["f32"]), mmap.mmap)


def owner(array):
    """The object at the end of an array's base chain (memoryviews followed to their .obj)."""
    base = array
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.obj if isinstance(base, memoryview) else base.base
    return base


def test_reading_one_tensor_does_not_touch_others(tmp_path):
    state = {"a": np.arange(64, dtype=np.float32), "b": np.arange(64, dtype=np.float32) * 2}
    path = write(tmp_path, state)
    t = {x["name"]: x for x in aero.inspect(path)["arrays"]}["b"]
    shard = next(e for e in toc(path) if e["fourcc"] == b"WTSH")
    flip(path, shard["offset"] + t["data_off"] + 5, 0xFF)      # corrupt b only
    with aero.open_lazy(path) as f:
        assert np.array_equal(f["a"], state["a"])               # a still reads, no hash of b
    report = aero.verify(path)
    assert not report.ok and report.failure.check == "chunk_blake3"


# ---- BLAKE3 checked with the real b3sum -----------------------------------------------------

def b3sum(blobs: list[bytes]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, blob in enumerate(blobs):
            p = Path(tmp) / f"{i}.bin"
            p.write_bytes(blob)
            files.append(str(p))
        out = subprocess.run(["b3sum", "--no-names", *files], check=True, capture_output=True,
                             text=True).stdout.split()
    return out


@pytest.mark.skipif(shutil.which("b3sum") is None, reason="b3sum not installed")
def test_every_digest_matches_b3sum(tmp_path):
    state = sample_state() | every_dtype_state()
    path = write(tmp_path, state, page_hashes=True, page_size=4096, shard_max=20000)
    data = path.read_bytes()
    entries = toc(path)
    blobs, want = [], []
    for e in entries:                                           # chunks: uncompressed bytes
        blobs.append(content(path, e))
        want.append(e["blake3"].hex())
    by = {e["name"]: e for e in entries}
    for t in msgpack.unpackb(content(path, by["tensors"]))["tensors"]:
        shard = by[f"weights.shard{t['shard_id']}"]
        lo = shard["offset"] + t["data_off"]
        blobs.append(data[lo:lo + t["data_len"]])
        want.append(t["hash_b3"])
    for e in entries:                                           # PHSH pages
        if e["fourcc"] == b"PHSH":
            rec = msgpack.unpackb(content(path, e))
            shard = by[rec["shard_name"]]
            for p, digest in enumerate(rec["digests"]):
                lo = shard["offset"] + p * rec["page_size"]
                blobs.append(data[lo:min(lo + rec["page_size"], shard["offset"] + shard["length"])])
                want.append(digest.hex())
    ihsh = msgpack.Unpacker()
    ihsh.feed(content(path, entries[0]))
    rec = ihsh.unpack()
    start = rec["covered_ranges"][0][1]
    region = bytearray(data[:start])
    for e in entries:
        region[e["at"] + 48:e["at"] + 80] = bytes(32)
    blobs.append(bytes(region))
    want.append(rec["digest"].hex())
    assert b3sum(blobs) == want


# ---- verify levels and tampering ------------------------------------------------------------

def tamper_targets(path: Path) -> dict[str, int]:
    entries = toc(path)
    by = {e["fourcc"]: e for e in entries}
    return {
        "header_uuid": 60,
        "toc_offset_field": by[b"WTSH"]["at"] + 8 + 1,
        "toc_flags_field": by[b"MJSN"]["at"] + 4,
        "string_table": by[b"MJSN"]["name_end"] - 1,
        "wtsh_payload": by[b"WTSH"]["offset"] + 3,
        "wtsh_toc_hash": by[b"WTSH"]["at"] + 50,
        "tidx_payload": by[b"TIDX"]["offset"] + by[b"TIDX"]["length"] // 2,
        "mmsg_payload": by[b"MMSG"]["offset"] + by[b"MMSG"]["length"] // 2,
        "mjsn_payload": by[b"MJSN"]["offset"] + 2,
        "ihsh_payload": by[b"IHSH"]["offset"] + 20,
        "phsh_payload": by[b"PHSH"]["offset"] + by[b"PHSH"]["length"] - 3,
        "padding": by[b"WTSH"]["offset"] + by[b"WTSH"]["length"] + 1,
    }


EXPECTED_CHECK = {
    "header_uuid": "ihsh", "toc_offset_field": "extents", "toc_flags_field": "ihsh",
    "string_table": "ihsh",
    "wtsh_payload": "chunk_blake3", "wtsh_toc_hash": "chunk_blake3",
    "tidx_payload": "chunk_blake3", "mmsg_payload": "chunk_blake3",
    "mjsn_payload": "chunk_blake3", "ihsh_payload": "ihsh", "phsh_payload": "chunk_blake3",
    "padding": "padding",
}


@pytest.mark.parametrize("target", sorted(EXPECTED_CHECK))
def test_tampering_is_named(tmp_path, target):
    path = write(tmp_path, {"w": np.arange(10, dtype=np.float32), "v": np.ones(3, np.int16)},
                 page_hashes=True)
    assert aero.verify(path).ok
    flip(path, tamper_targets(path)[target])
    report = aero.verify(path)
    assert not report.ok
    assert report.failure.check == EXPECTED_CHECK[target], report.failure
    assert report.failure.path == str(path)


def test_control_level_ignores_payloads_full_does_not(tmp_path):
    path = write(tmp_path, {"w": np.arange(10, dtype=np.float32)})
    flip(path, tamper_targets_no_phsh(path))
    assert aero.verify(path, level="control").ok
    assert aero.verify(path, level="full").failure.check == "chunk_blake3"


def tamper_targets_no_phsh(path: Path) -> int:
    return next(e for e in toc(path) if e["fourcc"] == b"WTSH")["offset"]


def rewrite_with_fixed_hashes(path: Path, mutate) -> None:
    """Change payload bytes, then fix the WTSH TOC hash and the IHSH so only deeper checks fail."""
    data = bytearray(path.read_bytes())
    entries = toc(path)
    mutate(data, entries)
    for e in entries:
        if e["fourcc"] == b"WTSH":
            digest = blake3(bytes(data[e["offset"]:e["offset"] + e["length"]])).digest()
            data[e["at"] + 48:e["at"] + 80] = digest
    start = B.align(struct.unpack_from("<Q", data, 28)[0] + struct.unpack_from("<Q", data, 36)[0],
                    16)
    region = bytearray(data[:start])
    for e in entries:
        region[e["at"] + 48:e["at"] + 80] = bytes(32)
    ihsh = entries[0]
    payload = msgpack.packb({"algo": "blake3-256", "covered_ranges": [[0, start]],
                             "digest": blake3(bytes(region)).digest()}).ljust(256, b"\0")
    data[ihsh["offset"]:ihsh["offset"] + 256] = payload
    data[ihsh["at"] + 48:ihsh["at"] + 80] = blake3(payload).digest()
    path.write_bytes(bytes(data))


def test_page_hash_mismatch_is_named(tmp_path):
    path = write(tmp_path, {"w": np.arange(100, dtype=np.float32)}, page_hashes=True,
                 page_size=64)

    def mutate(data, entries):
        shard = next(e for e in entries if e["fourcc"] == b"WTSH")
        data[shard["offset"] + 70] ^= 1

    rewrite_with_fixed_hashes(path, mutate)
    assert aero.verify(path).failure.check == "phsh"


def test_tensor_hash_mismatch_is_named(tmp_path):
    path = write(tmp_path, {"w": np.arange(100, dtype=np.float32)})

    def mutate(data, entries):
        shard = next(e for e in entries if e["fourcc"] == b"WTSH")
        data[shard["offset"] + 7] ^= 1

    rewrite_with_fixed_hashes(path, mutate)
    report = aero.verify(path)
    assert report.failure.check == "tensor_blake3" and report.failure.array == "w"


# ---- truncation and hostile input -----------------------------------------------------------

def test_truncation_at_every_offset(tmp_path):
    path = write(tmp_path, {"w": np.arange(10, dtype=np.float32), "e": np.zeros(0, np.int8)},
                 page_hashes=True)
    data = path.read_bytes()
    cut = tmp_path / "cut.aero"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        with pytest.raises(FormatError, match=r"\[(grammar|truncated)\]"):
            aero.load(cut)
        if n % 97 == 0:
            report = aero.verify(cut)
            assert not report.ok and isinstance(report.failure, FormatError)


def load_bytes(tmp_path: Path, blob: bytes):
    p = tmp_path / "h.aero"
    p.write_bytes(blob)
    return aero.load(p)


def test_independent_builder_round_trip(tmp_path):
    w = np.arange(2, dtype=np.float32)
    digest = blake3(w.tobytes()).hexdigest()
    blob = B.build([B.wtsh(w.tobytes()), B.tidx([B.entry(hash_b3=digest)])])
    assert np.array_equal(load_bytes(tmp_path, blob)["w"], w)
    (tmp_path / "ok.aero").write_bytes(blob)
    assert aero.verify(tmp_path / "ok.aero").ok


def _patched(blob: bytes, at: int, new: bytes) -> bytes:
    return blob[:at] + new + blob[at + len(new):]


def _overlapping() -> bytes:
    blob = B.build([B.wtsh(bytes(64)), B.Raw(b"MJSN", "meta.json", b"{}")])
    first = struct.unpack_from("<Q", blob, 112 + 8)[0]
    return _patched(blob, 112 + 80 + 8, struct.pack("<Q", first + 16))


def _unaligned() -> bytes:
    blob = B.build([B.Raw(b"MJSN", "meta.json", b"{}")])
    off = struct.unpack_from("<Q", blob, 112 + 8)[0]
    return _patched(blob, 112 + 8, struct.pack("<Q", off + 1))


def _entry_count(n: int) -> bytes:
    return _patched(B.build([]), 96, struct.pack("<I", n))


def _string_table(n: int) -> bytes:
    return _patched(B.build([]), 36, struct.pack("<Q", n))


HOSTILE = {
    "bad magic": (lambda: b"AERX" + bytes(200), FormatError),
    "short header": (lambda: b"AERO" + bytes(50), TruncatedError),
    "version": (lambda: B.build([], version=(0, 2)), UnsupportedVersionError),
    "file flags": (lambda: B.build([], file_flags=1), UnsupportedVersionError),
    "terabyte chunk": (lambda: B.build([B.Raw(b"WTSH", "weights.shard0", b"", length=1 << 40,
                                              ulen=1 << 40)]), TruncatedError),
    "terabyte metadata": (lambda: B.build([B.Raw(b"TIDX", "tensors", b"x", compress=True,
                                                 ulen=1 << 40)]), LimitError),
    "overlap": (_overlapping, FormatError),
    "compressed wtsh": (lambda: B.build([B.Raw(b"WTSH", "weights.shard0", bytes(8),
                                               compress=True)]), FormatError),
    "unaligned chunk": (_unaligned, FormatError),
    "bad tidx msgpack": (lambda: B.build([B.Raw(b"TIDX", "tensors", b"\xc1", compress=True)]),
                         FormatError),
    "tidx trailing": (lambda: B.build([B.Raw(b"TIDX", "tensors", msgpack.packb({"tensors": []})
                                             + b"\x00", compress=True)]), FormatError),
    "tidx ext type": (lambda: B.build([B.Raw(b"TIDX", "tensors", msgpack.packb(
        {"tensors": [msgpack.ExtType(5, b"x")]}), compress=True)]), FormatError),
    "tidx not a map": (lambda: B.build([B.Raw(b"TIDX", "tensors", msgpack.packb([1, 2]),
                                               compress=True)]), FormatError),
    "tidx bool dtype": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(dtype=True)])]),
                        FormatError),
    "tidx unknown dtype": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(dtype=13)])]),
                           FormatError),
    "tidx shape mismatch": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(shape=(3,))])]),
                            FormatError),
    "tidx huge shape": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(
        shape=(2**62, 2**62), data_len=8)])]), FormatError),
    "tidx too many dims": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(
        shape=(1,) * 65 + (2,))])]), LimitError),
    "tidx past shard": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(data_off=4)])]),
                        FormatError),
    "tidx missing shard": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(shard_id=3)])]),
                           FormatError),
    "tidx overlap": (lambda: B.build([B.wtsh(bytes(16)), B.tidx([
        B.entry(), B.entry(name="v", data_off=4)])]), FormatError),
    "tidx duplicate": (lambda: B.build([B.wtsh(bytes(16)), B.tidx([
        B.entry(), B.entry(data_off=8)])]), FormatError),
    "tidx bad hash": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(hash_b3="zz")])]),
                      FormatError),
    "tidx int hash": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(hash_b3=0)])]),
                      FormatError),
    "tidx upper hash": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(hash_b3="A" * 64)])]),
                        FormatError),
    "tidx negative off": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(data_off=-1)])]),
                          FormatError),
    "tidx float len": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([B.entry(data_len=8.0)])]),
                       FormatError),
    "tidx missing field": (lambda: B.build([B.wtsh(bytes(8)), B.tidx([{"name": "w"}])]),
                           FormatError),
    "tidx hash mismatch": (lambda: B.build([B.wtsh(bytes(8)), B.Raw(
        b"TIDX", "tensors", msgpack.packb({"tensors": []}), compress=True,
        digest=bytes(32))]), ChecksumError),
    "weights without index": (lambda: B.build([B.wtsh(bytes(8))]), FormatError),
    "mjsn not json": (lambda: B.build([B.Raw(b"MJSN", "meta.json", b"{nope"), B.tidx([])]),
                      FormatError),
    "mjsn nan": (lambda: B.build([B.Raw(b"MJSN", "meta.json", b'{"a":NaN}'), B.tidx([])]),
                 FormatError),
    "mjsn deep": (lambda: B.build([B.Raw(b"MJSN", "meta.json", b"[" * 100000), B.tidx([])]),
                  FormatError),
    "mjsn not utf8": (lambda: B.build([B.Raw(b"MJSN", "meta.json", b'"\xff"'), B.tidx([])]),
                      FormatError),
    "msgpack deep": (lambda: B.build([B.Raw(b"TIDX", "tensors", b"\x91" * 100000 + b"\x90",
                                            compress=True)]), FormatError),
    "entry count": (lambda: _entry_count(2_000_000), LimitError),
    "string table": (lambda: _string_table(1 << 30), LimitError),
    "reserved nonzero": (lambda: _patched(B.build([]), 80, b"\x01"), FormatError),
    "toc length": (lambda: _patched(B.build([]), 20, struct.pack("<Q", 17)), FormatError),
    "name past table": (lambda: _patched(B.build([B.tidx([])]), 112 + 32,
                                         struct.pack("<I", 999)), FormatError),
    "duplicate chunk": (lambda: B.build([B.tidx([]), B.tidx([])]), FormatError),
    "unknown flags": (lambda: B.build([B.Raw(b"XXXX", "x", b"a", flags=0x100)]), FormatError),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_raise_typed_errors(tmp_path, case):
    make, error = HOSTILE[case]
    with pytest.raises(error,
                       match=r"\[[a-z0-9_]+\]"):
        load_bytes(tmp_path, make())
    report = aero.verify(tmp_path / "h.aero")
    assert not report.ok and isinstance(report.failure, error)


def test_zstd_bomb_is_bounded(tmp_path):
    bomb = zstandard.ZstdCompressor(level=19, write_content_size=False).compress(bytes(256 << 20))
    assert len(bomb) < 64 << 10
    blob = B.build([B.Raw(b"TIDX", "tensors", b"")])
    entry_at = 112
    body_at = struct.unpack_from("<Q", blob, entry_at + 8)[0]
    blob = blob[:body_at] + bomb
    blob = _patched(blob, entry_at + 4, struct.pack("<IQQQ", 1 | 4, body_at, len(bomb), 1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="decompressed size"):
            load_bytes(tmp_path, blob)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_zstd_declared_size_mismatch(tmp_path):
    data = msgpack.packb({"tensors": []})
    with pytest.raises(FormatError, match="zstd frame size"):
        load_bytes(tmp_path, B.build([B.Raw(b"TIDX", "tensors", data, compress=True,
                                            ulen=len(data) + 5)]))


def test_writer_enforces_limits(tmp_path, monkeypatch):
    from snapops.formats.aero import _layout
    monkeypatch.setattr(_layout.S, "MAX_ENTRY_COUNT", 8)
    state = {f"t{i}": np.ones(4, np.float32) for i in range(10)}
    with pytest.raises(LimitError, match=r"\[limit\] too many chunks"):
        aero.save(state, tmp_path / "x.aero", shard_max=1)
    monkeypatch.setattr(_layout.S, "MAX_ENTRY_COUNT", 1_000_000)
    monkeypatch.setattr(_layout.S, "MAX_STRING_TABLE", 64)
    with pytest.raises(LimitError, match=r"\[limit\] string table too large"):
        aero.save(state, tmp_path / "x.aero", shard_max=1)
    assert not list(tmp_path.iterdir())


def valid_blob() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "v.aero"
        aero.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.int8)},
                  p, page_hashes=True, page_size=16)
        return p.read_bytes()


VALID = valid_blob()


@st.composite
def mutated(draw):
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[at:at + 8] = draw(st.binary(min_size=8, max_size=8))
        elif kind == "cut" or not data:
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@settings(max_examples=400)
@given(st.one_of(st.binary(max_size=512), st.binary(max_size=300).map(lambda b: b"AERO" + b),
                 mutated()))
def test_any_bytes_give_snapshot_or_format_error(blob):
    with tempfile.NamedTemporaryFile(suffix=".aero") as tmp:
        tmp.write(blob)
        tmp.flush()
        try:
            snap = aero.load(tmp.name)
        except FormatError:
            return
        assert isinstance(snap, Snapshot)
        for array in snap.arrays.values():
            bytes(np.ascontiguousarray(array).tobytes())           # every view really readable
        aero.verify(tmp.name)                                     # never raises


# ---- handler ---------------------------------------------------------------------------------

def test_registry_detects_aero(tmp_path):
    path = write(tmp_path)
    handler = registry.detect(path)
    assert handler.name == "aero" and handler is aero.FORMAT
    assert aero.FORMAT.sniff(path.read_bytes()[:64]) and not aero.FORMAT.sniff(b"FOLD")
    assert handler.verify(path).ok and handler.inspect(path)["format"] == "aero"


# ---- files laid out by the reference writer -------------------------------------------------

def test_reads_reference_layout(tmp_path):
    arrays = {"b": np.arange(3, dtype=np.int8), "a": np.arange(5, dtype=np.float32),
              "c": np.array([[1.5, 2.5]], np.float16)}
    path = tmp_path / "ref.aero"
    path.write_bytes(B.reference_style(arrays))
    back = aero.load(path)
    assert list(back.arrays) == ["b", "a", "c"]                  # TIDX order kept
    assert Snapshot(arrays).equal(back)
    assert back.meta == {"architecture": "mlp", "model_name": "ref"}
    report = aero.verify(path)
    assert report.ok, report.failure
    assert {"ihsh", "phsh", "chunk_blake3"} <= set(report.checks)
    assert any("hash_b3" in note for note in report.notes)       # the reference omits them


@pytest.mark.parametrize("suffix", ["\u00b2", "\u0661", "9" * 5000])
def test_a_shard_named_with_digits_int_refuses_is_a_typed_error(tmp_path, suffix):
    """``str.isdigit`` takes ``²``, ``١`` and 5,000 digits; ``int`` refused the first and the
    last with a ValueError out of opening the file."""
    w = np.arange(2, dtype=np.float32)
    digest = blake3(w.tobytes()).hexdigest()
    shard = B.Raw(b"WTSH", f"weights.shard{suffix}", w.tobytes(), flags=2)
    path = tmp_path / "s.aero"
    path.write_bytes(B.build([shard, B.tidx([B.entry(hash_b3=digest)])]))
    with pytest.raises(FormatError, match=r"name and fourcc disagree|missing shard") as refused:
        aero.load(path)
    report = aero.verify(path)
    assert not report.ok and str(report.failure) == str(refused.value)
