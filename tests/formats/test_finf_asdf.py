"""FINF against its peer, today's ``asdf`` library (FINF 0.1.0 is the 2014 name of ASDF).

The transcoders below are written from the two specs only (struct + PyYAML, no snapops code):
FINF -> ASDF swaps the header line for ``#ASDF 1.0.0`` + ``#ASDF_STANDARD 1.5.0``, the tags for
ASDF's (``core/asdf-1.1.0``, ``core/ndarray-1.0.0``), ``dtype`` for ``datatype``, and each 46-byte
``89 BLK`` block header for a 48-byte ``D3 BLK`` one (flags, compression, data_size, full MD5);
zstd blocks are inflated because ASDF's core has no zstd. ASDF -> FINF does the reverse.
"""

from __future__ import annotations

import hashlib
import re
import struct
import warnings
from pathlib import Path

import asdf
import numpy as np
import pytest
import yaml
import zstandard

from snapops.formats import finf
from snapops.formats.model import Snapshot

FINF_TAG = "tag:stsci.edu:finf/0.1.0/"
ASDF_TAG = "tag:stsci.edu:asdf/"
FINF_BLOCK = struct.Struct(">4sHQQQ16s")          # 6 + 40
ASDF_BLOCK = struct.Struct(">4sHI4sQQQ16s")       # 6 + 48
TREE_END = re.compile(rb"\r?\n\.\.\.\r?\n")


class Node:
    """A tagged YAML value as the transcoders see it."""

    def __init__(self, tag, value):
        self.tag, self.value = tag, value


class KeepTags(yaml.SafeLoader):
    pass


