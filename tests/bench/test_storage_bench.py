"""``snapops bench storage`` end to end at a small size: the JSON the issue asks for, the
stores doing what the numbers claim (the git store's sparse shards go as deltas in the
daemon's packs, the LFS store's residuals are smaller than keyframes), and the folders kept
with --workdir."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from snapops.cli import main


@pytest.mark.slow
def test_storage_bench_reports_both_stores_from_a_real_daemon(tmp_path, capsys):
    workdir = tmp_path / "kept"
    assert main(["bench", "storage", "--size", "8MiB", "--gens", "3", "--regime", "sparse_f32",
                 "--regime", "dense_f32", "--store", "git", "--store", "lfs",
                 "--keyframe-every", "2", "--workdir", str(workdir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["gens"] == 3 and result["keyframe_every"] == 2
    runs = {(r["store"], r["regime"]): r for r in result["runs"]}
    assert set(runs) == {(s, g) for s in ("git", "lfs") for g in ("sparse_f32", "dense_f32")}
    for run in runs.values():
        assert {"stored_bytes", "stored_ratio_per_gen", "request_to_pushed_s", "clone_s",
                "restore_MBps", "paths"} <= set(run)
        assert run["request_to_pushed_s"]["median"] <= run["request_to_pushed_s"]["max"]
        assert run["restore_MBps"] > 0 and all(Path(p).exists() for p in run["paths"])
        if run["store"] == "lfs":   # a throw-away cache and a kept one, both measured
            assert run["restore_kept_cache_MBps"] > 0 and run["restore_cold_MBps"] > 0
            # keyframe_every 2: gens 2 and 3 each apply one residual per shard; the newest
            # such is restored from its tag as the longest chain
            assert run["restore_longest_chain_gen"] == 3
            assert run["restore_longest_chain_residuals"] >= 1
            assert run["restore_longest_chain_MBps"] > 0
    # LFS: a dense residual (an AdamW-like step) is well below a keyframe, sparse far below
    assert runs[("lfs", "dense_f32")]["stored_ratio_per_gen"] < 0.8
    assert runs[("lfs", "sparse_f32")]["stored_ratio_per_gen"] < 0.1
    # git: the sparse generations went to the remote as deltas of the previous ones
    folder = Path(runs[("git", "sparse_f32")]["paths"][0]).parent
    log = (folder / "daemon.log").read_text()
    assert re.search(r"gen 2: \d+ shard\(s\) packed, [1-9]\d* of them as deltas", log), \
        log[-2000:]
    assert re.search(r"gen 3: \d+ shard\(s\) packed, [1-9]\d* of them as deltas", log), \
        log[-2000:]
