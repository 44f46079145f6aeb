"""PyCauset v1: layout checked with struct/zlib, round trips, zero-copy reads, the active-slot
rule, crash-consistent metadata updates cut at every byte, tampering and hostile input."""

from __future__ import annotations

import mmap
import struct
import tracemalloc
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapops.cli import main
from snapops.formats import pycauset as pc
from snapops.formats import registry
from snapops.formats.errors import (ChecksumError, DataError, FormatError, LimitError,
                                    TruncatedError, UnsupportedVersionError)
from snapops.formats.integrity import crc32c
from snapops.formats.model import Snapshot
from snapops.formats.pycauset import _codec, _spec

VECTOR = {"b": True, "a": -1, "c": 1, "d": 1.5, "e": "x", "f": b"\x00", "g": [1]}
VECTOR_HEX = ("080700000001006102ffffffffffffffff010062010101006303010000000000000001006404000000"
              "000000f83f0100650501000000780100660601000000000100670701000000030100000000000000")
PREAMBLE = "<8sIBHB"
SLOT = "<7QI68s"


def every_dtype_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {
        "f16": rng.standard_normal((3, 5)).astype(np.float16),
        "f32": rng.standard_normal(7).astype(np.float32),
        "f64": np.array(3.5),                                       # 0-d
        "bf16": rng.standard_normal((2, 3, 4)).astype(ml_dtypes.bfloat16),
        "c64": (rng.standard_normal(3) + 1j).astype(np.complex64),
        "c128": np.array([[1 - 2j]]),
        "i8": np.arange(-5, 5, dtype=np.int8),
        "u8": np.arange(10, dtype=np.uint8).reshape(2, 5),
        "i16": np.arange(6, dtype=np.int16),
        "u16": np.array([0, 65535], np.uint16),
        "i32": np.array([-(2**31), 2**31 - 1], np.int32),
        "u32": np.array([2**32 - 1], np.uint32),
        "i64": np.array(-7, np.int64),
        "u64": np.array([2**64 - 1], np.uint64),
        "bool": np.array([[True, False], [False, True]]),
        "empty": np.zeros((0, 4), np.float32),
        "nan": np.array([np.nan, -0.0, np.inf], np.float32),
    }
    out["nan"].view(np.uint32)[0] = 0x7FC00001                     # NaN payload bits survive
    return out


def write(tmp_path: Path, state=None, name="m.pycauset", meta=None, **opts) -> Path:
    path = tmp_path / name
    pc.save(Snapshot(every_dtype_state() if state is None else state,
                     {"gen": 3} if meta is None else meta), path, **opts)
    return path


def matrix_file(tmp_path: Path, name="w.pycauset") -> Path:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    return write(tmp_path, {"w": w}, name, meta={"run": "r1"})


def slots(data: bytes) -> dict[str, tuple]:
    return {n: struct.unpack_from(SLOT, data, at) for n, at in (("A", 16), ("B", 144))}


def put_slot(data: bytearray, name: str, fields: tuple, crc: int | None = None,
             reserved: bytes = bytes(68)) -> None:
    head = struct.pack("<7Q", *fields)
    struct.pack_into(SLOT, data, 16 if name == "A" else 144, *fields,
                     zlib.crc32(head) if crc is None else crc, reserved)


def frame(payload: bytes) -> bytes:
    head = struct.pack("<4sIIIQII", b"PCMB", 1, 1, 0, len(payload), zlib.crc32(payload), 0)
    return head + payload


def with_metadata(data: bytes, meta: dict) -> bytes:
    """``data`` with its metadata block replaced (CRC and both slots fixed up)."""
    a = slots(data)["A"]
    out = bytearray(data[:a[3]]) + frame(_codec.encode_metadata(meta))
    fields = (1, a[1], a[2], a[3], len(out) - a[3], 0, 0)
    put_slot(out, "A", fields)
    put_slot(out, "B", (0, *fields[1:]))
    return bytes(out)


