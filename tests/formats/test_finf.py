"""FINF 0.1.0: round trips, layout checked with struct, tree edits in place, exploded form,
verification, and hostile input (YAML bombs, absurd sizes, path traversal, fuzzing)."""

from __future__ import annotations

import hashlib
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from snapops.formats import finf, registry
from snapops.formats.errors import (ChecksumError, DataError, FormatError, LimitError,
                                    TruncatedError, UnsupportedVersionError)
from snapops.formats.finf import _yaml
from snapops.formats.model import Snapshot

BLOCK = struct.Struct(">4sHQQQ16s")      # magic, header_size, allocated, used, checksum, encoding
TAGS = "%YAML 1.1\n%TAG ! tag:stsci.edu:finf/0.1.0/\n"


def every_dtype_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {
        "f32": rng.standard_normal((4, 6)).astype(np.float32),
        "f64": np.array(3.5),                                   # 0-d
        "i8": np.arange(-5, 5, dtype=np.int8),
        "u8": np.arange(10, dtype=np.uint8).reshape(2, 5),
        "i16": np.arange(6, dtype=np.int16).reshape(2, 3),
        "u16": np.array([0, 1, 65535], np.uint16),
        "i32": np.array([-(2**31), 0, 2**31 - 1], np.int32),
        "u32": np.array([0, 2**32 - 1], np.uint32),
        "i64": np.array(-7, np.int64),
        "u64": np.array([2**64 - 1], np.uint64),
        "empty": np.zeros((0, 4), np.float32),
        "nan": np.array([np.nan, -0.0, np.inf], np.float32),
        "zeros": np.zeros(5000, np.float64),
        "big_endian": np.arange(7, dtype=">i4"),
        "transposed": np.arange(12, dtype=np.int64).reshape(3, 4).T,     # not C-contiguous
        "strided": np.arange(20, dtype=np.float32)[::3],
    }
    out["nan"].view(np.uint32)[0] = 0x7FC00001                 # a NaN payload must survive
    return out


def write(tmp_path: Path, state=None, name="m.finf", meta=None, **opts) -> Path:
    path = tmp_path / name
    finf.save(Snapshot(every_dtype_state() if state is None else state,
                       {"gen": 3} if meta is None else meta), path, **opts)
    return path


def assert_same(snap: Snapshot, state: dict[str, np.ndarray]) -> None:
    assert sorted(snap.arrays) == sorted(state)
    for name, want in state.items():
        got = snap[name]
        native = want.dtype.newbyteorder("=")
        assert got.dtype == native and got.shape == want.shape, name
        assert got.tobytes() == want.astype(native).tobytes(), name


def blocks_of(data: bytes) -> list[dict]:
    """Blocks parsed independently: first magic after the tree's end marker, then chained."""
    pos = data.find(b"\x89BLK", data.index(b"\n...\n") + 5)
    out = []
    while 0 <= pos < len(data):
        magic, hsize, allocated, used, checksum, enc = BLOCK.unpack_from(data, pos)
        start = pos + 6 + hsize
        out.append(dict(offset=pos, header_size=hsize, allocated=allocated, used=used,
                        checksum=checksum, encoding=enc, data_offset=start,
                        data=data[start:start + used]))
        pos = start + allocated
    assert pos == len(data)
    return out


def make_file(tree: str | None, blocks: list, pad: bytes = b"", header=b"%FINF 0.1.0\n") -> bytes:
    """A FINF file built by hand: ``blocks`` holds bytes or (payload, fields-dict)."""
    out = [header]
    if tree is not None:
        out.append(tree.encode())
    out.append(pad)
    for item in blocks:
        payload, fields = (item, {}) if isinstance(item, bytes) else item
        used = fields.get("used", len(payload))
        allocated = fields.get("allocated", len(payload))
        checksum = fields.get("checksum", 0)
        out.append(BLOCK.pack(fields.get("magic", b"\x89BLK"), fields.get("header_size", 40),
                              allocated, used, checksum, fields.get("encoding", b"")))
        out.append(fields.get("extra_header", b""))
        out.append(payload)
    return b"".join(out)


