"""Output and repository paths are checked before a command does any work: an output that is
one of the command's inputs, lies in a missing folder or is a folder is refused with one line
(exit 2) and every input is left as it was; a missing repository folder is named as such
(not as ``cannot run git``); no message names an internal temp file or quotes errno text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import snapops
from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.keys import generate_keys

TS = "2026-01-02T03:04:05Z"


def snapops_cli(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapops", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def refused(done: subprocess.CompletedProcess, message: str) -> None:
    """Exit 2 with one line naming ``message``, no temp file, no errno text."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert ".tmp" not in done.stderr and "Errno" not in done.stderr, done.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Two row-blocked WTXT generations, the delta between them, an npz state, keys, a
    plaintext and its age file."""
    folder = tmp_path_factory.mktemp("paths")
    rng = np.random.default_rng(0)
    for gen in (1, 2):
        state = {"w": rng.standard_normal((64, 32)).astype(np.float32),
                 "b": np.full(32, gen, np.float32)}
        snapops.save(state, folder / f"g{gen}.wtxt", gen=gen, ts=TS, rows_per_chunk=8)
    snapops.save({"w": np.arange(12, dtype=np.float32)}, folder / "state.npz")
    generate_keys(folder / "keys")
    (folder / "plain.txt").write_text("hello\n")
    made = [snapops_cli("delta", "make", "g1.wtxt", "g2.wtxt", "d12.delta", cwd=folder),
            snapops_cli("encrypt", "plain.txt", "plain.age", "-R", "keys/age.pub", cwd=folder)]
    assert all(done.returncode == 0 for done in made), [done.stderr for done in made]
    return folder


def snapshot_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


SAME_AS_INPUT = [
    ("convert", "state.npz", "state.npz"),
    ("convert", "state.npz", "./state.npz", "--to", "npz"),
    ("delta", "make", "g1.wtxt", "g2.wtxt", "g1.wtxt"),
    ("delta", "make", "g1.wtxt", "g2.wtxt", "keys/hmac.key", "--hmac-key", "keys/hmac.key"),
    ("delta", "apply", "g1.wtxt", "d12.delta", "d12.delta"),
    ("encrypt", "plain.txt", "plain.txt", "-R", "keys/age.pub"),
    ("encrypt", "plain.txt", "keys/age.pub", "-R", "keys/age.pub"),
    ("decrypt", "plain.age", "plain.age", "-i", "keys/age.key"),
    ("decrypt", "plain.age", "keys/age.key", "-i", "keys/age.key"),
    ("restore", ".", "--run", "r", "--gen", "1", "-o", "state.npz", "--hmac-key",
     "state.npz"),
]


@pytest.mark.parametrize("argv", SAME_AS_INPUT, ids=lambda a: " ".join(a[:2]))
def test_an_output_that_is_an_input_is_refused_and_every_file_kept(work, argv):
    before = snapshot_of(work)
    refused(snapops_cli(*argv, cwd=work), "would replace the input")
    assert snapshot_of(work) == before


MISSING_FOLDER = [
    ("convert", "state.npz", "nodir/sub/x.wtxt"),
    ("delta", "make", "g1.wtxt", "g2.wtxt", "nodir/sub/x.delta"),
    ("delta", "apply", "g1.wtxt", "d12.delta", "nodir/sub/x.wtxt"),
    ("encrypt", "plain.txt", "nodir/sub/x.age", "-R", "keys/age.pub"),
    ("decrypt", "plain.age", "nodir/sub/x.txt", "-i", "keys/age.key"),
    # the output is checked before the repository is even opened
    ("restore", "/nonexistent", "--run", "r", "--gen", "1", "-o", "nodir/sub/x.npz"),
]


@pytest.mark.parametrize("argv", MISSING_FOLDER, ids=lambda a: " ".join(a[:2]))
def test_an_output_in_a_missing_folder_is_refused_before_any_work(work, argv):
    before = snapshot_of(work)
    refused(snapops_cli(*argv, cwd=work), "the folder nodir/sub does not exist")
    assert snapshot_of(work) == before and not (work / "nodir").exists()


def test_an_output_that_is_a_folder_is_refused(work):
    (work / "dir.npz").mkdir(exist_ok=True)
    refused(snapops_cli("convert", "state.npz", "dir.npz", cwd=work), "dir.npz: is a folder")
    assert list((work / "dir.npz").iterdir()) == []


def test_keys_generate_where_a_file_is_in_the_way_says_so(work):
    (work / "out_pt.wtxt").write_text("not a folder\n")
    refused(snapops_cli("keys", "generate", "out_pt.wtxt", cwd=work),
            "out_pt.wtxt: a file is in the way; keys are written into a folder")
    refused(snapops_cli("keys", "generate", "out_pt.wtxt/sub", cwd=work),
            "a file is in the way (out_pt.wtxt)")
    assert (work / "out_pt.wtxt").read_text() == "not a folder\n"
    done = snapops_cli("keys", "generate", "new/keys", cwd=work)
    assert done.returncode == 0 and (work / "new/keys/age.key").is_file(), done.stderr


@pytest.mark.parametrize("argv", [("hooks", "install", "/nonexistent"),
                                  ("hooks", "uninstall", "/nonexistent"),
                                  ("hook", "pre-commit", "--repo", "/nonexistent"),
                                  ("lfs", "prune", "/nonexistent", "--run", "r", "--keep-last",
                                   "1", "--local-storage", ".")],
                         ids=lambda a: " ".join(a[:2]))
def test_a_missing_repository_folder_is_named_not_blamed_on_git(tmp_path, argv):
    refused(snapops_cli(*argv, cwd=tmp_path),
            "/nonexistent: the repository folder does not exist")


def test_hooks_install_on_a_file_says_it_is_not_a_folder(tmp_path):
    (tmp_path / "afile").write_text("")
    refused(snapops_cli("hooks", "install", "afile", cwd=tmp_path),
            "afile: not a folder; expected the repository folder")


def test_lfs_prune_refuses_a_missing_storage_folder_unless_dry_run(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    prune = ("lfs", "prune", "repo", "--run", "r", "--keep-last", "1", "--local-storage",
             "nostore")
    refused(snapops_cli(*prune, cwd=tmp_path),
            "nostore: the LFS storage folder does not exist")
    # a dry run touches no storage: it gets as far as the repository's (absent) tags
    refused(snapops_cli(*prune, "--dry-run", cwd=tmp_path), "no generation tags r/gen-*")


def test_an_atomic_write_error_names_the_target_not_its_temp_file(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError, match=r"Is a directory: '[^']*folder'$"):
        atomic_write_bytes(tmp_path / "folder", b"x")
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: '[^']*nodir/x'$"):
        atomic_write_bytes(tmp_path / "nodir" / "x", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["folder"]
    assert list((tmp_path / "folder").iterdir()) == []