def parse(data: bytes):
    return pc.parse_container(data)


def arrays_of(data: bytes) -> dict[str, np.ndarray]:
    c = parse(data)
    return {e.name: e.materialize(data, c.payload_offset) for e in c.entries}


# ---- typed metadata codec ------------------------------------------------------------------------

def test_codec_test_vector():
    assert _codec.encode_metadata(VECTOR).hex() == VECTOR_HEX
    assert _codec.decode_metadata(bytes.fromhex(VECTOR_HEX)) == VECTOR


values = st.recursive(
    st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=20)


@settings(max_examples=150)
@given(st.dictionaries(st.text(max_size=6), values, max_size=5))
def test_codec_round_trip(meta):
    encoded = _codec.encode_metadata(meta)
    assert _codec.decode_metadata(encoded) == meta
    assert _codec.is_canonical(encoded, meta)


@pytest.mark.parametrize("bad", [{"x": None}, {"x": 2**64}, {"x": -(2**63) - 1}, {1: 2},
                                 {"x": object()}, [], {"\ud800": 1}, {"x": "\udfff"}])
def test_codec_refuses_unencodable(bad):
    with pytest.raises(DataError, match="must be a dict|does not fit|no PyCauset metadata "
                                        "encoding|keys must be str|not encodable|surrogate"):
        _codec.encode_metadata(bad)


def test_codec_refuses_deep_nesting():
    deep: dict = {}
    for _ in range(_spec.MAX_DEPTH + 2):
        deep = {"k": deep}
    with pytest.raises(DataError, match="nested"):
        _codec.encode_metadata(deep)
    raw = b"\x08\x01\x00\x00\x00\x01\x00k" * (_spec.MAX_DEPTH + 2) + b"\x08\x00\x00\x00\x00"
    with pytest.raises(LimitError, match="nested"):
        _codec.decode_metadata(raw)


@pytest.mark.parametrize("raw, cls, match", [
    (b"", FormatError, "top-level"),
    (bytes.fromhex("0300000000000000 00".replace(" ", "")), FormatError, "top-level"),
    (bytes.fromhex("0800000000") + b"\x00", FormatError, "trailing"),
    (bytes.fromhex("08010000000100610102"), FormatError, "bool"),
    (bytes.fromhex("080100000001006109"), FormatError, "unknown metadata tag"),
    (bytes.fromhex("0801000000010061050200000041"), TruncatedError, "string"),
    (bytes.fromhex("08010000000100ff0101"), FormatError, "UTF-8"),
    (bytes.fromhex("080200000001006101010100610100"), FormatError, "duplicate"),
    (bytes.fromhex("0801000000010061 07ffffffff".replace(" ", "")), LimitError, "more entries"),
    (bytes.fromhex("08ffffffff"), LimitError, "more entries"),
    (bytes.fromhex("0801000000010061 06ffffff7f".replace(" ", "")), TruncatedError, "bytes"),
])
def test_codec_rejects(raw, cls, match):
    with pytest.raises(cls, match=match):
        _codec.decode_metadata(raw)