def tree_with(entries: str, meta: str = "meta: {}\n") -> str:
    return f"{TAGS}--- !finf\narrays:\n{entries}{meta}...\n"


def load_bytes(tmp_path: Path, data: bytes, name: str = "x.finf") -> Snapshot:
    path = tmp_path / name
    path.write_bytes(data)
    return finf.load(path)


# ---- round trips and layout --------------------------------------------------------------------

def test_round_trip_every_dtype_zero_copy(tmp_path):
    state = every_dtype_state()
    path = write(tmp_path, state, meta={"gen": 3, "lr": 0.25, "name": "run-1", "ok": True})
    snap = finf.load(path)
    assert_same(snap, state)
    assert snap.meta == {"gen": 3, "lr": 0.25, "name": "run-1", "ok": True}
    assert list(snap.arrays) == sorted(state)                  # canonical order: byte-wise
    f32 = snap["f32"]
    assert not f32.flags.writeable and f32.base is not None    # a view on the map, no copy
    with finf.open_lazy(path) as f:
        assert f.names == sorted(state) and f.meta["gen"] == 3
        assert np.array_equal(f["i32"], state["i32"])


@pytest.mark.parametrize("opts", [{}, {"compression": "zstd"}, {"checksum": True},
                                  {"align": 4096, "reserve": 0}, {"align": 1, "reserve": 10}])
def test_round_trip_options_and_determinism(tmp_path, opts):
    state = every_dtype_state(1)
    a = write(tmp_path, state, "a.finf", **opts)
    b = write(tmp_path, state, "b.finf", **opts)
    assert a.read_bytes() == b.read_bytes()
    assert_same(finf.load(a), state)
    report = finf.verify(a)
    assert report.ok, report.summary()
    assert report.arrays == len(state)


def test_layout_matches_binary_canonical(tmp_path):
    state = every_dtype_state()
    path = write(tmp_path, state, compression="zstd", checksum=True)
    data = path.read_bytes()
    assert data.startswith(b"%FINF 0.1.0\n" + TAGS.encode() + b"--- !finf\n")
    end = data.index(b"\n...\n") + 5
    tree = yaml.load(data[12:end], Loader=_yaml.FinfLoader)       # a SafeLoader subclass
    assert isinstance(_yaml.FinfLoader("x"), yaml.SafeLoader)
    entry = tree["arrays"]["f32"]
    assert (entry.source, entry.dtype, entry.byteorder, entry.shape) == (
        sorted(state).index("f32"), "float32", "little", (4, 6))
    assert b"byteorder: little" in data[:end]
    blocks = blocks_of(data)
    assert len(blocks) == len(state)
    assert blocks[0]["offset"] - end >= 4096                       # unused space after the tree
    assert set(data[end:blocks[0]["offset"]]) == {0x20}
    encodings = {b["encoding"] for b in blocks}
    assert encodings == {bytes(16), b"zstd" + bytes(12)}
    for b in blocks:
        assert b["header_size"] == 40 and b["allocated"] >= b["used"]
        assert b["data_offset"] % 64 == 0
        assert b["checksum"] == int.from_bytes(hashlib.md5(b["data"]).digest()[:8], "big")
    zeros = blocks[sorted(state).index("zeros")]
    assert zeros["encoding"].startswith(b"zstd")
    assert zstandard.ZstdDecompressor().decompress(zeros["data"]) == bytes(40000)
    assert any(b["allocated"] > b["used"] for b in blocks)        # unused space inside blocks
    assert blocks[-1]["allocated"] == blocks[-1]["used"]


def test_refused_dtypes_and_names(tmp_path):
    for bad in (np.zeros(2, np.complex128), np.zeros(2, "datetime64[s]")):
        with pytest.raises(DataError, match="FINF cannot hold dtype"):
            finf.save({"x": bad}, tmp_path / "x.finf")
    with pytest.raises(DataError, match="meta keys must be str"):
        finf.save(Snapshot({"x": np.zeros(1)}, {1: "not a str key"}), tmp_path / "x.finf")
    assert not (tmp_path / "x.finf").exists()


