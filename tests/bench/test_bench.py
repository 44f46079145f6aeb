"""``snapops bench``: every suite runs at a tiny size and reports what it promises; suites live
under snapops/bench and the lower packages import nothing from snapops.bench or snapops.cli.
(Numbers are never asserted: speed is measured by ``snapops bench``, not by tests.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from snapops.bench._measure import measure, model_state, run_rounds
from snapops.cli import main
from snapops.cli.bench import SUITES

from tests.conftest import REPO


def _bench(capsys, *argv: str) -> dict:
    assert main(["bench", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_wtxt_suite_reports_every_operation_against_one_sha256_pass(tmp_path, capsys):
    r = _bench(capsys, "wtxt", "--size", "1MiB", "--rounds", "1", "--workdir", str(tmp_path))
    ops = r["operations"]
    assert set(ops) == {"sha256", "encode_plain", "encode_sealed", "verify", "verify_keyed",
                        "load", "disk"}
    assert ops["sha256"]["ratio_to_sha256"] == pytest.approx(1.0)
    for op in ops.values():
        assert op["MBps"] > 0 and op["cpu_seconds"] >= 0 and len(op["all_MBps"]) == 1
    assert ops["encode_sealed"]["target_ratio"] == 0.25
    assert r["file_bytes"]["sealed"] > r["raw_bytes"]
    assert ops["disk"]["target_ratio"] is None
    for name in ("encode_plain", "encode_sealed", "verify_keyed"):   # issue 16: < 64 MiB extra
        assert 0 <= ops[name]["peak_extra"] < 64 << 20 and "peak_rss_extra" in ops[name]
    assert list(tmp_path.iterdir()) == []


def test_wtxt_suite_saves_new_files_every_round(tmp_path, monkeypatch):
    """As the daemon does: no timed save replaces (and so frees) the file of the round before."""
    from snapops.bench import wtxt as bench_wtxt

    existed, real_save = [], bench_wtxt.wtxt.save

    def save(state, path, **options):
        existed.append(path.exists())
        return real_save(state, path, **options)

    monkeypatch.setattr(bench_wtxt.wtxt, "save", save)
    r = bench_wtxt.run_wtxt(64 << 10, workdir=str(tmp_path), rounds=2)
    assert existed == [False] * 6                   # plain and sealed, warm-up + 2 rounds
    assert r["file_bytes"]["plain"] > r["raw_bytes"] and set(r["file_bytes"]) == {"plain",
                                                                                   "sealed"}
    assert list(tmp_path.iterdir()) == []


def test_wtxt_suite_prints_a_table(tmp_path, capsys):
    assert main(["bench", "wtxt", "--size", "256KiB", "--rounds", "1", "--no-row-blocking",
                 "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "save, sealed (HMAC + sign)" in out and "x SHA" in out
    assert "row_blocking=False" in out


def test_formats_suite_runs_each_format(tmp_path, capsys):
    r = _bench(capsys, "formats", "--size", "1MiB", "--workdir", str(tmp_path))
    assert set(r) == {"machine", "aero", "fold", "pycauset", "finf"}
    assert r["aero"]["write_gbps"] > 0 and r["pycauset"]["update_ms"]["small"]["best"] > 0
    assert r["fold"]["write_MBps"] > 0 and r["fold"]["verify_rs32_MBps"] > 0
    assert r["finf"]["update_modes"] and r["finf"]["verify_gbps"] > 0
    assert list(tmp_path.iterdir()) == []


def test_machine_suite_measures_every_floor_and_leaves_nothing(tmp_path, capsys):
    r = _bench(capsys, "machine", "--size", "4MiB", "--rounds", "1", "--workdir", str(tmp_path))
    floors = {k for k in r if k.endswith("_MBps")}
    assert floors >= {"sha256_1core_MBps", "sha256_2threads_MBps", "blake3_1core_MBps",
                      "memory_copy_reused_MBps", "memory_first_touch_MBps",
                      "sha256_2blake3_2threads_MBps", "fresh_copy_sha256_2threads_MBps",
                      "disk_write_page_cache_fsync_MBps", "disk_read_uncached_MBps",
                      "disk_read_page_cache_MBps"}
    assert ("disk_write_o_direct_fsync_MBps" in floors) == r["o_direct"]
    assert r["size"] == 4 << 20 and all(r[k] > 0 for k in floors)
    assert list(tmp_path.iterdir()) == []
    assert main(["bench", "machine", "--size", "1", "--rounds", "1",
                 "--workdir", str(tmp_path)]) == 0        # rounded up to one 4 MiB block
    out = capsys.readouterr().out
    assert "4.0 MiB per operation" in out and "SHA-256, one core" in out and "ns/byte" in out


def test_restore_suite_restores_next_to_its_references(tmp_path, capsys):
    r = _bench(capsys, "restore", "--size", "1MiB", "--format", "aero", "--rounds", "1",
               "--workdir", str(tmp_path))
    assert set(r) == {"machine", "aero", "load_after"}
    g = r["aero"]
    assert g["raw_bytes"] >= 1 << 20 and g["shard_bytes"] > 0
    for name in ("restore", "restore_to_file", "restore_url", "cat_file", "copy_out", "sha256",
                 "memcpy"):
        assert g[f"{name}_mb_s"] > 0 and g[f"{name}_s"] >= 0
    assert g["restore_vs_sha256"] == round(g["restore_mb_s"] / g["sha256_mb_s"], 2)
    assert list(tmp_path.iterdir()) == []


def test_formats_suite_runs_only_the_named_format(tmp_path, capsys):
    assert main(["bench", "formats", "--size", "1MiB", "--format", "fold", "--workdir",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fold:" in out and "aero:" not in out and "write_MBps" in out


def test_a_missing_workdir_is_created_and_a_file_in_its_place_is_a_usage_error(tmp_path,
                                                                               capsys):
    made = tmp_path / "new" / "deeper"
    assert main(["bench", "formats", "--size", "64KiB", "--format", "fold", "--workdir",
                 str(made)]) == 0
    assert made.is_dir() and list(made.iterdir()) == []
    capsys.readouterr()
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(SystemExit, match="^2$"):
        main(["bench", "formats", "--workdir", str(tmp_path / "file" / "x")])
    err = capsys.readouterr().err
    assert "--workdir" in err and "cannot create the folder (Not a directory)" in err
    assert "Traceback" not in err


def test_seal_suite_reports_delta_armor_and_signatures(tmp_path, capsys):
    r = _bench(capsys, "seal", "--size", "300KB", "--workdir", str(tmp_path))
    assert r["armor"]["size_bytes"] == 300_000 and r["armor"]["armored_bytes"] > 400_000
    assert r["armor"]["encrypt_mb_s"] > 0 and 0 <= r["armor"]["peak_extra_bytes"] < 64 << 20
    assert {d["rows_changed"] for d in r["delta"]} == {0.01, 0.10}
    assert all(0 < d["delta_share"] < 1 for d in r["delta"])
    assert len(r["signature"]) == 2
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_review_suite_times_the_hooks_the_verifier_and_the_diff(tmp_path, capsys):
    r = _bench(capsys, "review", "--size", "1MiB", "--rounds", "1", "--workdir", str(tmp_path))
    gens, diff = r["generations"], r["diff"]
    for fmt in ("wtxt", "aero"):
        g = gens[fmt]
        assert g["raw_bytes"] >= 1 << 20 and g["files_bytes"] >= g["raw_bytes"]
        assert g["pre_receive_s"] > 0 and g["pre_receive_next_s"] > 0 and g["pre_commit_s"] > 0
        assert 0 < g["verify_mb_s"] and 0 < g["sha256_mb_s"] and 0 < g["hash_floor_mb_s"]
    assert set(diff["scenarios"]) == {"sparse", "dense", "dense_npz"}
    sparse, dense = diff["scenarios"]["sparse"], diff["scenarios"]["dense"]
    assert 0 < sparse["blocks_changed"] < dense["blocks_changed"] <= dense["blocks"]
    assert list(tmp_path.iterdir()) == []


def test_review_suite_from_manifests_alone(tmp_path, capsys):
    r = _bench(capsys, "review", "--manifest-only", "--tensors", "40", "--rounds", "1",
               "--workdir", str(tmp_path))["manifest"]
    assert r["tensors"] == 40 and r["anomalies"] == 1        # one tensor of 97 scaled x50
    assert 0 < r["parse_seconds"] and 0 < r["review_seconds"] < r["png_seconds"]
    assert r["cli_seconds"] > 0 and r["startup_seconds"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suite", [s.name for s in SUITES])
def test_every_suite_help_ends_with_an_example(suite):
    result = subprocess.run([sys.executable, "-m", "snapops", "bench", suite, "--help"],
                            capture_output=True, text=True, check=True)
    tail = result.stdout.split("example:")[1]
    assert f"snapops bench {suite}" in tail


def test_rounds_keep_measurements_after_the_warm_up_only():
    calls = []
    runs = run_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 2,
                      memory=False, after_round=lambda: calls.append("|"))
    assert calls == ["a", "b", "|"] * 3
    assert len(runs["a"]) == len(runs["b"]) == 2


def test_memory_peak_is_seen_by_the_sampler_process_even_when_freed_before_the_end():
    import time

    import numpy as np

    with measure() as m:
        held = np.ones(48 << 20, np.uint8)    # written: resident, anonymous
        time.sleep(0.2)                      # forty sampling periods
        del held
    assert m.result.peak_anon_extra >= 48 << 20 and m.result.peak_extra >= 48 << 20
    sampler = m._sampler
    assert sampler.returncode == 0           # it reported and ended; nothing left running
    with measure(memory=False) as quiet:
        pass
    assert quiet.result.peak_anon_extra == 0 and quiet._sampler is None


def test_peak_rss_is_the_kernels_high_water_mark_so_a_peak_between_samples_counts():
    import numpy as np

    with measure() as m:
        np.ones(48 << 20, np.uint8)          # resident and freed within a millisecond
    assert m.result.peak_extra >= 44 << 20   # the kernel's RSS counters are batched per CPU
    with measure() as after:                 # the mark was reset: the old peak is not counted
        pass
    assert after.result.peak_extra < 16 << 20


def test_one_state_generator_sizes_and_shapes():
    state = model_state(8 << 20)
    assert sum(a.nbytes for a in state.values()) == pytest.approx(8 << 20, rel=0.01)
    single = model_state(4 << 20, layers=1, vectors=False)
    assert list(single) == ["layer000_w"] and single["layer000_w"].shape == (1024, 1024)


def test_machine_busy_seconds_count_every_process_but_idle_wait_and_steal(tmp_path):
    import os

    from snapops.bench._measure import machine_busy_seconds

    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {3 * tick} {tick} {2 * tick} 999999 888888 {tick} {tick} 777777 0 0\n"
                    "cpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert machine_busy_seconds(stat) == pytest.approx(8.0)
    stat.write_text("intr 1 2 3 4 5 6 7 8\n")
    assert machine_busy_seconds(stat) is None
    stat.write_text("cpu  1 2 x\n")
    assert machine_busy_seconds(stat) is None
    assert machine_busy_seconds(tmp_path / "missing") is None
    assert machine_busy_seconds() > 0          # this machine's own /proc/stat


def test_multirank_floor_spreads_the_n_rank_cpu_over_the_cores():
    from snapops.bench.multirank import floor_ratio

    one = {"median_s": 1.0, "machine_cpu_median_s": 0.9}
    many = {"median_s": 3.0, "machine_cpu_median_s": 5.0}
    assert floor_ratio(many, one, 2) == pytest.approx(2.5)
    assert floor_ratio(many, one, 8) == pytest.approx(0.625)
    assert floor_ratio({"median_s": 3.0, "machine_cpu_median_s": None}, one, 2) is None


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_lower_packages_import_nothing_from_bench_or_cli():
    offenders = []
    for folder in ("formats", "hooks", "daemon", "config"):
        for path in sorted((REPO / folder).rglob("*.py")):
            bad = {n for n in _imports(path)
                   if n.startswith(("snapops.bench", "snapops.cli"))}
            if bad:
                offenders.append(f"{path.relative_to(REPO)}: {sorted(bad)}")
    assert offenders == []
    assert not list((REPO / "formats").rglob("bench.py"))
    assert not (REPO / "hooks" / "bench.py").exists()
    assert not (REPO / "hooks" / "review_bench.py").exists()