def test_codec_value_budget_bounds_memory():
    # 2**20 + 1 one-byte-ish values: refused before the decoder builds them all
    n = _spec.MAX_VALUES + 1
    raw = b"\x08\x01\x00\x00\x00\x01\x00a\x07" + struct.pack("<I", n) + b"\x01\x00" * n
    tracemalloc.start()
    try:
        with pytest.raises(LimitError, match="too many values"):
            _codec.decode_metadata(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_unsorted_keys_are_read_but_not_canonical():
    raw = bytes.fromhex("08020000000100620101" "0100610101")   # "b" before "a"
    assert _codec.decode_metadata(raw) == {"b": True, "a": True}
    assert not _codec.is_canonical(raw, {"a": True, "b": True})


# ---- on-disk layout, checked with struct and zlib ------------------------------------------------

def test_fresh_file_layout(tmp_path):
    path = matrix_file(tmp_path)
    data = path.read_bytes()
    assert struct.unpack_from(PREAMBLE, data, 0) == (b"PYCAUSET", 1, 1, 4096, 0)
    s = slots(data)
    for name, gen in (("A", 1), ("B", 0)):
        fields, crc, reserved = s[name][:7], s[name][7], s[name][8]
        assert fields[0] == gen and fields[5:] == (0, 0)
        assert crc == zlib.crc32(data[16 + 128 * (name == "B"):][:56])
        assert reserved == bytes(68)
    assert s["A"][1:7] == s["B"][1:7]
    _, p_off, p_len, m_off, m_len, _, _ = s["A"][:7]
    assert (p_off, p_len) == (4096, 48)
    assert m_off == 4144 and m_off % 16 == 0 and m_off + m_len == len(data)
    assert data[272:4096] == bytes(3824)
    w = np.frombuffer(data[p_off:p_off + p_len], "<f4").reshape(3, 4)
    assert (w == np.arange(12).reshape(3, 4)).all()
    magic, bver, ever, r0, plen, crc, r1 = struct.unpack_from("<4sIIIQII", data, m_off)
    assert (magic, bver, ever, r0, r1) == (b"PCMB", 1, 1, 0, 0) and m_len == 32 + plen
    body = data[m_off + 32:m_off + 32 + plen]
    assert crc == zlib.crc32(body)
    meta = _codec.decode_metadata(body)
    assert meta["rows"] == 3 and meta["cols"] == 4 and meta["seed"] == 0
    assert meta["matrix_type"] == "DENSE_FLOAT" and meta["data_type"] == "FLOAT32"
    assert meta["view"] == {"is_conjugated": False, "is_transposed": False,
                            "scalar": {"imag": 0.0, "real": 1.0}}
    assert meta["payload_layout"] == {"kind": "raw_dense",
                                      "params": {"name": "w", "crc32c": crc32c(w.tobytes())}}
    assert len(meta["payload_uuid"]) == 32 and meta["provenance"] == {"run": "r1"}


def test_arrays_layout_tiles_the_payload(tmp_path):
    state = every_dtype_state()
    data = write(tmp_path, state).read_bytes()
    a = slots(data)["A"]
    meta = _codec.decode_metadata(data[a[3] + 32:a[3] + a[4]])
    assert meta["matrix_type"] == "SNAPOPS_ARRAYS" and meta["data_type"] == "MIXED"
    layout = meta["payload_layout"]
    assert layout["kind"] == "snapops.arrays/v1" and layout["params"]["align"] == 64
    listing = layout["params"]["arrays"]
    assert [e["name"] for e in listing] == sorted(state)
    pos = 0
    for e in listing:
        assert e["offset"] == -(-pos // 64) * 64
        assert data[4096 + pos:4096 + e["offset"]] == bytes(e["offset"] - pos)
        raw = data[4096 + e["offset"]:4096 + e["offset"] + e["length"]]
        assert raw == np.ascontiguousarray(state[e["name"]]).tobytes()
        assert e["crc32c"] == crc32c(raw) and e["shape"] == list(state[e["name"]].shape)
        pos = e["offset"] + e["length"]
    assert a[2] == pos


# ---- round trips ---------------------------------------------------------------------------------

def test_round_trip_every_dtype(tmp_path):
    path = write(tmp_path)
    back = pc.load(path)
    assert back.equal(Snapshot(every_dtype_state())) and back.meta == {"gen": 3}
    assert back["nan"].view(np.uint32)[0] == 0x7FC00001
    assert back["bf16"].dtype == ml_dtypes.bfloat16
    assert pc.verify(path).ok


@pytest.mark.parametrize("state, kind", [
    ({"w": np.arange(6, dtype=np.float64).reshape(2, 3)}, "raw_dense"),
    ({"v": np.arange(5, dtype=np.int16)}, "raw_dense"),
    ({"z": np.array([[1 + 2j]], np.complex64)}, "raw_dense"),
    ({"e": np.zeros((0, 3), np.float32)}, "raw_dense"),
    ({"b": np.ones((2, 2), bool)}, "snapops.arrays/v1"),
    ({"t": np.zeros((2, 2, 2), np.float32)}, "snapops.arrays/v1"),
    ({}, "snapops.arrays/v1"),
])
def test_layout_choice(tmp_path, state, kind):
    path = tmp_path / "x.pycauset"
    assert pc.save(state, path).details["layout"] == kind
    back = pc.load(path)
    assert back.equal(Snapshot.coerce(state)) and pc.verify(path).ok


def test_layout_option(tmp_path):
    w = {"w": np.eye(2, dtype=np.float32)}
    assert pc.save(w, tmp_path / "a.pycauset", layout="arrays").details["layout"] == "snapops.arrays/v1"
    assert pc.load(tmp_path / "a.pycauset").equal(Snapshot(w))
    with pytest.raises(DataError, match="raw_dense"):
        pc.save({"a": np.zeros(2), "b": np.zeros(2)}, tmp_path / "b.pycauset", layout="raw_dense")
    with pytest.raises(DataError, match="layout"):
        pc.save(w, tmp_path / "c.pycauset", layout="npy")


def test_non_contiguous_and_big_endian_input(tmp_path):
    base = np.arange(24, dtype=">f8").reshape(4, 6)
    state = {"t": base.T, "s": base[::2, 1:4]}
    path = write(tmp_path, state)
    back = pc.load(path)
    for name, a in state.items():
        assert back[name].dtype == np.dtype("<f8") and (back[name] == a).all()


def test_deterministic_bytes_and_uuid_options(tmp_path):
    a = write(tmp_path, name="a.pycauset").read_bytes()
    assert write(tmp_path, name="b.pycauset").read_bytes() == a
    uuids = set()
    fixed = "12345678-1234-5678-1234-567812345678"
    for name, option in (("c", "random"), ("d", "random"), ("e", fixed)):
        p = write(tmp_path, name=f"{name}.pycauset", payload_uuid=option)
        uuids.add(pc.PycausetFile(p).meta["payload_uuid"])
    assert len(uuids) == 3 and "12345678123456781234567812345678" in uuids
    with pytest.raises(DataError, match="payload_uuid"):
        write(tmp_path, name="f.pycauset", payload_uuid="nope")


def test_unencodable_meta_is_refused_before_writing(tmp_path):
    with pytest.raises(DataError, match="None"):
        write(tmp_path, meta={"x": None})
    assert list(tmp_path.iterdir()) == []


def test_unsupported_dtype_refused(tmp_path):
    with pytest.raises(DataError, match="dtype"):
        write(tmp_path, {"s": np.array(["a"], "U1")})


def test_without_checksum(tmp_path):
    path = write(tmp_path, checksum=False)
    report = pc.verify(path)
    assert report.ok and any("without a CRC-32C" in n for n in report.notes)
    # no CRCs to derive it from: the payload_uuid is random, as the peer's
    other = write(tmp_path, name="o.pycauset", checksum=False)
    assert pc.PycausetFile(path).meta["payload_uuid"] != pc.PycausetFile(other).meta["payload_uuid"]


# ---- zero-copy reads -----------------------------------------------------------------------------

def _base_chain(a: np.ndarray):
    while a is not None:
        yield a
        a = getattr(a, "base", None) if not isinstance(a, (mmap.mmap, memoryview)) else getattr(
            a, "obj", None)


def test_open_lazy_is_zero_copy(tmp_path):
    big = np.random.default_rng(1).standard_normal((1024, 2048)).astype(np.float32)   # 8 MiB
    path = write(tmp_path, {"big": big, "small": np.arange(3)})
    tracemalloc.start()
    try:
        with pc.PycausetFile(path) as f:
            view = f["big"]
            assert not view.flags.writeable and not view.flags.owndata
            assert any(isinstance(b, mmap.mmap) for b in _base_chain(view))
            assert float(view[1023, 2047]) == float(big[1023, 2047])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10
    assert (view == big).all()             # the map outlives the closed file object
    with pc.PycausetFile(path) as f:
        assert f.names == ["big", "small"] and "big" in f and len(f) == 2
        with pytest.raises(FormatError, match="no such array"):
            f["nope"]


# ---- the active-slot rule ------------------------------------------------------------------------

def _fields(data: bytes, name: str) -> tuple:
    return slots(data)[name][:7]


def test_slot_selection(tmp_path):
    data = bytearray(matrix_file(tmp_path).read_bytes())
    a = _fields(data, "A")
    body = frame(_codec.encode_metadata({**pc.PycausetFile(tmp_path / "w.pycauset").meta,
                                         "provenance": {"run": "B"}}))
    merged = bytearray(data) + bytes(-len(data) % 16)
    b_block = (0, a[1], a[2], len(merged), len(body), 0, 0)
    merged += body                                        # a second block after the first
    for gen_b, expect in ((2, "B"), (1, "A"), (0, "A")):  # a tie goes to A
        put_slot(merged, "B", (gen_b, *b_block[1:]))
        c = parse(bytes(merged))
        assert c.active.name == expect
        assert c.snapshot_meta()["run"] == ("B" if expect == "B" else "r1")
    put_slot(merged, "B", (5, *b_block[1:]), crc=1)      # bad CRC: B ignored
    assert parse(bytes(merged)).active.name == "A"
    put_slot(merged, "A", a, crc=1)                       # both bad
    with pytest.raises(FormatError, match="no valid header slot") as info:
        parse(bytes(merged))
    assert info.value.check == "slots"


@pytest.mark.parametrize("change, reason", [
    (lambda f: (f[0], f[1], f[2], f[3], 1 << 62, 0, 0), "past the end"),
    (lambda f: (f[0], f[1], 1 << 63, f[3], f[4], 0, 0), "past the end"),
    (lambda f: (f[0], 4097, f[2], f[3], f[4], 0, 0), "4096-aligned"),
    (lambda f: (f[0], f[1], f[2], f[3] + 8, f[4], 0, 0), "16-aligned"),
    (lambda f: (f[0], 0, f[2], f[3], f[4], 0, 0), "inside the 4096-byte header"),
    (lambda f: (f[0], f[1], f[2], 0, f[4], 0, 0), "inside the 4096-byte header"),
])
def test_invalid_slot_falls_back_then_fails(tmp_path, change, reason):
    data = bytearray(matrix_file(tmp_path).read_bytes())
    a = _fields(data, "A")
    put_slot(data, "A", (9, *change(a)[1:]))
    c = parse(bytes(data))                                 # B (gen 0) still valid
    assert c.active.name == "B" and reason in " ".join(c.slots[0].problems(len(data)))
    put_slot(data, "B", (0, *change(a)[1:]))
    with pytest.raises(FormatError, match=reason):
        parse(bytes(data))


def test_active_slot_strict_checks(tmp_path):
    data = bytearray(matrix_file(tmp_path).read_bytes())
    a = _fields(data, "A")
    bad = bytearray(data)
    put_slot(bad, "A", a, reserved=b"\x01" + bytes(67))
    with pytest.raises(FormatError, match="slot_reserved"):
        parse(bytes(bad))
    bad = bytearray(data)
    put_slot(bad, "A", (*a[:5], 4096, 16))
    with pytest.raises(UnsupportedVersionError, match="hot region"):
        parse(bytes(bad))
    bad = bytearray(data)
    put_slot(bad, "A", (a[0], a[1], a[2] + 16, a[3], a[4], 0, 0))
    with pytest.raises(FormatError, match="overlaps the payload"):
        parse(bytes(bad))


@pytest.mark.parametrize("offset, value, cls, match", [
    (0, b"PYCAUSEX", FormatError, "not a PyCauset"),
    (8, struct.pack("<I", 2), UnsupportedVersionError, "format_version"),
    (12, b"\x02", UnsupportedVersionError, "endian"),
    (13, struct.pack("<H", 512), UnsupportedVersionError, "header_bytes"),
    (15, b"\x01", FormatError, "reserved0"),
])
def test_preamble_checks(tmp_path, offset, value, cls, match):
    data = bytearray(matrix_file(tmp_path).read_bytes())
    data[offset:offset + len(value)] = value
    with pytest.raises(cls, match=match):
        parse(bytes(data))


# ---- PCMB blocks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rel, value, cls, match", [
    (0, b"PCMX", FormatError, "magic"),
    (4, struct.pack("<I", 2), UnsupportedVersionError, "block_version"),
    (8, struct.pack("<I", 2), UnsupportedVersionError, "encoding_version"),
    (12, struct.pack("<I", 1), FormatError, "reserved"),
    (16, struct.pack("<Q", 3), FormatError, "disagrees with the slot"),
    (24, struct.pack("<I", 0), ChecksumError, "CRC32"),
    (28, struct.pack("<I", 1), FormatError, "reserved"),
    (40, b"\xff", ChecksumError, "CRC32"),
])
def test_block_checks(tmp_path, rel, value, cls, match):
    data = bytearray(matrix_file(tmp_path).read_bytes())
    m_off = _fields(data, "A")[3]
    data[m_off + rel:m_off + rel + len(value)] = value
    with pytest.raises(cls, match=match):
        parse(bytes(data))