def test_tricky_names_and_meta_round_trip(tmp_path):
    names = ["yes", "null", "1.5", "- x", "a: b", "#c", "...", "---", "é/ü", "tab\tname",
             "new\nline", "'q'", '"dq"', "", " lead", "x" * 300, "\u2028sep", "\x85nel"]
    state = {n: np.array([i], np.int32) for i, n in enumerate(names)}
    meta = {"date": "2026-01-01", "yes": "no", "big": 2**70, "neg": -1.5e-300, "inf": float("inf"),
            "multi": "line1\n...\nline3", "empty": "", "none_str": "null"}
    path = write(tmp_path, state, meta=meta)
    snap = finf.load(path)
    assert_same(snap, state)
    assert snap.meta == meta


def test_both_loaders_agree():
    texts = [
        tree_with("  a: !ndarray {source: 0, dtype: int8, byteorder: little, shape: [2]}\n"),
        f"{TAGS}--- !core/finf\ndata: !core/ndarray\n  source: 0\n  dtype: float64\n"
        "  byteorder: big\n  shape: [1024, 1024]\nx: &a {k: [1, 2, {z: 2020-01-01}]}\ny: *a\n...\n",
        "%YAML 1.1\n---\n{<<: {a: 1}, b: !!binary aGk=, c: !!set {q}, d: 0x1F, e: 1_000}\n...\n",
    ]
    for text in texts:
        a = _yaml.load_tree(text, loader=_yaml.FinfLoader)
        b = _yaml.load_tree(text, loader=_yaml.FinfCLoader)
        assert _yaml.plain_value(a) == _yaml.plain_value(b)
        assert _yaml.dump_tree(a) == _yaml.dump_tree(b)


# ---- files laid out by others ------------------------------------------------------------------

def test_spec_example_layout_loads(tmp_path):
    """FINF 0.1.0's own example: ``--- !core/finf`` with ``data: !core/ndarray`` at the top."""
    data = np.arange(12, dtype="<f8").reshape(3, 4)
    tree = (f"{TAGS}--- !core/finf\ndata: !core/ndarray\n  source: 0\n  dtype: float64\n"
            "  byteorder: little\n  shape: [3, 4]\n...\n")
    snap = load_bytes(tmp_path, make_file(tree, [data.tobytes()], pad=b"  \t\xff\xfe junk "))
    assert list(snap.arrays) == ["data"] and np.array_equal(snap["data"], data)
    assert snap.meta == {}


def test_dos_newlines_big_endian_shared_block_and_offsets(tmp_path):
    payload = np.arange(4, dtype=">u4").tobytes() + np.arange(3, dtype="<i2").tobytes()
    tree = tree_with(
        "  be: !ndarray {source: 0, dtype: uint32, byteorder: big, shape: [2, 2]}\n"
        "  le: !ndarray {source: 0, offset: 16, dtype: int16, byteorder: little, shape: [3]}\n"
        "  byte: !ndarray {source: 0, dtype: uint8, shape: [1]}\n").replace("\n", "\r\n")
    data = make_file(tree, [payload], header=b"%FINF 0.1.3\r\n")
    snap = load_bytes(tmp_path, data)
    assert np.array_equal(snap["be"], np.arange(4).reshape(2, 2)) and snap["be"].dtype == "=u4"
    assert np.array_equal(snap["le"], np.arange(3)) and snap["byte"][0] == 0
    assert finf.verify(tmp_path / "x.finf").ok


def test_update_tree_on_a_dos_file(tmp_path):
    tree = tree_with("  w: !ndarray {source: 0, dtype: int8, byteorder: little, shape: [2]}\n",
                     meta="meta:\n  a: 1\n").replace("\n", "\r\n")
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(tree, [b"\x01\x02"], pad=b" " * 64))
    assert finf.update_tree(path, {"b": "two"})["mode"] == "in_place"
    snap = finf.load(path)
    assert snap.meta == {"a": 1, "b": "two"} and snap["w"].tolist() == [1, 2]


