"""The work tree's reset before each generation (daemon/worktree.py): a full restore makes the
paths exactly the branch tip's; a WorktreeRecord skips it only when nothing changed since."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from snapops.daemon.worktree import WorktreeRecord, restore_paths

PATHS = ["snapshots/run", "ledger/run.ledger"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "t")
    git(repo, "config", "user.email", "t@example.com")
    (repo / "snapshots/run/shards").mkdir(parents=True)
    (repo / "ledger").mkdir()
    for i in range(3):
        (repo / f"snapshots/run/shards/{i:04d}.wtxt").write_bytes(bytes([i]) * 4096)
    (repo / "snapshots/run/MANIFEST").write_text("gen 1\n")
    (repo / "ledger/run.ledger").write_text("line 1\n")
    commit_all(repo, "gen 1")
    return repo


def tree_files(repo: Path) -> dict[str, bytes]:
    out = {}
    for top in PATHS:
        base = repo / top
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        out.update({str(p.relative_to(repo)): p.read_bytes() for p in files})
    return out


def tip_files(repo: Path) -> dict[str, bytes]:
    listed = git(repo, "ls-tree", "-r", "--name-only", "main", "--", *PATHS).splitlines()
    return {rel: subprocess.run(["git", "show", f"main:{rel}"], cwd=repo, check=True,
                                capture_output=True).stdout for rel in listed}


def inodes(repo: Path) -> dict[str, int]:
    return {rel: os.lstat(repo / rel).st_ino for rel in tree_files(repo)}


def recorded(repo: Path) -> WorktreeRecord:
    """A record after one full restore and a commit of a new generation (as the daemon does)."""
    record = WorktreeRecord()
    restore_paths(repo, "main", PATHS, record)
    shard = repo / "snapshots/run/shards/0001.wtxt"
    tmp = shard.with_suffix(".tmp")
    tmp.write_bytes(b"\x09" * 4096)
    os.replace(tmp, shard)           # written as the daemon writes: a new file renamed
    with open(repo / "ledger/run.ledger", "a") as f:
        f.write("line 2\n")           # the ledger grows in place
    staged = ["snapshots/run/shards/0001.wtxt", "ledger/run.ledger"]
    record.committed(repo, commit_all(repo, "gen 2"), staged)
    return record


def test_first_restore_is_full_and_exact(repo: Path) -> None:
    (repo / "snapshots/run/shards/0000.wtxt").write_bytes(b"half written")
    (repo / "snapshots/run/shards/0099.wtxt.tmp").write_bytes(b"leftover")
    record = WorktreeRecord()
    restore_paths(repo, "main", PATHS, record)
    assert tree_files(repo) == tip_files(repo)
    assert record.files is not None and set(record.files) == set(tip_files(repo))


def test_nothing_changed_since_the_commit_restores_nothing(repo: Path) -> None:
    record = recorded(repo)
    before = inodes(repo)
    restore_paths(repo, "main", PATHS, record)
    assert inodes(repo) == before    # no file rewritten
    assert tree_files(repo) == tip_files(repo)


@pytest.mark.parametrize("change", ["rewritten", "same_size_in_place", "removed", "extra",
                                    "link", "fifo", "folder_for_file"])
def test_any_change_after_the_commit_restores_in_full(repo: Path, change: str) -> None:
    record = recorded(repo)
    shard = repo / "snapshots/run/shards/0002.wtxt"
    if change == "rewritten":
        tmp = shard.with_suffix(".tmp")
        tmp.write_bytes(b"\x07" * 4096)
        os.replace(tmp, shard)
    elif change == "same_size_in_place":
        os.truncate(shard, 0)         # ctime moves, whatever the clock's granularity
        shard.write_bytes(b"\x07" * 4096)
    elif change == "removed":
        shard.unlink()
    elif change == "extra":
        (repo / "snapshots/run/shards/0003.wtxt").write_bytes(b"crash leftover")
    elif change == "link":
        shard.unlink()
        shard.symlink_to("/etc/passwd")
    elif change == "fifo":
        os.mkfifo(repo / "snapshots/run/pipe")
    elif change == "folder_for_file":
        shard.unlink()
        shard.mkdir()
    restore_paths(repo, "main", PATHS, record)
    assert tree_files(repo) == tip_files(repo)
    assert not (repo / "snapshots/run/pipe").exists()
    assert not shard.is_symlink()


def test_a_moved_branch_restores_in_full(repo: Path) -> None:
    record = recorded(repo)
    (repo / "snapshots/run/MANIFEST").write_text("gen 3\n")
    commit_all(repo, "someone else's commit")
    (repo / "snapshots/run/MANIFEST").write_text("gen 2, as the record has it\n")
    restore_paths(repo, "main", PATHS, record)
    assert (repo / "snapshots/run/MANIFEST").read_text() == "gen 3\n"


def test_a_change_not_staged_voids_the_record(repo: Path) -> None:
    record = WorktreeRecord()
    restore_paths(repo, "main", PATHS, record)
    (repo / "snapshots/run/MANIFEST").write_text("changed, not committed\n")
    (repo / "snapshots/run/shards/0000.wtxt").write_bytes(b"\x05" * 4096)
    git(repo, "add", "snapshots/run/shards/0000.wtxt")
    git(repo, "commit", "-q", "-m", "only the shard")
    record.committed(repo, git(repo, "rev-parse", "HEAD"), ["snapshots/run/shards/0000.wtxt"])
    assert record.files is None
    restore_paths(repo, "main", PATHS, record)
    assert tree_files(repo) == tip_files(repo)


def test_other_paths_restore_in_full(repo: Path) -> None:
    record = recorded(repo)
    (repo / "snapshots/run/MANIFEST").write_text("changed\n")
    restore_paths(repo, "main", ["snapshots/run"], record)
    assert (repo / "snapshots/run/MANIFEST").read_text() == "gen 1\n"


def test_no_branch_yet_empties_the_paths(tmp_path: Path) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "snapshots/run").mkdir(parents=True)
    (repo / "snapshots/run/stray").write_text("x")
    record = WorktreeRecord()
    restore_paths(repo, "main", PATHS, record)
    assert not (repo / "snapshots/run").exists()
    assert record.files == {}


def test_a_planted_gitattributes_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    """The daemon's work tree follows the remote: a .gitattributes symlink pushed there must
    not make the daemon read or append to the file it points at."""
    from snapops.daemon.worktree import write_attributes_block

    outside = tmp_path / "elsewhere"
    outside.write_text("keep me\n")
    repo = tmp_path / "work"
    repo.mkdir()
    (repo / ".gitattributes").symlink_to(outside)
    write_attributes_block(repo, "# begin", "# end", ["*.wtxt -delta"])
    assert outside.read_text() == "keep me\n"
    assert not (repo / ".gitattributes").is_symlink()
    assert (repo / ".gitattributes").read_text() == "# begin\n*.wtxt -delta\n# end\n"


@pytest.mark.parametrize("planted", ["snapshots", "ledger"])
def test_a_symlinked_folder_above_the_paths_is_refused_not_deleted_through(
        tmp_path: Path, planted: str) -> None:
    """A branch whose `snapshots` (or `ledger`) is a symlink to a folder elsewhere: the full
    restore removed `snapshots/run` (`ledger/run.ledger`) through it, deleting files outside
    the work tree. Now it refuses, naming the link, and the folder out there is untouched."""
    from snapops.formats.errors import DataError

    outside = tmp_path / "outside"
    (outside / "run").mkdir(parents=True)
    (outside / "run" / "precious").write_text("keep me\n")
    (outside / "run.ledger").write_text("keep me too\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "t")
    git(repo, "config", "user.email", "t@example.com")
    (repo / planted).symlink_to(outside, target_is_directory=True)
    commit_all(repo, "planted")
    with pytest.raises(DataError, match=rf"repo/{planted}: a symlink where snapops writes "
                                        rf"{planted}/run.*; refusing to write or delete"):
        restore_paths(repo, "main", PATHS)
    assert (outside / "run" / "precious").read_text() == "keep me\n"
    assert (outside / "run.ledger").read_text() == "keep me too\n"