def test_metadata_length_limit(tmp_path):
    data = bytearray(matrix_file(tmp_path).read_bytes())
    a = _fields(data, "A")
    huge = _spec.MAX_METADATA_PAYLOAD + 64
    data += bytes(huge)                                   # in range, but over the limit
    put_slot(data, "A", (a[0], a[1], a[2], a[3], huge, 0, 0))
    put_slot(data, "B", (0, a[1], a[2], a[3], huge, 0, 0))
    with pytest.raises(LimitError, match="metadata_length"):
        parse(bytes(data))


# ---- identity metadata and layouts ---------------------------------------------------------------

def _meta(tmp_path, state=None) -> tuple[bytes, dict]:
    path = write(tmp_path, state)
    return path.read_bytes(), dict(pc.PycausetFile(path).meta)


def test_unknown_keys_are_ignored(tmp_path):
    data, meta = _meta(tmp_path)
    meta["future_namespace"] = {"x": [1, 2.5, b"\x00"]}
    meta["payload_layout"]["params"]["future"] = True
    meta["payload_layout"]["params"]["arrays"][0]["future"] = "y"
    assert Snapshot(arrays_of(with_metadata(data, meta))).equal(Snapshot(every_dtype_state()))


def _arrays_meta(meta, **changes):
    item = dict(meta["payload_layout"]["params"]["arrays"][1], **changes)
    meta["payload_layout"]["params"]["arrays"][1] = item
    return meta


