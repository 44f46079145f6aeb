"""Pieces of global arrays from several ranks: one sealed generation, layout refusals, statistics
combined from per-rank partials, and slices for a new world size (no processes here)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from snapops import Shard
from snapops.formats.errors import DataError
from snapops.formats.generation import array_stats
from snapops.formats.generation.load import (
    load_from_source, rank_shards, rank_slice, rank_view, row_range,
)
from snapops.formats.generation.plan import LayoutError
from snapops.formats.generation.source import FolderSource
from snapops.formats.generation.stats import combine, finish, partial_stats
from snapops.formats.generation.verify import GenerationOptions, verify_generation
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_parts

TS = "2026-01-02T03:04:05Z"


def global_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    emb = rng.standard_normal((10, 6)).astype(np.float32)
    emb[1, 2], emb[7, 0] = np.nan, -np.inf
    return {"emb": emb, "proj": rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16),
            "ids": rng.integers(-5, 5, 9, dtype=np.int64), "step": np.array(12, np.int64)}


def split(state: dict[str, np.ndarray]) -> dict[int, dict[str, Shard]]:
    """emb by rows over 3 ranks, proj by columns over ranks 0 and 2, ids and step whole."""
    ranks: dict[int, dict[str, Shard]] = {0: {}, 1: {}, 2: {}}
    for rank in range(3):
        ranks[rank]["emb"] = rank_slice(state["emb"], rank, 3)
    proj = state["proj"]
    ranks[0]["proj"] = Shard(proj[:, :5], global_shape=proj.shape, offsets=(0, 0))
    ranks[2]["proj"] = Shard(proj[:, 5:], global_shape=proj.shape, offsets=(0, 5))
    ranks[1]["ids"] = Shard(state["ids"], global_shape=(9,), offsets=(0,))
    ranks[2]["step"] = Shard(state["step"], global_shape=(), offsets=())
    return ranks


def spec(**extra) -> GenerationSpec:
    return GenerationSpec(run="r", format=extra.pop("fmt", "wtxt"), shard_max=96, build="b",
                          **extra)


@pytest.mark.parametrize("fmt", ["wtxt", "aero"])
def test_ranks_pieces_make_one_sealed_generation_restored_bit_exact(tmp_path, fmt):
    state = global_state()
    written = write_parts(tmp_path, spec(fmt=fmt), 1, TS, split(state), world=3)
    seal_in_ledger(tmp_path, "r", written)
    assert written.manifest.header.world == 3
    report = verify_generation(FolderSource(tmp_path), "r", GenerationOptions(expect_prev=None))
    assert report.ok, report.failure
    snap = load_from_source(FolderSource(tmp_path), "r")
    for name, array in state.items():
        assert snap[name].dtype == array.dtype and snap[name].tobytes() == array.tobytes(), name
    records = {a.name: a for a in written.manifest.arrays}
    assert {p.rank for p in records["emb"].parts} == {0, 1, 2}
    assert [(p.box, p.rank) for p in records["proj"].parts] == \
        [(((0, 4), (0, 5)), 0), (((0, 4), (5, 8)), 2)]
    assert all(p.shard.startswith(f"shards/r000{p.rank}/") for a in records.values()
               for p in a.parts)
    for name in ("ids", "step"):  # integers: combining partials is exact
        assert records[name].stats == array_stats(state[name])
    emb, whole = records["emb"].stats, array_stats(state["emb"])
    assert (emb.nan, emb.inf, emb.min, emb.max) == (whole.nan, whole.inf, whole.min, whole.max)
    assert math.isclose(emb.norm, whole.norm, rel_tol=1e-12)
    assert math.isclose(emb.mean, whole.mean, rel_tol=1e-9)


def test_partials_combine_sums_not_means():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([10.0])
    stats = finish(combine([partial_stats(a), partial_stats(b)]))
    assert stats.mean == 4.0 and stats.norm == math.sqrt(114.0)   # not (2 + 10) / 2
    assert combine([partial_stats(a), partial_stats(np.zeros(2, np.complex64))]) is None


@pytest.mark.parametrize("change, message", [
    (lambda r: r[1].update(emb=Shard(r[1]["emb"].local, global_shape=(10, 6), offsets=(3, 0))),
     r"array emb: the boxes of ranks 0 \(0:4,0:6\) and 1 \(3:7,0:6\) overlap"),
    (lambda r: r[1].pop("emb"), r"array emb: the boxes of ranks \[0, 2\] cover 36 of its 60"),
    (lambda r: r[2].update(proj=Shard(np.zeros((4, 3), np.float32), global_shape=(4, 8),
                                      offsets=(0, 5))),
     r"array proj: rank 2 declares f32 \[4, 8\] but rank 0 bf16 \[4, 8\]"),
    (lambda r: r[2].update(proj=Shard(r[2]["proj"].local, global_shape=(5, 8),
                                      offsets=(0, 5))),
     r"array proj: rank 2 declares bf16 \[5, 8\] but rank 0 bf16 \[4, 8\]"),
    (lambda r: r[0].update(step=Shard(np.array(1, np.int64), global_shape=(), offsets=())),
     r"array step: ranks \[0, 2\] all hold this 0-d array"),
    (lambda r: r[0].update(ids=np.arange(9)),
     r"array ids: the boxes of ranks 0 \(0:9\) and 1 \(0:9\) overlap"),
])
def test_layouts_that_do_not_tile_are_refused_naming_ranks(tmp_path, change, message):
    ranks = split(global_state())
    change(ranks)
    ranks = {r: {n: v if isinstance(v, Shard) else Shard(v, global_shape=v.shape,
                                                            offsets=(0,) * v.ndim)
                 for n, v in pieces.items()} for r, pieces in ranks.items()}
    with pytest.raises(LayoutError, match=message):
        write_parts(tmp_path, spec(), 1, TS, ranks, world=3)
    assert not (tmp_path / "snapshots").exists()   # nothing written


@pytest.mark.parametrize("kwargs, message", [
    ({"global_shape": (4,), "offsets": (0, 0)}, "same number of dimensions"),
    ({"global_shape": (4, 2), "offsets": (3, 0)}, "does not fit"),
    ({"global_shape": (4, -2), "offsets": (0, 0)}, "integers >= 0"),
    ({"global_shape": "ab", "offsets": (0, 0)}, "sequence of integers"),
])
def test_shard_checks_its_box(kwargs, message):
    with pytest.raises(DataError, match=message):
        Shard(np.zeros((2, 2)), **kwargs)


def test_row_split_rule_and_resharding_to_other_world_sizes(tmp_path):
    assert [row_range(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [row_range(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    with pytest.raises(DataError, match="rank 4 is not in 0..3"):
        row_range(10, 4, 4)
    state = global_state()
    view = rank_view(state, 1, 2)
    assert np.array_equal(view["emb"], state["emb"][5:]) and view["step"] == 12
    for world in (1, 2, 4):   # a state requested again at another world size tiles exactly
        ranks = {r: rank_shards(state, r, world) for r in range(world)}
        assert sum("step" in pieces for pieces in ranks.values()) == 1
        folder = tmp_path / f"w{world}"
        seal_in_ledger(folder, "r", write_parts(folder, spec(), 1, TS, ranks, world=world))
        snap = load_from_source(FolderSource(folder), "r")
        assert all(snap[n].tobytes() == a.tobytes() for n, a in state.items())
