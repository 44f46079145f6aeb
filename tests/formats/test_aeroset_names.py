"""AEROSETs sharing a folder: each set's index and parts are named after it, so saving one never
breaks another; a save that would overwrite a file another set lists is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

import snapops
from snapops.formats.aero import aeroset
from snapops.formats.errors import DataError


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def test_two_sets_in_one_folder_keep_their_own_parts(tmp_path):
    a, b = tmp_path / "a.aeroset.json", tmp_path / "b.aeroset.json"
    snapops.save({"w": np.zeros(3, np.float32)}, a)
    snapops.save({"w": np.ones(5, np.float32)}, b)
    assert snapops.load(a)["w"].tolist() == [0.0] * 3
    assert snapops.load(b)["w"].tolist() == [1.0] * 5
    assert snapops.verify(a).ok and snapops.verify(b).ok
    assert _files(tmp_path) == ["a.aeroset.json", "a.index.aero", "a.part-000.aero",
                                "b.aeroset.json", "b.index.aero", "b.part-000.aero"]
    doc = json.loads(a.read_text())
    assert doc["global_tidx"]["path"] == "a.index.aero"
    assert [p["path"] for p in doc["parts"]] == ["a.part-000.aero"]


def test_many_parts_are_numbered_after_the_set(tmp_path):
    state = {f"layer.{i}": np.full(16, i, np.float32) for i in range(6)}
    path = tmp_path / "run.aeroset.json"
    aeroset.save(state, path, shard_max=64, part_shards=1)
    parts = [p["path"] for p in json.loads(path.read_text())["parts"]]
    assert parts == [f"run.part-{i:03d}.aero" for i in range(len(parts))] and len(parts) >= 3
    snapops.save({"w": np.ones(2, np.float32)}, tmp_path / "other.aeroset.json")
    assert all(np.array_equal(snapops.load(path)[k], v) for k, v in state.items())


def test_a_set_of_the_old_names_still_loads_and_is_never_overwritten(tmp_path):
    """A set saved before parts were named after it lists index.aero and part-000.aero, as a
    default ``model.aeroset.json`` does."""
    snapops.save({"w": np.zeros(3, np.float32)}, tmp_path / "model.aeroset.json")
    (tmp_path / "model.aeroset.json").rename(tmp_path / "old.aeroset.json")
    old = tmp_path / "old.aeroset.json"
    assert json.loads(old.read_text())["global_tidx"]["path"] == "index.aero"
    snapops.save({"w": np.ones(5, np.float32)}, tmp_path / "new.aeroset.json")
    with pytest.raises(DataError, match=r"index\.aero: listed by the AEROSET old\.aeroset\.json "
                                        r"in the same folder; expected a file of this set only"):
        snapops.save({"w": np.ones(4, np.float32)}, tmp_path / "model.aeroset.json")
    assert snapops.load(old)["w"].tolist() == [0.0] * 3 and snapops.verify(old).ok
    assert snapops.load(tmp_path / "new.aeroset.json")["w"].tolist() == [1.0] * 5


def test_a_name_the_reader_would_refuse_is_refused_at_save(tmp_path):
    with pytest.raises(DataError, match=r"AEROSET name 'a\\\\b\.aeroset\.json': expected a name "
                                        r"without a backslash"):
        snapops.save({"w": np.zeros(3, np.float32)}, tmp_path / "a\\b.aeroset.json")
    assert _files(tmp_path) == []
