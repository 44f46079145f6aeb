"""SnapshotRepo against real git: exact staging, annotated tags, idempotency, no partial commit,
pushes to a bare repository and to ``git daemon`` on 127.0.0.1, and typed push failures."""

from __future__ import annotations

import os
import subprocess
import resource
import signal
import time
from pathlib import Path

import pytest

from snapops.daemon.gitops import SnapshotRepo
from snapops.daemon.redact import redact_url
from snapops.formats.errors import GitError, PushError
from tests.daemon.gitserve import bare_remote, git, git_bytes, git_daemon, silent_server  # noqa: F401


@pytest.fixture
def repo(tmp_path):
    with SnapshotRepo(tmp_path / "repo") as snapshot_repo:
        yield snapshot_repo


def write(repo: SnapshotRepo, rel: str, data: bytes) -> None:
    path = repo.path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def tree(repo: SnapshotRepo, rev: str = "HEAD") -> dict[str, bytes]:
    """Every file of ``rev`` read back with git itself."""
    names = git("ls-tree", "-r", "--name-only", rev, cwd=repo.path).splitlines()
    return {n: git_bytes("cat-file", "blob", f"{rev}:{n}", cwd=repo.path) for n in names}


def count(repo: SnapshotRepo) -> int:
    return int(git("rev-list", "--count", "HEAD", cwd=repo.path))


# -- creation -----------------------------------------------------------------------------------

def test_creates_non_bare_repo_on_branch_with_local_identity(tmp_path):
    with SnapshotRepo(tmp_path / "a" / "repo", branch="snaps", author_name="Bot",
                      author_email="bot@example.org") as repo:
        assert (repo.path / ".git").is_dir()
        assert git("rev-parse", "--is-bare-repository", cwd=repo.path) == "false"
        assert git("symbolic-ref", "HEAD", cwd=repo.path) == "refs/heads/snaps"
        assert git("config", "--local", "user.name", cwd=repo.path) == "Bot"
        assert repo.head_file("x") is None and repo.tag_commit("t") is None
        write(repo, "f", b"1\n")
        sha = repo.commit_generation(["f"], "gen 1", "r/gen-000001")
    assert git("log", "-1", "--format=%an <%ae>|%cn <%ce>", sha, cwd=tmp_path / "a" / "repo") \
        == "Bot <bot@example.org>|Bot <bot@example.org>"
    # reopening an existing repository keeps its history
    with SnapshotRepo(tmp_path / "a" / "repo", branch="snaps") as again:
        assert again.head_commit() == sha and again.head_file("f") == b"1\n"


def test_refuses_bare_repository_and_other_branch(tmp_path):
    git("init", "-q", "--bare", str(tmp_path / "bare.git"))
    with pytest.raises(GitError, match="bare repository"):
        SnapshotRepo(tmp_path / "bare.git")
    with SnapshotRepo(tmp_path / "repo") as repo:
        write(repo, "f", b"x")
        repo.commit_generation(["f"], "m", "t1")
    with pytest.raises(GitError, match="expected refs/heads/other"):
        SnapshotRepo(tmp_path / "repo", branch="other")
    with pytest.raises(GitError, match="invalid branch"):
        SnapshotRepo(tmp_path / "repo2", branch="bad..name")


def test_nested_inside_another_work_tree_gets_its_own_repo(tmp_path):
    git("init", "-q", str(tmp_path / "outer"))
    with SnapshotRepo(tmp_path / "outer" / "snap") as repo:
        write(repo, "f", b"x")
        repo.commit_generation(["f"], "m", "t1")
    assert git("rev-parse", "--show-toplevel", cwd=tmp_path / "outer" / "snap") \
        == str((tmp_path / "outer" / "snap").resolve())
    assert git("status", "--porcelain", cwd=tmp_path / "outer") == "?? snap/"


# -- commit_generation --------------------------------------------------------------------------

def test_commit_stages_exactly_the_given_paths(repo):
    write(repo, "snapshots/r/a.wtxt", b"a1\n")
    write(repo, "snapshots/r/b.wtxt", b"b1\n")
    write(repo, "stray.txt", b"not mine\n")
    git("add", "stray.txt", cwd=repo.path)  # something else staged must not ride along
    sha = repo.commit_generation(["snapshots/r/a.wtxt"], "r gen 1", "r/gen-000001")
    assert tree(repo) == {"snapshots/r/a.wtxt": b"a1\n"}
    assert git("rev-parse", "HEAD", cwd=repo.path) == sha
    assert "?? snapshots/r/b.wtxt" in git("status", "--porcelain", cwd=repo.path)

    write(repo, "snapshots/r/a.wtxt", b"a2\n")
    write(repo, "snapshots/r/b.wtxt", b"b2\n")
    repo.commit_generation(["snapshots/r/b.wtxt"], "r gen 2", "r/gen-000002")
    assert tree(repo) == {"snapshots/r/a.wtxt": b"a1\n", "snapshots/r/b.wtxt": b"b2\n"}
    assert repo.head_file("snapshots/r/a.wtxt") == b"a1\n"


