"""Limits on what a file declares, seen from the command line: an .npz bomb (~4.5 GB of
zeros deflated to ~4.4 MB) is refused by convert, verify, inspect, textconv and diff from
its declared sizes (fast, without the memory), and a declared 10^6 x 10^6 shape is a typed
one-line error. Memory and time are measured in a child process (behaviour bounds with wide
margins, not benchmarks)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from snapops.cli import main
from tests.formats.npz_bomb import npy_header, write_bomb

CHILD = r"""
import json, resource, sys, time
from snapops.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    code = main(argv)
    results.append({"argv": argv, "code": code, "seconds": time.perf_counter() - start,
                    "extra_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    declared = write_bomb(path)
    assert declared > 4_400_000_000 and path.stat().st_size < 5_000_000
    with zipfile.ZipFile(path) as archive:      # a well-formed archive, as zip sees it
        assert archive.infolist()[0].file_size == declared
    return path


def test_npz_bomb_is_refused_fast_and_small_by_every_reader(bomb, tmp_path):
    out = tmp_path / "out.wtxt"
    warmup = ["inspect", str(bomb)]          # imports and first-call costs, not measured
    commands = [warmup, ["convert", str(bomb), str(out)], ["verify", str(bomb)],
                ["inspect", str(bomb)], ["textconv", str(bomb)],
                ["diff", str(bomb), str(bomb)]]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(commands)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])[1:]
    errors = [line for line in done.stderr.splitlines() if line]
    assert len(errors) == len(commands) and all("[limit] array w:" in e for e in errors), errors
    for result in results:
        assert result["code"] in (1, 2), result
        assert result["seconds"] < 1.0, result
        assert result["extra_kib"] < 100 * 1024, result
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_declared_huge_shape_is_a_typed_one_line_error(tmp_path, capsys):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("w.npy", npy_header((10**6, 10**6)) + bytes(64))
    for argv in (["convert", str(path), str(tmp_path / "o.wtxt")], ["textconv", str(path)],
                 ["inspect", str(path)]):
        assert main(argv) in (1, 2)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "[limit] array w:" in err, err
        assert "1000000x1000000" in err or "4000000000000" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.npz"]


def test_textconv_and_diff_stream_a_large_member_in_bounded_memory(tmp_path):
    """160 MiB of zeros deflated (allowed with --max-expansion): read in blocks, never held."""
    big = tmp_path / "big.npz"
    declared = write_bomb(big, blocks=10)
    assert declared > 160 << 20
    limit = ["--max-expansion", "2000"]
    commands = [["inspect", str(big)], ["textconv", str(big), *limit],
                ["diff", str(big), str(big), *limit]]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(commands)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])[1:]
    assert "endarr w sha256=" in done.stdout, done.stdout[-500:]
    for result in results:
        assert result["code"] == 0, (result, done.stderr)
        assert result["extra_kib"] < 100 * 1024, result


def test_convert_limits_are_configurable(tmp_path, capsys):
    import numpy as np

    import snapops

    snapops.save({"w": np.zeros(1024, np.float32)}, tmp_path / "z.npz")
    out = tmp_path / "o.wtxt"
    assert main(["convert", str(tmp_path / "z.npz"), str(out), "--max-array-bytes", "1KiB"]) == 1
    assert "[limit] array w: expected at most 1024 bytes" in capsys.readouterr().err
    assert not out.exists()
    assert main(["convert", str(tmp_path / "z.npz"), str(out), "--max-array-bytes", "8KiB"]) == 0
    assert snapops.load(out)["w"].tobytes() == bytes(4096)
