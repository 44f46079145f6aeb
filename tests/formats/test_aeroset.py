"""AEROSET: parts + index.aero + model.aeroset.json, written, read, verified, attacked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from snapops.formats import aero, registry
from snapops.formats.aero import aeroset
from snapops.formats.errors import FormatError, UnsupportedVersionError
from snapops.formats.model import Snapshot
from tests.formats.test_aero import every_dtype_state, owner


def write_set(tmp_path: Path, **opts) -> Path:
    state = every_dtype_state() | {f"layer.{i}": np.full(50, i, np.float32) for i in range(8)}
    opts = {"shard_max": 256, "part_shards": 2, **opts}
    aeroset.save(Snapshot(state, {"model_name": "tiny", "gen": 1}), tmp_path / "set", **opts)
    return tmp_path / "set" / "model.aeroset.json"


def test_round_trip_over_several_parts(tmp_path):
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    assert doc["format"] == {"name": "AEROSET", "version": [0, 1]}
    assert doc["model"] == {"name": "tiny", "architecture": ""}
    assert len(doc["parts"]) >= 3 and doc["global_tidx"]["path"] == "index.aero"
    folder = index.parent
    for part in doc["parts"] + [doc["global_tidx"]]:
        blob = (folder / part["path"]).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == part["sha256"]
        assert len(blob) == part["size_bytes"]
    shards = [s for p in doc["parts"] for s in p["shards"]]
    assert shards == list(range(len(shards)))
    back = aeroset.load(index)
    state = every_dtype_state() | {f"layer.{i}": np.full(50, i, np.float32) for i in range(8)}
    assert Snapshot(state).equal(back)
    assert back.meta == {"model_name": "tiny", "gen": 1}
    assert owner(back["layer.3"]).__class__.__name__ == "mmap"


def test_parts_are_standalone_aero_with_global_shard_ids(tmp_path):
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    part = doc["parts"][1]
    info = aero.inspect(index.parent / part["path"])
    wtsh = sorted(c["name"] for c in info["chunks"] if c["fourcc"] == "WTSH")
    assert wtsh == sorted(f"weights.shard{s}" for s in part["shards"])
    assert aero.verify(index.parent / part["path"]).ok
    idx = index.parent / "index.aero"
    assert aero.verify(idx).ok and aero.inspect(idx)["index_only"]
    with pytest.raises(FormatError, match="index-only"):
        aero.load(idx)
    with aero.open_lazy(idx) as f:
        assert len(f.names) == 24


def test_verify_levels_and_detection(tmp_path):
    index = write_set(tmp_path)
    for level in ("control", "full"):
        report = aeroset.verify(index, level=level)
        assert report.ok, report.failure
    assert report.arrays == 24
    handler = registry.detect(index)
    assert handler.name == "aeroset" and handler.load(index).equal(aeroset.load(index))
    assert registry.handler_for_suffix(index).name == "aeroset"
    assert len(aeroset.inspect(index)["arrays"]) == 24


def test_tampered_part_fails_sha256(tmp_path):
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    part = index.parent / doc["parts"][0]["path"]
    blob = bytearray(part.read_bytes())
    blob[-1] ^= 1
    part.write_bytes(bytes(blob))
    assert aeroset.verify(index, level="full").failure.check == "sha256"
    report = aeroset.verify(index, level="control")    # no sha256 at this level; TIDX hash breaks
    assert not report.ok


def test_part_disagreeing_with_index(tmp_path):
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    doc["parts"][0]["shards"], doc["parts"][1]["shards"] = (doc["parts"][1]["shards"],
                                                            doc["parts"][0]["shards"])
    index.write_text(json.dumps(doc))
    report = aeroset.verify(index, level="control")
    assert report.failure.check == "aeroset"
    with pytest.raises(FormatError, match=r"\[aeroset\] part holds other shards than"):
        aeroset.load(index)


@pytest.mark.parametrize("path", ["../evil.aero", "/etc/passwd", "a/../../x.aero",
                                  "https://example.invalid/p.aero", "", 7])
def test_part_paths_must_stay_in_the_folder(tmp_path, path):
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    doc["parts"][0]["path"] = path
    index.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"\[(grammar|version)\]"):
        aeroset.load(index)
    assert not aeroset.verify(index).ok


@pytest.mark.parametrize("mutate, error", [
    (lambda d: d.update(format={"name": "AEROSET", "version": [9, 0]}), UnsupportedVersionError),
    (lambda d: d.update(format={"name": "OTHER", "version": [0, 1]}), FormatError),
    (lambda d: d.pop("parts"), FormatError),
    (lambda d: d["parts"][0].update(sha256="XYZ"), FormatError),
    (lambda d: d["parts"][0].update(size_bytes=-1), FormatError),
    (lambda d: d["parts"][1].update(shards=d["parts"][0]["shards"]), FormatError),
    (lambda d: d["parts"].pop(), FormatError),
])
def test_malformed_index_json(tmp_path, mutate, error):
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    mutate(doc)
    index.write_text(json.dumps(doc))
    with pytest.raises(error, match=r"\[(grammar|tidx_bounds|version)\]"):
        aeroset.load(index)


@pytest.mark.parametrize("blob", [b"", b"{", b"[]", b'{"format": NaN}', b"\xff\xfe",
                                  b"[" * 50000, b'{"format": {"name": "AEROSET"}}'])
def test_garbage_index_json(tmp_path, blob):
    (tmp_path / "model.aeroset.json").write_bytes(blob)
    with pytest.raises(FormatError, match=r"\[(grammar|version)\]"):
        aeroset.load(tmp_path / "model.aeroset.json")
    assert not aeroset.verify(tmp_path).ok


@pytest.mark.parametrize("which", ["part", "index"])
def test_a_member_that_is_a_symlink_is_not_followed(tmp_path, which):
    """A set checked out of a tree someone else wrote: a member replaced by a symlink to a
    file elsewhere (here a byte-identical copy, so size and digest would pass) is refused
    by verify and load alike, and nothing is read through it."""
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    rel = doc["parts"][1]["path"] if which == "part" else doc["global_tidx"]["path"]
    member = index.parent / rel
    elsewhere = tmp_path / "elsewhere.aero"
    elsewhere.write_bytes(member.read_bytes())
    member.unlink()
    member.symlink_to(elsewhere)
    report = aeroset.verify(index, level="full")
    assert report.failure.check == "aeroset" and "symlink" in str(report.failure)
    with pytest.raises(FormatError, match=r"\[aeroset\] a member of the set is a symlink "
                                          r"\(not followed\)"):
        aeroset.load(index)


@pytest.mark.parametrize("which", ["part", "index"])
def test_a_member_name_too_long_for_the_file_system_is_a_typed_error(tmp_path, which):
    """Fuzz seed 2701, aeroset case 966: a JSON naming ``part-999...9.aero`` (400 digits, a
    name the pattern allows) made the symlink check raise a bare OSError (ENAMETOOLONG)."""
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    entry = doc["parts"][1] if which == "part" else doc["global_tidx"]
    entry["path"] = "part-" + "9" * 400 + ".aero"
    index.write_text(json.dumps(doc))
    report = aeroset.verify(index, level="full")
    assert not report.ok and report.failure.check == "aeroset"
    assert "cannot read: File name too long" in str(report.failure)
    with pytest.raises(FormatError, match=r"\[aeroset\] cannot read: File name too long"):
        aeroset.load(index)


def test_missing_part(tmp_path):
    index = write_set(tmp_path)
    doc = json.loads(index.read_text())
    (index.parent / doc["parts"][-1]["path"]).unlink()
    assert aeroset.verify(index).failure.check == "aeroset"
    with pytest.raises(FormatError, match=r"\[io\] cannot read: No such file"):
        aeroset.load(index)


def test_reads_reference_layout_with_per_part_shard_numbers(tmp_path):
    """The reference writer restarts shard numbers at 0 in every part; its index.aero has only
    MMSG and TIDX. Such a set opens, and verifies."""
    import hashlib
    import msgpack
    from tests.formats import aero_build as B
    groups = [{"a": np.arange(4, dtype=np.float32)}, {"b": np.arange(6, dtype=np.int8),
                                                      "c": np.ones(2, np.float32)}]
    parts, entries = [], []
    for pid, arrays in enumerate(groups):
        blob = B.reference_style(arrays, shard_id=0)
        name = f"part-{pid:03d}.aero"
        (tmp_path / name).write_bytes(blob)
        parts.append({"path": name, "sha256": hashlib.sha256(blob).hexdigest(),
                      "size_bytes": len(blob), "shards": [pid]})
        off = 0
        for n, a in arrays.items():
            code = {"float32": 1, "int8": 4}[a.dtype.name]
            entries.append(B.entry(name=n, dtype=code, shape=a.shape, shard_id=pid,
                                   data_off=off, data_len=a.nbytes))
            off += a.nbytes
    manifest = {"format": {"name": "AERO", "version": [0, 1]},
                "model": {"name": "ref", "architecture": "mlp"},
                "chunks": [{"role": "manifest", "fourcc": "MMSG", "toc_index": 0},
                           {"role": "tensors", "fourcc": "TIDX", "toc_index": 1}], "shards": []}
    index = B.build([B.Raw(b"MMSG", "manifest", msgpack.packb(manifest), compress=True),
                     B.tidx(entries)])
    (tmp_path / "index.aero").write_bytes(index)
    doc = {"format": {"name": "AEROSET", "version": [0, 1]},
           "model": {"name": "ref", "architecture": "mlp"}, "parts": parts,
           "global_tidx": {"path": "index.aero", "sha256": hashlib.sha256(index).hexdigest(),
                           "size_bytes": len(index)}}
    (tmp_path / "model.aeroset.json").write_text(json.dumps(doc, indent=2))
    back = aeroset.load(tmp_path)
    assert Snapshot(groups[0] | groups[1]).equal(back)
    report = aeroset.verify(tmp_path)
    assert report.ok, report.failure
