"""Numeric options take only values in their range: anything else (nan, an infinity, 0 rounds,
a negative generation, a bench --size below one row or beyond this machine's memory) is one
argparse line naming the option and its range, exit 2, before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.formats.npz_bomb import write_bomb


def snapops_cli(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapops", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def refused(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    last = done.stderr.splitlines()[-1]
    assert message in last and "Traceback" not in done.stderr, done.stderr


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """80 MiB of zeros deflated to ~80 KB: over the 64 MiB floor, ~1000x expansion."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    write_bomb(path, blocks=5)
    return path


@pytest.mark.parametrize("ratio", ["nan", "inf", "-1", "0.5", "many"])
def test_max_expansion_outside_its_range_is_refused_not_a_disabled_guard(bomb, tmp_path,
                                                                         ratio):
    refused(snapops_cli("convert", bomb, "b.fold", "--max-expansion", ratio, cwd=tmp_path),
            f"argument --max-expansion: expected a finite number >= 1, got '{ratio}'")
    assert not (tmp_path / "b.fold").exists()


def test_the_bomb_is_still_refused_by_default(bomb, tmp_path):
    done = snapops_cli("convert", bomb, "b.fold", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "[limit] array w: expected at most 100x expansion" in done.stderr, done.stderr
    assert not (tmp_path / "b.fold").exists()


OUT_OF_RANGE = [
    (("bench", "wtxt", "--size", "0"), "--size: expected at least 4096 bytes"),
    (("bench", "wtxt", "--size", "1"), "--size: expected at least 4096 bytes"),
    (("bench", "seal", "--size", "4095"), "--size: expected at least 4096 bytes"),
    (("bench", "machine", "--size", "0"), "--size: expected at least 1 byte"),
    (("bench", "wtxt", "--size", "1MiB", "--rounds", "0"), "--rounds: expected an integer >= 1"),
    (("bench", "wtxt", "--size", "1MiB", "--rounds", "-1"), "--rounds: expected an integer >= 1"),
    (("bench", "wtxt", "--threads", "0"), "--threads: expected an integer in 1..1024"),
    (("bench", "restore", "--rounds", "0"), "--rounds: expected an integer >= 1"),
    (("bench", "machine", "--rounds", "x"), "--rounds: expected an integer >= 1"),
    (("bench", "review", "--rounds", "0"), "--rounds: expected an integer >= 1"),
    (("bench", "review", "--tensors", "0"), "--tensors: expected an integer in 1..1000000"),
    (("bench", "pipeline", "--steps", "9"), "--steps: expected an integer >= 10"),
    (("bench", "pipeline", "--nice", "20"), "--nice: expected an integer in 0..19"),
    (("bench", "pipeline", "--idle", "nan"), "--idle: expected a finite number in 0..86400"),
    (("bench", "pipeline", "--outage", "-1"), "--outage: expected a finite number in 0..86400"),
    (("bench", "pipeline", "--interval", "0"), "--interval: expected a finite number > 0"),
    (("bench", "multirank", "--ranks", "0"), "--ranks: expected an integer in 1..256"),
    (("bench", "storage", "--gens", "0"), "--gens: expected an integer >= 1"),
    (("bench", "storage", "--keyframe-every", "0"), "--keyframe-every: expected an integer >= 1"),
    (("restore", ".", "--run", "r", "--gen", "-1", "-o", "x.npz"),
     "--gen: expected a generation number in 0..999999999999999999"),
    (("request", "state.npz", "--gen", "1e3"), "--gen: expected a generation number in 0.."),
    (("lfs", "prune", ".", "--run", "r", "--keep-last", "0", "--local-storage", "."),
     "--keep-last: expected an integer >= 1"),
    (("lfs", "prune", ".", "--run", "r", "--keep-last", "1", "--keep-every", "-1",
      "--local-storage", "."), "--keep-every: expected an integer >= 0"),
]


@pytest.mark.parametrize("argv,message", OUT_OF_RANGE, ids=lambda a: " ".join(a[:4]))
def test_a_numeric_option_out_of_range_is_one_argparse_line(tmp_path, argv, message):
    refused(snapops_cli(*argv, cwd=tmp_path), f"error: argument {message}")
    assert list(tmp_path.iterdir()) == []


def test_a_bench_size_beyond_available_memory_is_refused_before_allocating(tmp_path):
    done = snapops_cli("bench", "wtxt", "--size", "99999TiB", "--workdir", tmp_path,
                       cwd=tmp_path)
    refused(done, "the bench holds --size in memory, more than this machine has available")
    assert list(tmp_path.iterdir()) == []


def test_multirank_counts_every_rank_against_the_memory(tmp_path):
    available = next(int(line.split()[1]) * 1024 for line in
                     Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemAvailable:"))
    each = available // 2                     # one rank would fit; four cannot
    refused(snapops_cli("bench", "multirank", "--size", each, "--ranks", "4", cwd=tmp_path),
            "the bench holds 4 ranks x --size in memory")


def test_the_smallest_bench_size_runs(tmp_path):
    done = snapops_cli("bench", "wtxt", "--size", "4KiB", "--rounds", "1", "--workdir",
                       tmp_path, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # one row of weights, its bias vector and a step scalar
    assert result["rounds"] == 1 and result["raw_bytes"] == 4096 + 4096 + 8
