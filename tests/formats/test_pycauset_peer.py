"""PyCauset interop with the real peer, PyPI ``pycauset==0.6.1``, in both directions.

Files the peer saves open in snapops with equal values; files snapops writes open in
``pycauset.load`` with equal values, also after snapops' in-place metadata updates; the peer's
own metadata update is read by snapops; the peer's ``storage_debug.summarize_container`` parses
snapops' multi-array files; the two metadata codecs agree byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapops.formats import pycauset as pc
from snapops.formats.errors import UnsupportedVersionError
from snapops.formats.model import Snapshot
from snapops.formats.pycauset import _codec

import pycauset as peer  # noqa: E402  (pycauset==0.6.1, a test extra)
from pycauset._internal import persistence, storage_debug  # noqa: E402

RNG = np.random.default_rng(7)
PEER_MATRICES = {
    "f32": RNG.standard_normal((5, 7)).astype(np.float32),
    "f64": RNG.standard_normal((3, 4)),
    "f16": RNG.standard_normal((2, 3)).astype(np.float16),
    "c64": (RNG.standard_normal((2, 2)) + 1j * RNG.standard_normal((2, 2))).astype(np.complex64),
    "c128": RNG.standard_normal((1, 3)) - 2j,
    "i8": RNG.integers(-128, 128, (4, 4), dtype=np.int8),
    "i16": RNG.integers(-999, 999, (2, 5), dtype=np.int16),
    "i32": RNG.integers(-2**31, 2**31, (3, 3), dtype=np.int32),
    "i64": RNG.integers(-2**62, 2**62, (2, 2), dtype=np.int64),
    "u8": RNG.integers(0, 256, (3, 2), dtype=np.uint8),
    "u16": RNG.integers(0, 2**16, (2, 2), dtype=np.uint16),
    "u32": RNG.integers(0, 2**32, (2, 3), dtype=np.uint32),
    "u64": RNG.integers(0, 2**63, (3, 1), dtype=np.uint64),
}


def peer_values(obj) -> np.ndarray:
    return np.asarray(obj)


# ---- peer -> snapops -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PEER_MATRICES))
def test_peer_matrix_opens_in_snapops(tmp_path, name):
    a = PEER_MATRICES[name]
    path = tmp_path / "p.pycauset"
    peer.save(peer.matrix(a), str(path))
    snap = pc.load(path)
    assert list(snap) == ["matrix"] and snap.meta == {}
    out = snap["matrix"]
    assert out.dtype == a.dtype and out.shape == a.shape
    assert out.tobytes() == a.tobytes()
    report = pc.verify(path)
    assert report.ok and any("without a CRC-32C" in n for n in report.notes)


def test_peer_views_vectors_and_bits(tmp_path):
    m = peer.matrix(np.arange(6, dtype=np.float64).reshape(2, 3))
    cases = {
        "t": (m.T, np.arange(6, dtype=np.float64).reshape(2, 3).T),
        "v": (peer.vector(np.array([1.0, 2.0, 3.0])), np.array([1.0, 2.0, 3.0])),
        "vt": (peer.vector(np.array([1.0, 2.0])).T, np.array([[1.0, 2.0]])),
        "conj": (peer.matrix(np.array([[1 + 1j, 2 - 3j]])).conj(), np.array([[1 - 1j, 2 + 3j]])),
        "bits": (peer.matrix(RNG.random((3, 600)) < 0.5), None),
        "bitv": (peer.vector(RNG.random(70) < 0.5), None),
        "empty": (peer.matrix(np.zeros((0, 3), np.float32)), np.zeros((0, 3), np.float32)),
    }
    for name, (obj, expected) in cases.items():
        path = tmp_path / f"{name}.pycauset"
        peer.save(obj, str(path))
        if expected is None:
            expected = peer_values(peer.load(str(path)))
        out = pc.load(path)["matrix"]
        assert out.shape == expected.shape and out.dtype == expected.dtype, name
        assert (out == expected).all(), name


def test_peer_transposed_matrix_is_a_zero_copy_view(tmp_path):
    path = tmp_path / "t.pycauset"
    peer.save(peer.matrix(np.arange(12, dtype=np.float32).reshape(3, 4)).T, str(path))
    with pc.PycausetFile(path) as f:
        out = f["matrix"]
        assert out.shape == (4, 3) and not out.flags.owndata and not out.flags.c_contiguous


def test_peer_layouts_snapops_does_not_read_are_refused(tmp_path):
    path = tmp_path / "tri.pycauset"
    peer.save(peer.TriangularFloatMatrix(3), str(path))        # raw_triangular
    with pytest.raises(UnsupportedVersionError, match="not supported"):
        pc.load(path)
    info = pc.inspect(path)
    assert info["active_slot"] == "A" and "raw_triangular" in info["error"]


def test_peer_metadata_update_is_read_by_snapops(tmp_path):
    path = tmp_path / "w.pycauset"
    pc.save({"w": np.eye(3, dtype=np.float32)}, path)
    uuid = pc.PycausetFile(path).meta["payload_uuid"]
    persistence.write_cached_big_blob_ref(path, name="inverse", ref_kind="sibling_object_store",
                                          object_id="abc", signature={"payload_uuid": uuid})
    with pc.PycausetFile(path) as f:
        assert f.container.active.name == "B" and f.container.active.generation == 2
        assert f.meta["cached"]["inverse"]["value"]["object_id"] == "abc"
        assert (f["w"] == np.eye(3)).all()
    assert pc.verify(path).ok
    pc.update_metadata(path, {"provenance": {"after_peer": True}})
    assert pc.PycausetFile(path).container.active.name == "A"
    assert persistence.read_typed_metadata(path)["provenance"] == {"after_peer": True}


# ---- snapops -> peer -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PEER_MATRICES))
def test_snapops_matrix_opens_in_peer(tmp_path, name):
    a = PEER_MATRICES[name]
    path = tmp_path / "s.pycauset"
    assert pc.save(Snapshot({"weights": a}, {"step": 12}), path).details["layout"] == "raw_dense"
    out = peer_values(peer.load(str(path)))
    assert out.dtype == a.dtype and out.shape == a.shape and out.tobytes() == a.tobytes()
    meta = persistence.read_typed_metadata(path)
    assert meta["provenance"] == {"step": 12} and meta["payload_layout"]["kind"] == "raw_dense"


def test_snapops_vector_and_empty_open_in_peer(tmp_path):
    for name, a in (("v", np.arange(5, dtype=np.float64)),
                    ("e", np.zeros((0, 3), np.float32))):
        path = tmp_path / f"{name}.pycauset"
        pc.save({name: a}, path)
        out = peer_values(peer.load(str(path)))
        assert out.shape == a.shape and (out == a).all()


def test_peer_reads_after_snapops_updates(tmp_path):
    a = PEER_MATRICES["f32"]
    path = tmp_path / "u.pycauset"
    pc.save({"w": a}, path)
    for i in range(3):                       # slots B, A, B
        pc.update_metadata(path, {"provenance": {"verified": i}})
        assert persistence.read_typed_metadata(path)["provenance"]["verified"] == i
        assert peer_values(peer.load(str(path))).tobytes() == a.tobytes()
    summary = storage_debug.summarize_container(path)
    assert summary["active_slot"] == "B" and summary["slot_b"].generation == 4


def test_summarize_container_parses_multi_array_files(tmp_path):
    path = tmp_path / "m.pycauset"
    state = {"a": np.zeros(3), "b": np.ones((2, 2), bool), "c": np.arange(24).reshape(2, 3, 4)}
    pc.save(state, path)
    pc.update_metadata(path, {"provenance": {"x": 1}})
    summary = storage_debug.summarize_container(path)
    info = pc.inspect(path)
    assert summary["preamble"]["magic"] == b"PYCAUSET" and summary["active_slot"] == "B"
    for peer_slot, ours in zip((summary["slot_a"], summary["slot_b"]), info["slots"]):
        assert peer_slot.valid and ours["valid"] and peer_slot.crc_ok
        assert peer_slot.generation == ours["generation"]
        assert peer_slot.metadata_offset == ours["metadata_offset"]
        assert peer_slot.payload_length == ours["payload_length"]
    meta = persistence.read_typed_metadata(path)      # the peer decodes our layout too
    assert [e["name"] for e in meta["payload_layout"]["params"]["arrays"]] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="Unknown matrix type"):
        peer.load(str(path))                          # and refuses to load it as a matrix


# ---- the metadata codec, byte for byte -----------------------------------------------------------

values = st.recursive(
    st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=6) | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=12)


@settings(max_examples=100)
@given(st.dictionaries(st.text(max_size=5), values, max_size=4))
def test_codec_matches_peer(meta):
    ours = _codec.encode_metadata(meta)
    assert ours == persistence._encode_metadata_top_map(meta)
    assert persistence._decode_metadata_top_map(ours) == _codec.decode_metadata(ours)