@pytest.mark.parametrize("mutate, cls, match", [
    (lambda m: _arrays_meta(m, offset=m["payload_layout"]["params"]["arrays"][1]["offset"] + 64),
     FormatError, "tile"),
    (lambda m: _arrays_meta(m, offset=0), FormatError, "tile"),
    (lambda m: _arrays_meta(m, length=1), FormatError, "length disagrees"),
    (lambda m: _arrays_meta(m, dtype="float128"), UnsupportedVersionError, "unknown dtype"),
    (lambda m: _arrays_meta(m, shape=[-1]), FormatError, "non-negative"),
    (lambda m: _arrays_meta(m, shape=[2**40, 2**40, 0]), LimitError, "shape too large"),
    (lambda m: _arrays_meta(m, shape=[1] * 65), FormatError, "at most 64"),
    (lambda m: _arrays_meta(m, crc32c=2**32), FormatError, "crc32c"),
    (lambda m: _arrays_meta(m, name=m["payload_layout"]["params"]["arrays"][0]["name"]),
     FormatError, "duplicate"),
    (lambda m: {**m, "payload_layout": {"kind": "snapops.arrays/v1", "params": {
        "align": 64, "arrays": [{}] * (_spec.MAX_ARRAYS + 1)}}}, LimitError, "too many arrays"),
    (lambda m: {**m, "payload_layout": {"kind": "snapops.arrays/v1", "params": {
        "align": 3, "arrays": []}}}, FormatError, "power of two"),
    (lambda m: {**m, "payload_layout": {"kind": "raw_triangular", "params": {}},
                "matrix_type": "CAUSAL"}, UnsupportedVersionError, "not supported"),
    (lambda m: {**m, "view": {"is_transposed": True}}, UnsupportedVersionError, "identity view"),
])
def test_arrays_layout_rejects(tmp_path, mutate, cls, match):
    data, meta = _meta(tmp_path)
    with pytest.raises(cls, match=match):
        parse(with_metadata(data, mutate(meta)))


