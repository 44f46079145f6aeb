"""Exit codes of ``convert`` and ``delta`` as the README states them (1 verification failed,
2 usage or input error): a file that was read and failed a check of its content exits 1 (a
flipped bit, a cut file, a delta applied to another base); a file or key that cannot be used
at all (missing, a folder: checks ``io`` and ``keys``), or files no delta can pair, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import snapops

TS = "2026-01-02T03:04:05Z"


def snapops_cli(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapops", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def flipped(source: Path, target: Path) -> None:
    """``target``: ``source`` with one bit of its middle byte flipped (inside a payload)."""
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 1
    target.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """g1/g2.wtxt (row-blocked), other.wtxt (another blocking), the delta g1 -> g2 and
    damaged copies of g1 and of the delta."""
    folder = tmp_path_factory.mktemp("exit-codes")
    rng = np.random.default_rng(1)
    for gen in (1, 2):
        state = {"w": rng.standard_normal((64, 32)).astype(np.float32)}
        snapops.save(state, folder / f"g{gen}.wtxt", gen=gen, ts=TS, rows_per_chunk=8)
    snapops.save({"w": np.zeros((64, 32), np.float32)}, folder / "other.wtxt", gen=3, ts=TS,
                 rows_per_chunk=4)
    made = snapops_cli("delta", "make", "g1.wtxt", "g2.wtxt", "d12.delta", cwd=folder)
    assert made.returncode == 0, made.stderr
    flipped(folder / "g1.wtxt", folder / "flip.wtxt")
    flipped(folder / "d12.delta", folder / "flip.delta")
    (folder / "cut.wtxt").write_bytes((folder / "g1.wtxt").read_bytes()[:300])
    (folder / "adir").mkdir()
    return folder


FAILED_CHECK = [
    (("delta", "apply", "g1.wtxt", "flip.delta", "o.wtxt"), "flip.delta:"),
    (("delta", "apply", "flip.wtxt", "d12.delta", "o.wtxt"), "base does not verify"),
    (("delta", "apply", "g2.wtxt", "d12.delta", "o.wtxt"), "[sha256_all] expected a base"),
    (("delta", "make", "flip.wtxt", "g2.wtxt", "o.delta"), "base does not verify"),
    (("delta", "make", "g1.wtxt", "cut.wtxt", "o.delta"), "target does not verify"),
    (("convert", "flip.wtxt", "o.npz"), "flip.wtxt:"),
    (("convert", "flip.wtxt", "o.npz", "--no-verify"), "flip.wtxt:"),
    (("convert", "cut.wtxt", "o.npz"), "[truncated]"),
]

UNUSABLE = [
    (("delta", "apply", "g1.wtxt", "missing.delta", "o.wtxt"), "[io] cannot read"),
    (("delta", "apply", "g1.wtxt", "adir", "o.wtxt"), "[io] not a regular file"),
    (("delta", "make", "g1.wtxt", "missing.wtxt", "o.delta"), "[io]"),
    (("delta", "apply", "g1.wtxt", "d12.delta", "o.wtxt", "--hmac-key", "nokey"),
     "nokey: HMAC key: cannot read"),
    (("delta", "make", "g1.wtxt", "other.wtxt", "o.delta"), "write a full snapshot instead"),
    (("convert", "missing.wtxt", "o.npz"), "[io] cannot read"),
    (("convert", "g1.wtxt", "o.unknownsuffix"), "o.unknownsuffix"),
]


@pytest.mark.parametrize("argv,said", FAILED_CHECK, ids=lambda a: " ".join(a[:3]))
def test_a_file_that_fails_a_check_of_its_content_exits_1(work, argv, said):
    done = snapops_cli(*argv, cwd=work)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert not list(work.glob("o.*"))


@pytest.mark.parametrize("argv,said", UNUSABLE, ids=lambda a: " ".join(a[:3]))
def test_a_file_or_key_that_cannot_be_used_exits_2(work, argv, said):
    done = snapops_cli(*argv, cwd=work)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert not list(work.glob("o.*"))


def test_an_intact_pair_still_round_trips(work):
    done = snapops_cli("delta", "apply", "g1.wtxt", "d12.delta", "rebuilt.wtxt", cwd=work)
    assert done.returncode == 0, done.stderr
    assert (work / "rebuilt.wtxt").read_bytes() == (work / "g2.wtxt").read_bytes()