def test_no_tree_file_and_larger_header_size(tmp_path):
    snap = load_bytes(tmp_path, make_file(None, [b"abc", (b"defg", {"header_size": 48,
                                                                    "extra_header": bytes(8)})]))
    assert len(snap) == 0
    info = finf.inspect(tmp_path / "x.finf")
    assert [b["used"] for b in info["blocks"]] == [3, 4]
    assert info["blocks"][1]["header_size"] == 48


def test_block_magic_inside_the_tree_is_not_a_block(tmp_path):
    state = {"w": np.arange(3, dtype=np.float32)}
    path = write(tmp_path, state, meta={"trap": "\u0249BLK"})   # U+0249 is C9 89 in UTF-8
    assert b"\x89BLK" in path.read_bytes()[:200]
    assert_same(finf.load(path), state)
    assert finf.verify(path).ok


# ---- the tree edited in place ------------------------------------------------------------------

def test_update_tree_in_place_leaves_blocks_alone(tmp_path):
    path = write(tmp_path, meta={"gen": 3, "drop": "me"})
    before = path.read_bytes()
    first = blocks_of(before)[0]["offset"]
    inode = path.stat().st_ino
    info = finf.update_tree(path, {"step": 1200, "drop": None, "note": "x" * 1000})
    after = path.read_bytes()
    assert info["mode"] == "in_place" and path.stat().st_ino == inode
    assert len(after) == len(before) and after[first:] == before[first:]
    assert finf.load(path).meta == {"gen": 3, "step": 1200, "note": "x" * 1000}
    finf.update_tree(path, {"note": None})                      # shrink: no stale text left
    assert b"xxxx" not in path.read_bytes() and finf.verify(path).ok
    assert finf.load(path).meta == {"gen": 3, "step": 1200}


def test_update_tree_keeps_hand_edits_outside_meta(tmp_path):
    tree = tree_with("  # a reviewer's note\n"
                     "  w: !ndarray {source: 0, dtype: int8, byteorder: little, shape: [2]}\n",
                     meta="meta:\n  a: 1\n")
    data = make_file(tree, [b"\x01\x02"], pad=b" " * 512)
    path = tmp_path / "x.finf"
    path.write_bytes(data)
    finf.update_tree(path, {"b": 2})
    text = path.read_bytes()
    assert b"# a reviewer's note" in text and finf.load(path).meta == {"a": 1, "b": 2}


def test_update_tree_when_meta_is_not_last_reemits(tmp_path):
    tree = (f"{TAGS}--- !finf\nmeta: {{a: 1}}\narrays:\n"
            "  w: !ndarray {source: 0, dtype: int8, byteorder: little, shape: [2]}\n"
            "extra: !core/software {name: elsewhere}\n...\n")
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(tree, [b"\x01\x02"], pad=b" " * 512))
    assert finf.update_tree(path, {"b": 2})["mode"] == "in_place"
    snap = finf.load(path)
    assert snap.meta == {"a": 1, "b": 2} and snap["w"].tolist() == [1, 2]
    assert b"!core/software" in path.read_bytes()


def test_update_tree_that_does_not_fit(tmp_path):
    state = every_dtype_state()
    path = write(tmp_path, state, reserve=0, align=4096)
    before = blocks_of(path.read_bytes())
    with pytest.raises(LimitError, match=r"\[limit\] the new tree does not"):
        finf.update_tree(path, {"blob": "y" * 8000}, rewrite="never")
    assert blocks_of(path.read_bytes()) == before
    info = finf.update_tree(path, {"blob": "y" * 8000})
    assert info["mode"] == "rewritten"
    after = blocks_of(path.read_bytes())
    assert [b["data"] for b in after] == [b["data"] for b in before]
    assert all(b["data_offset"] % 4096 == 0 for b in after)        # alignment kept
    assert finf.load(path).meta["blob"] == "y" * 8000 and finf.verify(path).ok
    assert finf.update_tree(path, {"x": 1}, rewrite="always")["mode"] == "rewritten"


