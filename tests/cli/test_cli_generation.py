"""snapops verify for whole generations (a work tree, a bare repository, a commit, a MANIFEST
path) and for binary files whose seal lives in their generation (fail closed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from snapops import save
from snapops.cli import main
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
from snapops.formats.keys import load_hmac_key

TS = "2026-01-02T03:04:05Z"


def state(gen: int) -> dict[str, np.ndarray]:
    return {"w": np.arange(64, dtype=np.float32).reshape(8, 8) * gen,
            "step": np.array(gen, np.int64)}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, keydir) -> Path:
    """A work tree with generations 1 and 2 of run1 (AERO), each committed and tagged."""
    root = tmp_path / "work"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    spec = GenerationSpec(run="run1", format="aero", shard_max=128, build="b1",
                          sign_key=keydir / "signing.key",
                          hmac_key=load_hmac_key(keydir / "hmac.key"))
    previous = None
    for gen in (1, 2):
        written = write_generation(root, spec, gen, TS, state(gen), previous)
        seal_in_ledger(root, "run1", written)
        previous = written.data
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"gen {gen}")
        git(root, "tag", f"run1/gen-00000{gen}")
    return root


def keys(keydir: Path) -> list[str]:
    return ["--trusted-key", str(keydir / "signing.pub"), "--hmac-key",
            str(keydir / "hmac.key"), "--require-signature", "--require-hmac"]


def test_work_tree_bare_repository_commit_and_manifest_path(repo, keydir, tmp_path, capsys):
    assert main(["verify", str(repo), "--run", "run1", *keys(keydir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK snapshots/run1/MANIFEST: generation, 2 arrays")
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
    assert main(["verify", str(bare), "--run", "run1", *keys(keydir), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["details"]["gen"] == 2
    assert report["details"]["source"].startswith("commit ")
    assert main(["verify", str(bare), "--run", "run1", "--rev", "run1/gen-000001",
                 *keys(keydir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["details"]["gen"] == 1
    assert main(["verify", str(repo / "snapshots/run1/MANIFEST"), *keys(keydir)]) == 0
    assert list((tmp_path).glob("snapops-verify-*")) == []


def test_failures_are_one_line_naming_file_and_check(repo, keydir, capsys):
    shard = sorted((repo / "snapshots/run1/shards").iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    assert main(["verify", str(repo), "--run", "run1", *keys(keydir)]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"FAIL snapshots/run1/shards/{shard.name}: [digest] file bytes do not "
                          "match the MANIFEST digest; expected sha256=")
    assert main(["verify", str(repo), "--run", "run1", "--rev", "HEAD", *keys(keydir)]) == 0
    capsys.readouterr()
    assert main(["verify", str(repo), "--run", "run1", "--rev", "HEAD",
                 "--require-signature"]) == 1
    assert "no trusted keys were given" in capsys.readouterr().err


@pytest.mark.parametrize("link", ["snapshots", "snapshots/run1"])
def test_a_symlinked_folder_in_the_work_tree_is_not_followed(repo, keydir, tmp_path, capsys,
                                                             link):
    """A checked-out tree may hold `snapshots` or `snapshots/<run>` as a symlink to any folder
    on the machine (git stores symlinks): whole-generation reads never follow it, so neither a
    generation kept elsewhere verifies nor does a file out there get quoted in an error."""
    outside = tmp_path / "outside"
    (repo / link).rename(outside)
    (repo / link).symlink_to(outside, target_is_directory=True)
    shown = f"FAIL snapshots/run1/MANIFEST: [fileset] {link} is a symlink (not followed)"
    assert main(["verify", str(repo), "--run", "run1", *keys(keydir)]) == 1
    assert capsys.readouterr().err.startswith(shown)
    assert main(["verify", str(repo / "snapshots/run1/MANIFEST"), *keys(keydir)]) == 1
    assert capsys.readouterr().err.startswith(shown)
    manifest = outside / ("run1/MANIFEST" if link == "snapshots" else "MANIFEST")
    manifest.write_text("SECRET_TOKEN=do-not-print-me\n")
    for argv in (["verify", str(repo), "--run", "run1"],
                 ["ledger", "verify", str(repo / "ledger/run1.ledger"), "--root", str(repo)],
                 ["diff", str(repo / "snapshots/run1"), str(repo / "snapshots/run1")]):
        assert main(argv) != 0
        assert "do-not-print-me" not in "".join(capsys.readouterr())


def test_age_generation_with_and_without_identity(tmp_path, keydir, capsys):
    recipient = (keydir / "age.pub").read_text().strip()
    spec = GenerationSpec(run="r", format="fold", sign_key=keydir / "signing.key",
                          recipients=(recipient,))
    seal_in_ledger(tmp_path, "r", write_generation(tmp_path, spec, 1, TS, state(1)))
    assert main(["verify", str(tmp_path), "--run", "r", "--trusted-key",
                 str(keydir / "signing.pub")]) == 0
    assert "checked by its digest only (give --identity" in capsys.readouterr().out
    assert main(["verify", str(tmp_path), "--run", "r", "--trusted-key",
                 str(keydir / "signing.pub"), "--identity", str(keydir / "age.key")]) == 0
    assert "digest only" not in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["fold", "aero", "pycauset", "finf"])
def test_binary_file_fails_closed_on_requirements(tmp_path, keydir, fmt, capsys):
    path = tmp_path / f"x.{fmt}"
    save(state(1), path)
    assert main(["verify", str(path)]) == 0
    capsys.readouterr()
    assert main(["verify", str(path), "--require-signature", "--require-hmac"]) == 1
    err = capsys.readouterr().err.lower()
    assert f"{fmt} files carry no sig" in err and "verify the generation" in err
    assert main(["verify", str(path), "--hmac-key", str(keydir / "hmac.key")]) == 0
    assert "HMAC key not used" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--rev", "HEAD", "x"], "--rev REV needs --run R"),
    (["--run", "run1", "a", "b"], "exactly one REPO_OR_WORKTREE"),
    (["--run", "../x", "."], "not a run name"),
    (["--run", "run1", "/nonexistent"], "not a folder"),
    (["some/MANIFEST"], "snapshots/<run>/MANIFEST"),
    (["--ci"], "--ci needs --range"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    assert main(["verify", *argv]) == 2
    assert message in capsys.readouterr().err
