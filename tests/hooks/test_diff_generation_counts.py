"""The generation review counts a tensor as changed only when it changed: in a real
repository (generations written, sealed, committed and tagged as the daemon does it, see
``genrepo``) where two of nine tensors change between two generations, the headline of
``snapops diff`` of the two generations and of ``snapops review pr`` says 2 changed and 7
unchanged; empty tensors are unchanged in both modes. The expected sets come from comparing
the numpy arrays written, not from the review code. Tensor names from the MANIFEST reach
the terminal escaped."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from .genrepo import GenRepo, sealed_work_repo, tag

EVIL = "evil\x1b[31m\nname"
EVIL_SHOWN = "evil\\x1b[31m\\nname"


def gen1() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {"layer.0.weight": rng.standard_normal((4, 4)).astype(ml_dtypes.bfloat16),
            "w": rng.standard_normal((64, 16)).astype(np.float32),
            "f16": rng.standard_normal((3, 4)).astype(np.float16),
            "mask": rng.standard_normal(5) > 0,
            "empty": np.zeros((0, 4), np.float32),
            "emptybf": np.zeros((0, 3), ml_dtypes.bfloat16),
            "nanonly": np.array([np.nan, np.inf], np.float32),
            EVIL: np.arange(6, dtype=np.float32),
            "step": np.array(1, np.int64)}


def gen2() -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in gen1().items()}
    out["layer.0.weight"][0, 0] += ml_dtypes.bfloat16(0.5)
    out[EVIL][2] += np.float32(0.25)     # a small step: no anomaly
    return out


def changed_names() -> set[str]:
    """Tensors whose bytes differ, from the arrays themselves."""
    a, b = gen1(), gen2()
    return {n for n in a if a[n].tobytes() != b[n].tobytes()}


@pytest.fixture(scope="module")
def repo(tmp_path_factory, keydir) -> GenRepo:
    """Two generations of run1 in several shards (shard_max 1 KiB), signed and HMAC'd."""
    return sealed_work_repo(tmp_path_factory.mktemp("gencounts"), keydir, [gen1(), gen2()])


def expected_headline() -> str:
    total, changed = len(gen1()), len(changed_names())
    return (f"{total} tensors: {changed} changed, 0 added, 0 removed, "
            f"{total - changed} unchanged; 0 anomalies")


def test_diff_of_two_generations_counts_only_changed_tensors(repo):
    assert changed_names() == {"layer.0.weight", EVIL}
    done = repo.snapops("diff", "--git", tag(1), tag(2), "snapshots/run1", "--exit-code")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert "MANIFEST statistics and the weights" in lines[2]
    assert lines[3] == f"  {expected_headline()}"
    assert any(x.startswith("weights: 9 arrays: 2 changed, 0 added, 0 removed, 7 unchanged")
               for x in lines)
    marks = {x.split()[1]: x.split()[0] for x in lines if x.startswith("  ") and " [" in x
             and x.split()[0] in ("~", "=", "~=")}
    assert marks["empty"] == marks["emptybf"] == "="


def test_json_settles_every_tensor_by_its_bytes(repo):
    done = repo.snapops("diff", "--git", tag(1), tag(2), "snapshots/run1", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    settled = {t["name"]: t["settled"] for t in report["tensors"]}
    assert {n for n, s in settled.items() if s != "unchanged"} == changed_names()
    assert report["counts"] == {"changed": 2, "added": 0, "removed": 0, "unchanged": 7,
                                "same-stats": 0}


def test_statistics_only_review_keeps_empty_tensors_unchanged(repo):
    done = repo.snapops("diff", "--git", tag(1), tag(2), "snapshots/run1", "--manifest-only",
                        "--format", "json")
    assert done.returncode == 0, done.stderr
    status = {t["name"]: t["status"] for t in json.loads(done.stdout)["tensors"]}
    assert status["empty"] == status["emptybf"] == "unchanged"
    assert {n for n, s in status.items() if s == "changed"} == changed_names()
    # NaN statistics (no finite value) equal on both sides: the same statistics
    assert status["nanonly"] == "same-stats"


def test_same_generation_is_unchanged_with_exit_code_zero(repo):
    done = repo.snapops("diff", "--git", tag(2), tag(2), "snapshots/run1", "--exit-code")
    assert done.returncode == 0, done.stderr
    assert "9 tensors: 0 changed, 0 added, 0 removed, 9 unchanged" in done.stdout


def test_review_pr_comment_counts_only_changed_tensors(repo, tmp_path):
    out = tmp_path / "out"
    done = repo.snapops("review", "pr", "--base", tag(1), "--head", tag(2), "--out", str(out))
    assert done.returncode == 0, done.stderr
    body = (out / "comment.md").read_text()
    assert f"**{expected_headline()}**" in body
    assert "\x1b" not in body and EVIL_SHOWN in body


def test_review_pr_out_must_be_a_folder(repo, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    done = repo.snapops("review", "pr", "--base", tag(1), "--head", tag(2), "--out",
                        str(blocker / "sub"))
    assert done.returncode == 2 and "a file is in the way" in done.stderr, done.stderr
    assert blocker.read_text() == "keep"


def test_tensor_names_reach_the_terminal_escaped(repo):
    done = repo.snapops("diff", "--git", tag(1), tag(2), "snapshots/run1")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    shown = [x for x in done.stdout.splitlines() if EVIL_SHOWN in x]
    assert len(shown) == 2            # its row in the tensor table and in the weights table