def test_update_tree_callable_may_not_touch_arrays(tmp_path):
    path = write(tmp_path)

    def add_history(root):
        root["history"] = [{"action": "fine-tune"}]

    finf.update_tree(path, add_history)
    assert finf.inspect(path)["tree"]["root_tag"].endswith("/finf")
    assert b"history:" in path.read_bytes()

    def retype(root):
        root["arrays"]["f32"].dtype = "int32"

    with pytest.raises(DataError, match=r"update_tree edits metadata only: array entries"):
        finf.update_tree(path, retype)
    with pytest.raises(DataError, match=r"rewrite must be 'auto', 'never' or"):
        finf.update_tree(path, {"k": 1}, rewrite="sometimes")


def test_registry_detects_finf(tmp_path):
    path = write(tmp_path)
    assert registry.detect(path).name == "finf"
    assert registry.handler("finf") is finf.FORMAT
    assert registry.handler_for_suffix("x.finf").name == "finf"


# ---- verification ------------------------------------------------------------------------------

def test_default_blocks_are_unchecked_and_verify_says_so(tmp_path):
    path = write(tmp_path)
    assert all(b["checksum"] == 0 for b in blocks_of(path.read_bytes()))
    report = finf.verify(path)
    assert report.ok and any("no checksum" in note for note in report.notes)


def test_verify_finds_a_flipped_payload_byte(tmp_path):
    path = write(tmp_path, checksum=True)
    data = bytearray(path.read_bytes())
    block = blocks_of(bytes(data))[2]
    data[block["data_offset"]] ^= 0x01
    path.write_bytes(data)
    report = finf.verify(path)
    assert not report.ok and isinstance(report.failure, ChecksumError)
    assert report.failure.chunk == 2


def test_verify_notes_unchecked_and_unreferenced_blocks(tmp_path):
    tree = tree_with("  w: !ndarray {source: 1, dtype: uint8, shape: [2]}\n")
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(tree, [b"zz", b"ab"]))
    report = finf.verify(path)
    assert report.ok
    assert any("no checksum" in n for n in report.notes)
    assert any("referenced by no array" in n for n in report.notes)


# ---- hostile input -----------------------------------------------------------------------------

def _bounded(fn, limit: int = 32 << 20):
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(FormatError,
                           match=r"\[[a-z0-9_]+\]") as info:
            fn()
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, peak
    assert elapsed < 10
    return info.value


BILLION_LAUGHS = ("meta:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
                  + "".join(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]\n"
                            for i in range(1, 10)))


HOSTILE = [
    ("billion laughs", tree_with("", meta=BILLION_LAUGHS), "limit"),
    ("deep nesting", f"{TAGS}--- " + "[" * 50000 + "]" * 50000 + "\n...\n", "limit"),
    ("deep block nesting", f"{TAGS}---\n" + "".join(" " * i + "- \n" for i in range(3000))
     + "...\n", "limit"),
    ("recursive alias", f"{TAGS}--- &a {{x: *a}}\n...\n", "alias"),
    ("python tag", f"{TAGS}--- !!python/object/apply:os.system ['touch PWNED']\n...\n",
     "unsafe_tag"),
    ("huge int", f"{TAGS}--- {{a: {'9' * 5000}}}\n...\n", "grammar"),
    ("two documents", f"{TAGS}--- {{a: 1}}\n--- {{b: 2}}\n...\n", "grammar"),
    ("not a mapping", f"{TAGS}--- [1, 2]\n...\n", "grammar"),
]


@pytest.mark.parametrize("name,tree,check", HOSTILE)
def test_hostile_trees_are_typed_errors_in_bounded_memory(tmp_path, monkeypatch, name, tree,
                                                          check):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(tree, []))
    error = _bounded(lambda: finf.load(path))
    assert error.check == check, error
    assert not (tmp_path / "PWNED").exists()
    assert not finf.verify(path).ok


@pytest.mark.parametrize("loader", [_yaml.FinfLoader, _yaml.FinfCLoader])
def test_both_loaders_refuse_the_same_trees(loader):
    for name, tree, check in HOSTILE:
        with pytest.raises(FormatError, match=r"\[(alias|grammar|limit|unsafe_tag)\]") as info:
            _yaml.load_tree(tree, loader=loader)
        assert info.value.check == check, name