def test_trailing_payload_bytes_rejected(tmp_path):
    data, meta = _meta(tmp_path)
    a = _fields(data, "A")
    meta["payload_layout"]["params"]["arrays"] = meta["payload_layout"]["params"]["arrays"][:-1]
    with pytest.raises(FormatError, match="cover the payload exactly"):
        parse(with_metadata(data, meta))
    assert a[2] > 0


def _raw_dense(tmp_path, array, **meta_changes) -> bytes:
    data, meta = _meta(tmp_path, {"m": array})
    meta.update(meta_changes)
    return with_metadata(data, meta)


def test_raw_dense_views(tmp_path):
    stored = np.arange(6, dtype=np.float64).reshape(2, 3)
    data = _raw_dense(tmp_path, stored, rows=3, cols=2,
                      view={"is_transposed": True, "is_conjugated": False, "scalar": 1.0})
    out = arrays_of(data)["m"]
    assert out.shape == (3, 2) and (out == stored.T).all() and not out.flags.owndata
    z = np.array([[1 + 2j, 3 - 1j]], np.complex128)
    data = _raw_dense(tmp_path, z, view={"is_conjugated": True})
    assert (arrays_of(data)["m"] == z.conj()).all()
    v = np.arange(4, dtype=np.int32)
    data = _raw_dense(tmp_path, v, view={"is_transposed": True})
    assert arrays_of(data)["m"].shape == (1, 4)