def _keep(loader, suffix, node):
    if isinstance(node, yaml.MappingNode):
        return Node(node.tag, loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Node(node.tag, loader.construct_sequence(node, deep=True))
    return Node(node.tag, loader.construct_scalar(node))


KeepTags.add_multi_constructor("tag:stsci.edu:", _keep)


class WriteTags(yaml.SafeDumper):
    pass


WriteTags.add_representer(
    Node, lambda d, n: d.represent_mapping(n.tag, n.value) if isinstance(n.value, dict)
    else d.represent_sequence(n.tag, n.value) if isinstance(n.value, list)
    else d.represent_scalar(n.tag, n.value))


def _map_tree(value, fn):
    if isinstance(value, Node):
        return fn(Node(value.tag, _map_tree(value.value, fn)))
    if isinstance(value, dict):
        return {k: _map_tree(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_tree(v, fn) for v in value]
    return value


def _dump(tree, handle: str, prefix: str) -> bytes:
    return yaml.dump(tree, Dumper=WriteTags, explicit_start=True, explicit_end=True,
                     version=(1, 1), tags={handle: prefix}, sort_keys=False).encode()


# ---- FINF -> ASDF ----------------------------------------------------------------------------

def finf_to_asdf(data: bytes) -> bytes:
    assert data.startswith(b"%FINF 0.1.0\n")
    end = TREE_END.search(data).end()
    tree = yaml.load(data[12:end].decode(), Loader=KeepTags)
    inflate: set[int] = set()

    def convert(node: Node) -> Node:
        kind = node.tag[len(FINF_TAG):]
        if kind in ("ndarray", "core/ndarray"):
            entry = dict(node.value)
            entry["datatype"] = entry.pop("dtype")
            return Node(ASDF_TAG + "core/ndarray-1.0.0", entry)
        if kind in ("finf", "core/finf"):
            return Node(ASDF_TAG + "core/asdf-1.1.0", node.value)
        raise AssertionError(f"unexpected tag {node.tag}")

    out = [b"#ASDF 1.0.0\n#ASDF_STANDARD 1.5.0\n",
           _dump(_map_tree(tree, convert), "!", ASDF_TAG)]
    pos = data.find(b"\x89BLK", end)
    while 0 <= pos < len(data):
        magic, hsize, allocated, used, checksum, encoding = FINF_BLOCK.unpack_from(data, pos)
        assert magic == b"\x89BLK" and hsize == 40
        start = pos + 6 + hsize
        payload = data[start:start + used]
        if checksum:
            assert int.from_bytes(hashlib.md5(payload).digest()[:8], "big") == checksum
        if encoding.rstrip(b"\0") == b"zstd":
            payload = zstandard.ZstdDecompressor().decompress(payload)
        else:
            assert encoding == bytes(16)
        out.append(ASDF_BLOCK.pack(b"\xd3BLK", 48, 0, b"\0\0\0\0", len(payload), len(payload),
                                   len(payload), hashlib.md5(payload).digest()))
        out.append(payload)
        pos = start + allocated
    return b"".join(out)


# ---- ASDF -> FINF ----------------------------------------------------------------------------

def asdf_to_finf(data: bytes) -> bytes:
    assert data.startswith(b"#ASDF 1.0.0\n")
    tree_at = data.index(b"%YAML")
    end = TREE_END.search(data).end()
    tree = yaml.load(data[tree_at:end].decode(), Loader=KeepTags)

    def convert(node: Node) -> Node:
        kind = node.tag[len(ASDF_TAG):].rsplit("-", 1)[0]
        if kind == "core/ndarray":
            entry = dict(node.value)
            entry["dtype"] = entry.pop("datatype")
            return Node(FINF_TAG + "ndarray", entry)
        if kind == "core/asdf":
            return Node(FINF_TAG + "finf", node.value)
        return Node(FINF_TAG + kind, node.value)     # software, history...: kept, not read

    out = [b"%FINF 0.1.0\n", _dump(_map_tree(tree, convert), "!", FINF_TAG)]
    pos = data.find(b"\xd3BLK", end)
    while pos >= 0 and data[pos:pos + 4] == b"\xd3BLK":
        (magic, hsize, flags, compression, allocated, used, size,
         digest) = ASDF_BLOCK.unpack_from(data, pos)
        assert hsize == 48 and flags == 0 and compression == b"\0\0\0\0"
        start = pos + 6 + hsize
        payload = data[start:start + used]
        out.append(FINF_BLOCK.pack(b"\x89BLK", 40, used, used,
                                   int.from_bytes(digest[:8], "big"), bytes(16)))
        out.append(payload)
        pos = start + allocated
    return b"".join(out)          # ASDF's trailing block index is not part of FINF


# ---- tests -------------------------------------------------------------------------------------

def peer_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {
        "emb": rng.standard_normal((40, 24)).astype(np.float32),
        "bias": rng.standard_normal(57),
        "ids": rng.integers(0, 2**32, 900, dtype=np.uint32),
        "i8": np.arange(-5, 5, dtype=np.int8).reshape(2, 5),
        "u8": np.arange(10, dtype=np.uint8),
        "i16": np.array([-(2**15), 0, 2**15 - 1], np.int16),
        "u16": np.array([0, 65535], np.uint16),
        "i32": np.arange(12, dtype=np.int32).reshape(3, 4),
        "i64": np.array(-7, np.int64),                        # 0-d
        "u64": np.array([2**64 - 1, 0], np.uint64),
        "zeros": np.zeros(4096, np.float32),                  # zstd makes this block small
        "nan": np.array([np.nan, -0.0, np.inf], np.float64),
    }
    out["nan"].view(np.uint64)[0] = 0x7FF8000000000001       # a NaN payload must survive
    return out


def open_peer(path: Path) -> dict[str, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the peer must not complain either
        with asdf.open(path, validate_checksums=True, lazy_load=False, memmap=False) as af:
            return {name: np.array(value) for name, value in af.tree["arrays"].items()}


def assert_bit_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype.newbyteorder("=") == want.dtype
    assert got.astype(want.dtype).tobytes() == want.tobytes()


def test_peer_version_is_the_pinned_one():
    assert asdf.__version__ == "6.0.0"


@pytest.mark.parametrize("opts", [{}, {"compression": "zstd"}, {"checksum": False},
                                  {"align": 4096, "reserve": 0}])
def test_finf_written_by_snapops_opens_in_asdf(tmp_path, opts):
    state = peer_state()
    path = tmp_path / "m.finf"
    finf.save(Snapshot(state, {"gen": 3, "note": "ok"}), path, **opts)
    peer = tmp_path / "m.asdf"
    peer.write_bytes(finf_to_asdf(path.read_bytes()))
    arrays = open_peer(peer)
    assert sorted(arrays) == sorted(state)
    for name, want in state.items():
        assert_bit_equal(arrays[name], want)
    with asdf.open(peer) as af:
        assert af.tree["meta"] == {"gen": 3, "note": "ok"}


def test_finf_after_tree_update_and_implode_still_opens_in_asdf(tmp_path):
    state = peer_state(1)
    path = tmp_path / "m.finf"
    finf.save(state, path)
    assert finf.update_tree(path, {"step": 12})["mode"] == "in_place"
    finf.explode(path, tmp_path / "parts")
    finf.implode(tmp_path / "parts" / "m.finf", tmp_path / "back.finf")
    peer = tmp_path / "m.asdf"
    peer.write_bytes(finf_to_asdf((tmp_path / "back.finf").read_bytes()))
    arrays = open_peer(peer)
    for name, want in state.items():
        assert_bit_equal(arrays[name], want)


def test_asdf_written_by_peer_opens_in_snapops(tmp_path):
    state = peer_state(2)
    state["big_endian"] = np.arange(6, dtype=">f8").reshape(2, 3)
    peer = tmp_path / "p.asdf"
    af = asdf.AsdfFile({"arrays": dict(state), "label": "from asdf"}, version="1.5.0")
    af.write_to(peer, all_array_storage="internal")
    path = tmp_path / "p.finf"
    path.write_bytes(asdf_to_finf(peer.read_bytes()))
    snap = finf.load(path)
    assert sorted(snap.arrays) == sorted(state)
    for name, want in state.items():
        got = snap[name]
        assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
        assert got.tobytes() == want.astype(want.dtype.newbyteorder("=")).tobytes()
    report = finf.verify(path)
    assert report.ok, report.summary()
    assert "checksum" in report.checks