def test_removal_directory_and_special_names(repo):
    names = ["snapshots/r/x y.wtxt", "snapshots/r/*.wtxt", "snapshots/r/:(glob)q", "d/e/f"]
    for name in names:
        write(repo, name, name.encode())
    repo.commit_generation(names[:3] + ["d"], "gen 1", "r/gen-000001")
    assert sorted(tree(repo)) == sorted(names)
    os.remove(repo.path / "snapshots/r/x y.wtxt")
    (repo.path / "d/e/f").unlink()
    repo.commit_generation(["snapshots/r/x y.wtxt", "d/e/f", "never/existed"], "gen 2",
                           "r/gen-000002")
    assert sorted(tree(repo)) == sorted(names[1:3])


def test_head_file_is_byte_exact(repo):
    data = b"\x00\xff\r\n\n\n"
    write(repo, "bin", data)
    repo.commit_generation(["bin"], "m", "t")
    assert repo.head_file("bin") == data
    assert repo.head_file("absent") is None


def test_annotated_tag_and_message(repo):
    write(repo, "f", b"1")
    message = "snapshot run1 gen 000001 merkle_this=ab12"
    sha = repo.commit_generation(["f"], message, "run1/gen-000001")
    assert git("cat-file", "-t", "refs/tags/run1/gen-000001", cwd=repo.path) == "tag"
    assert git("rev-parse", "run1/gen-000001^{commit}", cwd=repo.path) == sha
    assert git_bytes("tag", "-l", "--format=%(contents)", "run1/gen-000001", cwd=repo.path) \
        == (message + "\n\n").encode()  # the tag's message, then for-each-ref's newline
    assert git_bytes("cat-file", "commit", sha, cwd=repo.path).endswith(
        b"\n\n" + message.encode() + b"\n")
    assert repo.tag_commit("run1/gen-000001") == sha
    git("fsck", "--strict", cwd=repo.path)


def test_empty_generation_still_commits_and_tags(repo):
    write(repo, "f", b"1")
    first = repo.commit_generation(["f"], "gen 1", "r/gen-000001")
    second = repo.commit_generation(["f"], "gen 2", "r/gen-000002")
    third = repo.commit_generation([], "gen 3", "r/gen-000003")
    assert len({first, second, third}) == 3 and count(repo) == 3
    assert git("rev-parse", f"{third}^", cwd=repo.path) == second
    assert git("rev-parse", f"{third}^{{tree}}", cwd=repo.path) \
        == git("rev-parse", f"{first}^{{tree}}", cwd=repo.path)


def test_existing_tag_returns_its_commit_without_committing(repo):
    write(repo, "f", b"1")
    sha = repo.commit_generation(["f"], "gen 1", "r/gen-000001")
    write(repo, "f", b"changed")
    assert repo.commit_generation(["f"], "gen 1", "r/gen-000001") == sha
    assert count(repo) == 1 and repo.head_file("f") == b"1"


def test_crash_between_branch_and_tag_does_not_commit_twice(repo):
    write(repo, "f", b"1")
    repo.commit_generation(["f"], "gen 1", "r/gen-000001")
    write(repo, "f", b"2")
    sha = repo.commit_generation(["f"], "gen 2", "r/gen-000002")
    git("tag", "-d", "r/gen-000002", cwd=repo.path)  # as if killed after the branch moved
    assert repo.commit_generation(["f"], "gen 2", "r/gen-000002") == sha
    assert count(repo) == 2 and repo.tag_commit("r/gen-000002") == sha


def test_unsafe_paths_are_refused(repo):
    write(repo, "f", b"1")
    for bad in ["/etc/passwd", "../x", "a/../../x", "a/..", ".git/config", "x/.GIT/y", "",
                "nul\0byte"]:
        with pytest.raises(GitError, match="refusing|invalid path"):
            repo.commit_generation(["f", bad], "m", "t")
        with pytest.raises(GitError, match="refusing|invalid path"):
            repo.head_file(bad)
    assert repo.head_commit() is None and repo.tag_commit("t") is None


