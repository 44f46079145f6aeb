"""FOLD interop with the real peer, PyPI ``pyfolds==1.0.2`` (and ``torch``), both directions.

pyfolds 1.0.2's multi-block ECC is broken (docs/formats/fold.md), so ECC cases use chunks of at
most 255-N bytes, and one test checks how snapops treats the peer's broken multi-block region.
"""

from __future__ import annotations

import importlib.machinery
import io
import sys

import numpy as np
import pytest

from snapops.formats import fold
from snapops.formats.errors import FormatError
from snapops.formats.dtypes import numpy_dtype
from snapops.formats.model import Snapshot



def load_with(path, **options):
    """FOLD's own reader with reader options (use_mmap, workers, trusted)."""
    with fold.FoldFile.open(path, **options) as f:
        return f.load()


def _import_peer():
    """pyfolds 1.0.2 probes optional modules with ``importlib.util.find_spec``, which raises
    ValueError for an imported module whose ``__spec__`` is None, as cryptography 50's
    ``serialization`` package is once anything (snapops' keys) has imported it. Lend it a spec
    for the probe; pyfolds uses that module only for signatures, which these tests do not."""
    name = "cryptography.hazmat.primitives.serialization"
    module = sys.modules.get(name)
    lend = module is not None and module.__spec__ is None
    if lend:
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    try:
        return importlib.import_module("pyfolds.serialization.foldio")
    finally:
        if lend:
            module.__spec__ = None


import torch  # noqa: E402  (pinned 2.13.0 CPU; installed by .ci/setup)
foldio = _import_peer()
peer_ecc = importlib.import_module("pyfolds.serialization.ecc")

# pyfolds hands bytearrays to google-crc32c, which wants bytes, and falls back with a warning
pytestmark = pytest.mark.filterwarnings("ignore:google-crc32c:RuntimeWarning")


def small_state() -> dict[str, np.ndarray]:
    return {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5),
            "flag": np.array(True), "ai_vectors": np.eye(3, dtype=np.float16)}


def peer_read_all(path) -> dict[str, bytes]:
    with foldio.FoldReader(str(path), use_mmap=True) as reader:
        return {name: reader.read_chunk_bytes(name, verify=True)
                for name in reader.list_chunks()}


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("ecc", ["none", "rs(32)", "rs(16)"])
def test_peer_reads_and_validates_our_files(tmp_path, compression, ecc):
    path = tmp_path / "ours.mind"
    snap = small_state()
    # non-ASCII metadata: the peer re-derives manifest_hash and warns (an error here) on mismatch
    fold.save(Snapshot(snap, {"nota": "ção", "gen": 3}), path, compression=compression, ecc=ecc)
    chunks = peer_read_all(path)
    index = fold.inspect(path)
    for row in index["arrays"]:
        raw = b"".join(chunks[c] for c in row["chunks"])
        got = np.frombuffer(raw, numpy_dtype(row["dtype"])).reshape(row["shape"])
        assert np.array_equal(got, snap[row["name"]])
    assert foldio.is_mind(str(path))
    peek = foldio.peek_fold_or_mind(str(path))
    assert peek["is_mind"] and sorted(peek["chunks"]) == sorted(snap)


def test_peer_reads_our_multi_piece_arrays(tmp_path):
    path = tmp_path / "big.fold"
    w = np.random.default_rng(0).standard_normal(5000)
    fold.save({"w": w}, path, segment=4096)
    chunks = peer_read_all(path)
    assert len(chunks) == 10
    raw = b"".join(chunks[c] for c in fold.inspect(path)["arrays"][0]["chunks"])
    assert np.array_equal(np.frombuffer(raw, "<f8"), w)


def test_peer_corrects_our_single_block_ecc(tmp_path):
    path = tmp_path / "e.fold"
    fold.save({"x": np.arange(20, dtype=np.int32)}, path, ecc="rs(32)", compression="none")
    data = bytearray(path.read_bytes())
    data[28 + 32 + 3] ^= 0xFF          # one payload byte of the only chunk
    path.write_bytes(bytes(data))
    assert np.array_equal(np.frombuffer(peer_read_all(path)["x"], "<i4"), np.arange(20))
    report = fold.verify(path)
    assert report.ok and report.details["ecc"][0]["corrected_data_bytes"] == 1