def test_tree_size_limit(tmp_path):
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(f"{TAGS}--- {{a: '{'x' * 5000}'}}\n...\n", []))
    with pytest.raises(LimitError, match="tree"):
        finf.FinfFile(path, limits=finf.Limits(max_tree_bytes=1000))
    with pytest.raises(LimitError, match="node"):
        finf.FinfFile(path, limits=finf.Limits(max_nodes=2))
    assert finf.load(path).meta == {}


ENTRY = "  w: !ndarray {source: 0, dtype: uint8, byteorder: little, shape: [4]}\n"


@pytest.mark.parametrize("fields,error", [
    ({"allocated": 2**64 - 1, "used": 4}, TruncatedError),
    ({"allocated": 4, "used": 2**63}, FormatError),
    ({"header_size": 0xFFFF}, TruncatedError),
    ({"header_size": 12}, FormatError),
    ({"encoding": b"lz4"}, UnsupportedVersionError),
    ({"encoding": b"zstd\0x"}, FormatError),
    ({"magic": b"\x89BLX"}, FormatError),
    ({"checksum": 12345}, None),          # the reader does not hash; verify (and load) do
])
def test_absurd_block_headers(tmp_path, fields, error):
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(tree_with(ENTRY), [(b"abcd", fields)]))
    if error is None:
        finf.load(path, verify=False)
        assert isinstance(finf.verify(path).failure, ChecksumError)
        with pytest.raises(ChecksumError, match=r"\[checksum\]"):
            finf.load(path)
        return
    assert isinstance(_bounded(lambda: finf.load(path)), error)


@pytest.mark.parametrize("entry", [
    "  w: !ndarray {source: 0, dtype: float64, byteorder: little, shape: [4611686018427387904]}\n",
    "  w: !ndarray {source: 7, dtype: uint8, shape: [1]}\n",
    "  w: !ndarray {source: 0, offset: 99, dtype: uint8, shape: [1]}\n",
    "  w: !ndarray {source: -1, dtype: uint8, shape: [1]}\n",
    "  w: !ndarray {source: 0, dtype: uint8, shape: [true]}\n",
    "  w: !ndarray {source: 0, dtype: float32, shape: [1]}\n",       # byteorder missing
    "  w: !ndarray [0, uint8]\n",
    "  w: 5\n",
])
def test_bad_ndarray_entries(tmp_path, entry):
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(tree_with(entry), [b"abcd"]))
    _bounded(lambda: finf.load(path))


@pytest.mark.parametrize("dims", ["99999999999999999999999", "9223372036854775808",
                                  "68719476736, 68719476736"])
def test_an_empty_array_with_dimensions_numpy_cannot_hold_is_a_limit_error(tmp_path, dims):
    path = tmp_path / "x.finf"
    entry = "  w: !ndarray {source: 0, dtype: uint8, byteorder: little, shape: [0, %s]}\n" % dims
    path.write_bytes(make_file(tree_with(entry), [b"abcd"]))
    shown = "x".join(d.strip() for d in dims.split(","))
    with pytest.raises(LimitError, match=rf"x.finf:\d+: \[limit\] expected dimensions spanning "
                                         rf"at most \d+ bytes, got shape 0x{shown} of 1-byte"):
        finf.load(path)
    assert not finf.verify(path).ok

@pytest.mark.parametrize("entry", [
    "  w: !ndarray {source: 0, dtype: complex64, byteorder: little, shape: [1]}\n",
    "  w: !ndarray {source: 0, dtype: uint8, shape: [1], strides: [1]}\n",
    "  w: !ndarray {data: [1, 2], dtype: uint8, shape: [2]}\n",
])
def test_unsupported_ndarray_variants(tmp_path, entry):
    path = tmp_path / "x.finf"
    path.write_bytes(make_file(tree_with(entry), [b"abcd"]))
    with pytest.raises(UnsupportedVersionError, match=r"\[version\]"):
        finf.load(path)