def test_symlinked_folder_leading_outside_is_refused(repo, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f").write_bytes(b"secret")
    os.symlink(tmp_path / "outside", repo.path / "link")
    with pytest.raises(GitError, match="symbolic link"):
        repo.commit_generation(["link/f"], "m", "t")
    with pytest.raises(GitError, match="one string"):
        repo.commit_generation("f", "m", "t")


def test_invalid_tag_name_is_refused(repo):
    with pytest.raises(GitError, match="invalid tag"):
        repo.commit_generation([], "m", "bad tag")


def test_locked_index_gives_clear_error_and_no_commit(repo):
    write(repo, "a", b"a1")
    repo.commit_generation(["a"], "gen 1", "r/gen-000001")
    head = repo.head_commit()
    write(repo, "a", b"a2")
    lock = repo.path / ".git" / "index.lock"
    lock.write_bytes(b"")  # another git process holds the index (or the disk refuses writes)
    with pytest.raises(GitError, match=r"git .* failed: .*index\.lock"):
        repo.commit_generation(["a"], "gen 2", "r/gen-000002")
    assert repo.head_commit() == head and repo.tag_commit("r/gen-000002") is None
    lock.unlink()
    sha = repo.commit_generation(["a"], "gen 2", "r/gen-000002")
    assert tree(repo, sha) == {"a": b"a2"}


def test_failed_ref_update_leaves_no_partial_commit_nor_staged_leftovers(repo):
    write(repo, "a", b"a1")
    write(repo, "b", b"b1")
    repo.commit_generation(["a", "b"], "gen 1", "r/gen-000001")
    head = repo.head_commit()
    write(repo, "a", b"a2")
    lock = repo.path / ".git" / "refs" / "heads" / "main.lock"
    lock.write_bytes(b"")  # the branch update (the last step) fails
    with pytest.raises(GitError, match="update-ref"):
        repo.commit_generation(["a"], "gen 2", "r/gen-000002")
    lock.unlink()
    assert repo.head_commit() == head and repo.tag_commit("r/gen-000002") is None
    assert git("diff", "--cached", "--name-only", cwd=repo.path) == ""  # index reset to HEAD
    write(repo, "b", b"b2")
    sha = repo.commit_generation(["b"], "gen 2b", "r/gen-000002")
    assert tree(repo, sha) == {"a": b"a1", "b": b"b2"}  # a2 from the failed attempt is not in it


def test_write_failure_mid_add_gives_git_error_and_no_commit(repo):
    """Storage refusing writes while git stores objects: a file-size limit (inherited by the git
    processes) kills git with SIGXFSZ while it stores the file, much as a full disk would
    stop it; the error says so and nothing is committed."""
    write(repo, "small", b"s")
    repo.commit_generation(["small"], "gen 1", "r/gen-000001")
    head = repo.head_commit()
    write(repo, "big", os.urandom(2 << 20))  # incompressible: a 2 MiB loose object
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, old_limit[1]))
    try:
        with pytest.raises(GitError, match=r"git (add|hash-object) failed: .*killed by SIGXFSZ"):
            repo.commit_generation(["big", "small"], "gen 2", "r/gen-000002")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert repo.head_commit() == head and repo.tag_commit("r/gen-000002") is None
    assert git("diff", "--cached", "--name-only", cwd=repo.path) == ""
    sha = repo.commit_generation(["big"], "gen 2", "r/gen-000002")  # space is back
    assert git("cat-file", "-s", f"{sha}:big", cwd=repo.path) == str(2 << 20)
    git("fsck", cwd=repo.path)


def test_clear_stale_locks_after_a_crash(repo):
    write(repo, "a", b"1")
    repo.commit_generation(["a"], "gen 1", "r/gen-000001")
    gitdir = repo.path / ".git"
    locks = [gitdir / "index.lock", gitdir / "refs" / "tags" / "r" / "gen-000002.lock"]
    for lock in locks:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_bytes(b"")
    with pytest.raises(GitError, match="index.lock"):
        repo.commit_generation(["a"], "gen 2", "r/gen-000002")
    assert repo.clear_stale_locks(min_age=3600) == []  # young locks may belong to a live git
    old = time.time() - 7200
    for lock in locks:
        os.utime(lock, (old, old))
    assert sorted(repo.clear_stale_locks(min_age=3600)) == sorted(map(str, locks))
    repo.commit_generation(["a"], "gen 2", "r/gen-000002")