def test_raw_dense_bit_matrix(tmp_path):
    bits = np.random.default_rng(2).random((3, 70)) < 0.5
    packed = np.zeros((3, 64), np.uint8)
    packed[:, :9] = np.packbits(bits, axis=1, bitorder="little")
    data, meta = _meta(tmp_path, {"m": packed})              # a uint8 3x64 payload
    meta.update(cols=70, data_type="BIT", matrix_type="DENSE_FLOAT")
    assert (arrays_of(with_metadata(data, meta))["m"] == bits).all()


@pytest.mark.parametrize("changes, cls, match", [
    ({"rows": 4}, FormatError, "payload_length disagrees"),
    ({"rows": -1}, FormatError, "non-negative"),
    ({"rows": 2**49}, LimitError, "rows too large"),
    ({"cols": "3"}, FormatError, "non-negative"),
    ({"data_type": "COMPLEX_FLOAT16"}, UnsupportedVersionError, "data_type"),
    ({"matrix_type": "VECTOR"}, FormatError, "cols = 1"),
    ({"matrix_type": "IDENTITY"}, UnsupportedVersionError, "not supported"),
    ({"view": {"scalar": 2.0}}, UnsupportedVersionError, "scalar"),
    ({"view": {"scalar": {"real": 1.0, "imag": 1.0}}}, UnsupportedVersionError, "scalar"),
    ({"view": {"is_transposed": 1}}, FormatError, "bools"),
    ({"view": [1]}, FormatError, "view must be a map"),
    ({"payload_layout": "raw_dense"}, FormatError, "payload_layout must be a map"),
    ({"payload_layout": {"kind": "raw_dense", "params": {"name": 5}}}, FormatError, "name"),
])
def test_raw_dense_rejects(tmp_path, changes, cls, match):
    with pytest.raises(cls, match=match):
        parse(_raw_dense(tmp_path, np.zeros((3, 2), np.float32), **changes))