def test_zstd_bombs_are_refused_before_allocating(tmp_path):
    small = zstandard.ZstdCompressor().compress(bytes(1 << 20))       # honest 1 MiB of zeros
    lying = bytearray(small)
    entry = "  w: !ndarray {source: 0, dtype: uint8, shape: [%d]}\n"
    cases = [
        (entry % (1 << 40), small),                                      # claims 1 TiB
        (entry % (1 << 20), bytes(lying[:len(lying) // 2])),             # cut frame
        (entry % (1 << 20), small + b"trailing"),
        (entry % (1 << 21), small),                                      # frame too small
    ]
    for tree_entry, payload in cases:
        path = tmp_path / "x.finf"
        path.write_bytes(make_file(tree_with(tree_entry), [(payload, {"encoding": b"zstd"})]))
        _bounded(lambda: finf.load(path), limit=8 << 20)
    path.write_bytes(make_file(tree_with(entry % (1 << 20)), [(small, {"encoding": b"zstd"})]))
    assert finf.load(path)["w"].nbytes == 1 << 20


@pytest.mark.parametrize("data,error", [
    (b"", TruncatedError), (b"%FI", TruncatedError), (b"%FINF 0.1", TruncatedError),
    (b"%FINF 1.0.0\n", UnsupportedVersionError), (b"#ASDF 1.0.0\n", FormatError),
    (b"%FINF 0.1.0\n%YAML 1.2\n---\n{}\n...\n", FormatError),
    (b"%FINF 0.1.0\n%YAML 1.1\n--- {a: 1}\n", TruncatedError),
    (b"%FINF 0.1.0\n%YAML 1.1\n--- {a: \xff}\n...\n", FormatError),
    (b"%FINF 0.1.0\n\x89BLK", TruncatedError),
])
def test_bad_headers_and_trees(tmp_path, data, error):
    with pytest.raises(error, match=r"\[(grammar|truncated|version)\]"):
        load_bytes(tmp_path, data)


def _small_file(tmp_path: Path) -> bytes:
    path = write(tmp_path, {"a": np.arange(6, dtype=np.int16).reshape(2, 3),
                            "b": np.array([1.5, -2.0], np.float32)},
                 name="small.finf", reserve=8, align=8, compression=None)
    return path.read_bytes()


def _load_or_typed_error(path: Path) -> None:
    try:
        snap = finf.load(path)
        for array in snap.arrays.values():
            array.tobytes()
    except FormatError:
        pass
    report = finf.verify(path)                     # never raises
    assert report.ok or report.failure is not None


def test_truncation_at_every_offset(tmp_path):
    data = _small_file(tmp_path)
    path = tmp_path / "cut.finf"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        if n == len(b"%FINF 0.1.0\n"):         # the header alone is a valid, empty file
            assert len(finf.load(path)) == 0
            continue
        with pytest.raises(FormatError, match=r"\[(grammar|truncated)\]"):
            finf.load(path)
        assert not finf.verify(path).ok


def test_bit_flips_everywhere(tmp_path):
    data = _small_file(tmp_path)
    path = tmp_path / "flip.finf"
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        path.write_bytes(flipped)
        _load_or_typed_error(path)


def _mutations():
    valid = make_file(tree_with(
        "  a: !ndarray {source: 0, dtype: int16, byteorder: little, shape: [2, 3]}\n"
        "  b: !ndarray {source: 1, offset: 2, dtype: uint8, shape: [2]}\n",
        meta="meta: {gen: 3, x: &x [1, 2], y: *x}\n"),
        [bytes(range(12)), (b"abcd", {"allocated": 6})]) + b"\0\0"
    splice = st.tuples(st.integers(0, len(valid)), st.integers(0, 16), st.binary(max_size=16))
    return st.one_of(
        st.binary(max_size=300),
        st.binary(max_size=300).map(lambda b: b"%FINF 0.1.0\n" + b),
        st.binary(max_size=300).map(lambda b: b"%FINF 0.1.0\n%YAML 1.1\n--- " + b + b"\n...\n"),
        st.lists(splice, min_size=1, max_size=4).map(
            lambda edits: _apply_edits(valid, edits)),
    )


def _apply_edits(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for at, cut, new in edits:
        at = min(at, len(out))
        out[at:at + cut] = new
    return bytes(out)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=_mutations())
def test_any_bytes_give_a_snapshot_or_a_typed_error(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "fuzz.finf"
    path.write_bytes(data)
    _load_or_typed_error(path)