def test_unwritable_repository_gives_git_error(repo):
    write(repo, "a", b"a1")
    objects = repo.path / ".git" / "objects"
    mode = objects.stat().st_mode
    # root writes through permission bits: make the folder immutable instead (ext4/tmpfs)
    immutable = os.geteuid() == 0 and subprocess.run(
        ["chattr", "+i", str(objects)], capture_output=True).returncode == 0
    if not immutable:
        objects.chmod(0o555)
    try:
        with pytest.raises(GitError,
                           match=r"git (add|hash-object) failed: error: unable"):
            repo.commit_generation(["a"], "gen 1", "r/gen-000001")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(objects)], check=True)
        objects.chmod(mode)
    assert repo.head_commit() is None


# -- push ---------------------------------------------------------------------------------------

def commit_gens(repo: SnapshotRepo, first: int, last: int) -> list[str]:
    tags = []
    for gen in range(first, last + 1):
        write(repo, "snapshots/r/s.wtxt", f"gen {gen}\n".encode())
        tag = f"r/gen-{gen:06d}"
        repo.commit_generation(["snapshots/r/s.wtxt"], f"gen {gen}", tag)
        tags.append(tag)
    return tags


def test_push_to_bare_repository(repo, bare_remote):
    tags = commit_gens(repo, 1, 3)
    repo.push(str(bare_remote), tags[:2], timeout=30)
    assert repo.remote_tags(str(bare_remote)) == set(tags[:2])
    assert git("rev-parse", "main", cwd=bare_remote) == repo.head_commit()
    repo.push(f"file://{bare_remote}", ["refs/tags/" + tags[2]], timeout=30)
    repo.push(str(bare_remote), tags, timeout=30)  # everything up to date: still a success
    assert repo.remote_tags(str(bare_remote)) == set(tags)
    git("fsck", "--strict", cwd=bare_remote)
    assert git("cat-file", "-t", tags[0], cwd=bare_remote) == "tag"


def test_push_relative_path_resolves_against_cwd(repo, bare_remote, monkeypatch):
    commit_gens(repo, 1, 1)
    monkeypatch.chdir(bare_remote.parent)
    repo.push("remote.git", ["r/gen-000001"], timeout=30)
    assert repo.remote_tags("remote.git") == {"r/gen-000001"}


def test_push_to_git_daemon(repo, git_daemon):
    tags = commit_gens(repo, 1, 3)
    url = git_daemon.url("served.git")
    repo.push(url, tags, timeout=30)
    assert repo.remote_tags(url) == set(tags)
    served = git_daemon.base / "served.git"
    assert git("rev-parse", "main", cwd=served) == repo.head_commit()
    assert git("rev-parse", f"{tags[1]}^{{commit}}", cwd=served) == repo.tag_commit(tags[1])


def test_push_failures_are_push_errors_naming_the_remote(repo, tmp_path, git_daemon):
    tags = commit_gens(repo, 1, 1)
    missing = tmp_path / "nowhere.git"
    with pytest.raises(PushError, match=f"push to {missing}: .*does not appear to be a git"):
        repo.push(str(missing), tags, timeout=30)
    url = git_daemon.url("served.git")
    git_daemon.stop()
    with pytest.raises(PushError, match=rf"push to {url}: .*(refused|unable to connect)"):
        repo.push(url, tags, timeout=30)
    with pytest.raises(PushError, match="ls-remote"):
        repo.remote_tags(url)


def test_push_to_a_silent_remote_stalls_and_git_is_killed(repo, silent_server):
    tags = commit_gens(repo, 1, 1)
    url = f"git://127.0.0.1:{silent_server}/x.git"
    with pytest.raises(PushError, match=r"stalled: no progress for 1 s .*killed by SIGTERM"):
        repo.push(url, tags, stall=1.0)
    with pytest.raises(PushError, match=r"did not finish in 1 s .*killed by SIGTERM"):
        repo.push(url, tags, timeout=1.0)  # the optional wall-clock limit


def test_rejected_push_is_push_error(repo, bare_remote, tmp_path):
    tags = commit_gens(repo, 1, 1)
    other = tmp_path / "other"
    git("clone", "-q", str(bare_remote), str(other))
    (other / "f").write_text("diverged")
    git("add", "f", cwd=other)
    git("-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "other", cwd=other)
    git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=other)
    with pytest.raises(PushError, match="rejected"):
        repo.push(str(bare_remote), tags, timeout=30)