def _torch_blob(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save({"state_dict": state, "config": {"n": 3}, "mode": "online", "step_id": 7}, buf)
    return buf.getvalue()


def write_peer(path, *, ecc=None, compress="zstd", state=None, extra=()):
    state = state or {"lin.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                      "lin.bias": torch.zeros(2, dtype=torch.float64),
                      "steps": torch.tensor(5, dtype=torch.int64)}
    npz = io.BytesIO()
    np.savez_compressed(npz, N=np.arange(4.0), W=np.ones((2, 2), np.float32))
    with foldio.FoldWriter(str(path), compress=compress, ecc=ecc) as writer:
        writer.add_chunk("torch_state", "TSAV", _torch_blob(state))
        writer.add_chunk("llm_manifest", "JSON", b'{"format":"fold","model_type":"Tiny"}')
        writer.add_chunk("nuclear_arrays", "NPZ0", npz.getvalue())
        for name, ctype, payload in extra:
            writer.add_chunk(name, ctype, payload)
        writer.finalize(metadata={"model_type": "Tiny", "tags": {}, "protection": "off"})
    return state


@pytest.mark.parametrize("compress", ["zstd", "none"])
def test_we_read_peer_files(tmp_path, compress):
    path = tmp_path / "peer.fold"
    state = write_peer(path, compress=compress)
    snap = fold.load(path)
    assert sorted(snap.arrays) == ["lin.bias", "lin.weight", "nuclear_arrays/N",
                                   "nuclear_arrays/W", "steps"]
    for key, tensor in state.items():
        assert np.array_equal(snap[key], tensor.numpy()) and snap[key].dtype == tensor.numpy().dtype
    assert np.array_equal(snap["nuclear_arrays/W"], np.ones((2, 2), np.float32))
    assert snap.meta["fold.torch_state.step_id"] == 7
    assert snap.meta["fold.model_type"] == "Tiny"
    report = fold.verify(path)
    assert report.ok, report.summary()
    assert fold.inspect(path)["kind"] == "fold"
    with fold.FoldFile.open(path) as f:
        assert f.read_chunk("llm_manifest") == b'{"format":"fold","model_type":"Tiny"}'
        assert np.array_equal(f["lin.weight"], state["lin.weight"].numpy())


def test_peer_single_block_ecc_is_checked_and_corrected(tmp_path):
    path = tmp_path / "ecc.mind"
    vectors = b'{"v":[1,2,3]}'
    write_peer(path, compress="none", ecc=peer_ecc.ReedSolomonECC(32),
               extra=[("ai_vectors", "JSON", vectors)])
    info = fold.inspect(path)
    assert info["kind"] == "mind"
    entry = next(c for c in info["chunks"] if c["name"] == "ai_vectors")
    assert entry["ecc_algo"] == "rs(32)" and entry["ecc_len"] == 32
    data = bytearray(path.read_bytes())
    data[entry["offset"] + 32 + 2] ^= 0x41
    path.write_bytes(bytes(data))
    report = fold.verify(path)
    assert report.ok
    fixed = [e for e in report.details["ecc"] if e["chunk"] == "ai_vectors"]
    assert fixed[0]["corrected_data_bytes"] == 1
    with fold.FoldFile.open(path) as f:
        assert f.read_chunk("ai_vectors") == vectors


def test_peer_multi_block_ecc_region_is_reported_unusable(tmp_path):
    path = tmp_path / "broken-ecc.fold"
    state = write_peer(path, ecc=peer_ecc.ReedSolomonECC(32),
                       state={"w": torch.randn(64, 64)})
    snap = fold.load(path)                   # data intact: accepted on CRC32C + SHA-256
    assert np.array_equal(snap["w"], state["w"].numpy())
    report = fold.verify(path)
    assert report.ok
    assert any(e["chunk"] == "torch_state" and e["ecc_unusable"]
               for e in report.details["ecc"])
    assert any("unusable" in n for n in report.notes)


def test_torch_payloads_need_weights_only_unless_trusted(tmp_path):
    path = tmp_path / "evil.fold"
    buf = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(2)}, "cfg": Snapshot()}, buf)  # a custom class
    with foldio.FoldWriter(str(path)) as writer:
        writer.add_chunk("torch_state", "TSAV", buf.getvalue())
        writer.finalize(metadata={})
    with pytest.raises(FormatError,
                       match=r"\[torch_load\] chunk 0: chunk 'torch_state'") as err:
        fold.load(path)
    assert err.value.check == "torch_load"
    assert np.array_equal(load_with(path, trusted=True)["w"], np.ones(2, np.float32))


def test_bf16_and_float8_tensors_load_as_ml_dtypes(tmp_path):
    import ml_dtypes

    path = tmp_path / "bf16.fold"
    w = torch.randn(3, 2).to(torch.bfloat16)
    f8 = torch.randn(4).to(torch.float8_e4m3fn)
    write_peer(path, state={"w": w, "f8": f8, "c": torch.ones(2, dtype=torch.complex64)})
    snap = fold.load(path)
    assert snap["w"].dtype == ml_dtypes.bfloat16 and snap["f8"].dtype == ml_dtypes.float8_e4m3fn
    assert snap["w"].view(np.int16).tobytes() == w.view(torch.int16).numpy().tobytes()
    assert snap["f8"].view(np.uint8).tobytes() == f8.view(torch.uint8).numpy().tobytes()
    again = fold.loads(fold.dumps(snap))     # and they survive a snapops round trip
    assert again.equal(snap)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")
def test_tensors_without_numpy_form_are_refused_clearly(tmp_path):
    path = tmp_path / "q.fold"
    write_peer(path, state={"q": torch.ones(2, dtype=torch.complex32)})
    with pytest.raises(FormatError, match="numpy"):
        fold.load(path)


def test_round_trip_through_the_peer(tmp_path):
    """snapops -> pyfolds reads the raw chunks -> pyfolds writes them again -> snapops loads."""
    ours = tmp_path / "a.fold"
    snap = Snapshot(small_state(), {"gen": 2})
    fold.save(snap, ours)
    chunks = peer_read_all(ours)
    index = fold.inspect(ours)
    with foldio.FoldReader(str(ours)) as reader:
        table = reader.index["metadata"]["snapops"]
    again = tmp_path / "b.fold"
    with foldio.FoldWriter(str(again)) as writer:
        for entry in index["chunks"]:
            writer.add_chunk(entry["name"], entry["ctype"], chunks[entry["name"]])
        writer.finalize(metadata={"snapops": table})
    assert fold.load(again).equal(snap)