def test_peer_file_without_name_or_layout(tmp_path):
    data, meta = _meta(tmp_path, {"m": np.ones((2, 2), np.int8)})
    del meta["payload_layout"]
    assert list(arrays_of(with_metadata(data, meta))) == ["matrix"]


# ---- verify and inspect --------------------------------------------------------------------------

def test_verify_catches_payload_flip(tmp_path):
    path = write(tmp_path)
    data = bytearray(path.read_bytes())
    data[4096 + 3] ^= 0x10
    path.write_bytes(data)
    pc.load(path, verify=False)                       # opening never reads the payload
    report = pc.verify(path)
    assert not report.ok and report.failure.check == "payload_crc32c"
    with pytest.raises(FormatError, match=r"\[payload_crc32c\]"):
        pc.load(path)                                 # loading verifies first


def test_verify_catches_nonzero_padding(tmp_path):
    path = write(tmp_path)
    data = bytearray(path.read_bytes())
    listing = pc.PycausetFile(path).meta["payload_layout"]["params"]["arrays"]
    gap = next(e["offset"] + e["length"] for a, e in zip(listing[1:], listing) if
               a["offset"] > e["offset"] + e["length"])
    data[4096 + gap] = 1
    path.write_bytes(data)
    assert pc.verify(path).failure.check == "padding"
    data = bytearray(write(tmp_path, name="h.pycauset").read_bytes())
    data[1000] = 7
    (tmp_path / "h.pycauset").write_bytes(data)
    assert pc.verify(tmp_path / "h.pycauset").failure.check == "padding"


def test_inspect_view(tmp_path):
    path = matrix_file(tmp_path)
    pc.update_metadata(path, {"provenance": {"ok": True}})
    info = pc.inspect(path)
    assert info["error"] is None and info["active_slot"] == "B"
    assert [s["generation"] for s in info["slots"]] == [1, 2]
    assert all(s["valid"] and s["crc_ok"] for s in info["slots"])
    assert info["metadata_block"]["crc_ok"] and info["layout"] == "raw_dense"
    assert info["arrays"][0]["file_offset"] == 4096 and info["metadata"]["provenance"]["ok"]
    assert "slot A" in info["header"] and info["header"]["active slot"] == "B"


def test_inspect_damaged_file(tmp_path):
    path = matrix_file(tmp_path)
    data = bytearray(path.read_bytes())
    put_slot(data, "A", _fields(data, "A"), crc=0)
    put_slot(data, "B", _fields(data, "B"), crc=0)
    path.write_bytes(data)
    info = pc.inspect(path)
    assert "no valid header slot" in info["error"] and not any(s["crc_ok"] for s in info["slots"])
    (tmp_path / "empty.pycauset").write_bytes(b"")
    assert "not a PyCauset" in pc.inspect(tmp_path / "empty.pycauset")["error"]


def test_registry_and_cli(tmp_path, capsys):
    path = matrix_file(tmp_path)
    h = registry.detect(path)
    assert h.name == "pycauset" and h.load(path)["w"].shape == (3, 4)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "slot A: gen=1" in out and "active slot: A" in out
    assert main(["verify", str(path)]) == 0