def test_a_hooks_reason_for_refusing_a_push_is_in_the_error(repo, bare_remote):
    """A real pre-receive hook in the bare remote refuses with a reason, then more output:
    the reason (git's first "remote:" lines) is in the PushError, not elided with the rest
    (as snapops's own hook prints its problems first)."""
    tags = commit_gens(repo, 1, 1)
    hook = bare_remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'refused: No space left on device' >&2\n"
                    "for i in 1 2 3 4 5 6; do echo \"more $i\" >&2; done\nexit 1\n")
    hook.chmod(0o755)
    with pytest.raises(PushError, match=r"remote: refused: No space left on device.*"
                                        r"pre-receive hook declined"):
        repo.push(str(bare_remote), tags, timeout=30)


def test_password_is_redacted_from_errors(repo):
    commit_gens(repo, 1, 1)
    url = "http://user:s3cret@127.0.0.1:1/x.git"
    with pytest.raises(PushError,
                       match=r"push to http://\*\*\*@127\.0\.0\.1:1/x\.git") as info:
        repo.push(url, ["r/gen-000001"], timeout=30)
    assert "s3cret" not in str(info.value) and "//***@127.0.0.1:1" in str(info.value)
    assert redact_url("ssh://git@host/x") == "ssh://git@host/x"
    assert redact_url("/srv/x.git") == "/srv/x.git"


def test_concurrent_commit_and_push_stay_consistent(repo, bare_remote):
    import threading

    commit_gens(repo, 1, 1)
    errors: list[BaseException] = []

    def pusher():
        try:
            for _ in range(5):
                repo.push(str(bare_remote), ["r/gen-000001"], timeout=30)
        except BaseException as err:  # surfaced below
            errors.append(err)

    thread = threading.Thread(target=pusher)
    thread.start()
    tags = commit_gens(repo, 2, 6)
    thread.join()
    assert not errors
    repo.push(str(bare_remote), tags, timeout=30)
    assert repo.remote_tags(str(bare_remote)) == {f"r/gen-{g:06d}" for g in range(1, 7)}
    git("fsck", "--strict", cwd=repo.path)
    assert Path(repo.path).exists()


def test_unborn_head_probe_stays_in_our_git_folder_and_sweeps_stale_ones(repo, bare_remote,
                                                                         tmp_path, monkeypatch):
    """The probe clone of a remote's unborn HEAD goes under the repository's own git folder,
    never $TMPDIR (a daemon killed mid-probe left one there per kill); a probe left over an
    hour ago is removed by the next one, a recent one is not."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)
    git("symbolic-ref", "HEAD", "refs/heads/trunk", cwd=bare_remote)
    stale, fresh = repo.git_dir / "snapops-head-stale", repo.git_dir / "snapops-head-fresh"
    for left in (stale, fresh):
        (left / "probe.git").mkdir(parents=True)
    hour_ago = time.time() - 3700
    os.utime(stale, (hour_ago, hour_ago))

    assert repo.remote_unborn_head(str(bare_remote)) == "refs/heads/trunk"
    assert list(scratch.iterdir()) == []
    assert sorted(p.name for p in repo.git_dir.glob("snapops-head-*")) == ["snapops-head-fresh"]


def test_files_are_committed_byte_for_byte_whatever_the_attributes_say(repo):
    """The work tree's .gitattributes follows the branch (a remote's tree may have put lines
    in it): `git add` applied them, so `working-tree-encoding` refused the MANIFEST (every
    commit failed), `text eol=crlf` and `ident` rewrote the ledger before it was stored."""
    write(repo, ".gitattributes", b"MANIFEST working-tree-encoding=UTF-16LE\n"
                                  b"*.ledger text eol=crlf ident\n")
    manifest, ledger = b"SNAPOPS-MANIFEST 2\nrun r\n", b"line 1\r\n$Id: not-git $\n"
    write(repo, "snapshots/r/MANIFEST", manifest)
    write(repo, "ledger/r.ledger", ledger)
    tool = repo.path / "tool.sh"
    tool.write_bytes(b"#!/bin/sh\n")
    tool.chmod(0o755)
    (repo.path / "link").symlink_to("tool.sh")
    repo.commit_generation([".gitattributes", "snapshots/r/MANIFEST", "ledger/r.ledger",
                            "tool.sh", "link"], "gen 1", "r/gen-000001")
    files = tree(repo)
    assert files["snapshots/r/MANIFEST"] == manifest and files["ledger/r.ledger"] == ledger
    modes = {name: meta.split()[0] for meta, name in (
        line.split("\t") for line in git("ls-tree", "-r", "HEAD", cwd=repo.path).splitlines())}
    assert modes == {".gitattributes": "100644", "snapshots/r/MANIFEST": "100644",
                     "ledger/r.ledger": "100644", "tool.sh": "100755", "link": "120000"}
    assert files["link"] == b"tool.sh"    # what git add stores for these, as before
