"""snapops.formats.gitcmd against the real git: limits end the whole process group, a killed
push leaves no quarantine folder in a local remote, the guard ends git children when their
owner is SIGKILLed, messages are redacted, streams stop early."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from snapops.daemon.gitops import SnapshotRepo
from snapops.formats.errors import GitError, PushError
from snapops.formats.gitcmd import GitExit, invocations, open_git, run_git
from tests.daemon.gitserve import git

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def wait_gone(pid: int, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def read_pid(path: Path, within: float = 20.0) -> int:
    deadline = time.monotonic() + within
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return int(path.read_text())


def napping_alias(pidfile: Path, seconds: int = 60) -> list[str]:
    """git arguments that start a silent grandchild (``sleep``) writing its pid first."""
    return ["-c", f"alias.nap=!sh -c 'echo $$ > {pidfile}; exec sleep {seconds}'", "nap"]


def test_a_stall_ends_git_and_everything_it_started(tmp_path):
    pidfile = tmp_path / "nap.pid"
    before = invocations()
    with pytest.raises(GitError, match=r"git nap failed: stalled: no progress for 0.5 s") as info:
        run_git(napping_alias(pidfile), cwd=tmp_path, stall=0.5, what="nap")
    assert isinstance(info.value.__cause__, GitExit) and info.value.__cause__.killed
    assert wait_gone(read_pid(pidfile))
    assert invocations() == before + 1


def test_timeout_cancel_and_plain_failures_are_typed(tmp_path):
    with pytest.raises(GitError, match=r"did not finish in 0.3 s"):
        run_git(napping_alias(tmp_path / "a.pid"), cwd=tmp_path, timeout=0.3, what="nap")
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(GitError, match=r"nap failed: cancelled"):
        run_git(napping_alias(tmp_path / "b.pid"), cwd=tmp_path, cancel=cancel, what="nap")
    for pidfile in (tmp_path / "a.pid", tmp_path / "b.pid"):
        assert wait_gone(read_pid(pidfile))
    failed = run_git(["rev-parse", "--verify", "nope"], cwd=tmp_path, check=False)
    assert failed.returncode != 0 and not failed.ok
    with pytest.raises(GitError, match=r"^somewhere: git rev-parse failed: fatal: "):
        run_git(["rev-parse", "--verify", "nope"], cwd=tmp_path, where="somewhere")


def test_secrets_are_redacted_from_git_output(tmp_path):
    url = str(tmp_path / "token-s3cret" / "x.git")
    with pytest.raises(PushError, match=r"does not appear to be a git repository") as info:
        run_git(["ls-remote", url], cwd=tmp_path, error=PushError,
                redact={url: "REMOTE"}, where="ls-remote REMOTE")
    assert "s3cret" not in str(info.value) and "'REMOTE'" in str(info.value)


def slow_local_remote(tmp_path: Path) -> tuple[Path, Path, SnapshotRepo]:
    """A bare remote whose pre-receive hook is silent for a minute (the pushed objects wait in
    its quarantine meanwhile), and a repository with one 4 MiB generation to push there."""
    bare = tmp_path / "remote.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    pidfile = tmp_path / "hook.pid"
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    hook.chmod(0o755)
    repo = SnapshotRepo(tmp_path / "repo")
    (repo.path / "big").write_bytes(os.urandom(4 << 20))
    repo.commit_generation(["big"], "gen 1", "r/gen-000001")
    return bare, pidfile, repo


def quarantine(bare: Path) -> list[Path]:
    return list((bare / "objects").glob("tmp_objdir-incoming-*"))


def test_a_killed_push_leaves_no_quarantine_in_a_local_remote(tmp_path):
    """A local remote's receive-pack runs in the push's process group: ended leaves first,
    it removes its incoming objects (killed itself, it leaves objects/tmp_objdir-incoming-*)."""
    bare, pidfile, repo = slow_local_remote(tmp_path)
    with pytest.raises(PushError, match=r"stalled: no progress for 1 s"):
        repo.push(str(bare), ["r/gen-000001"], stall=1.0)
    assert wait_gone(read_pid(pidfile))
    assert not quarantine(bare)
    assert git("for-each-ref", cwd=bare) == ""


def test_a_sigkilled_owner_leaves_no_quarantine_in_a_local_remote(tmp_path):
    bare, pidfile, _ = slow_local_remote(tmp_path)
    script = ("import sys\nfrom snapops.daemon.gitops import SnapshotRepo\n"
              "from snapops.formats.gitcmd import children\nchildren.start()\n"
              "SnapshotRepo(sys.argv[1]).push(sys.argv[2], ['r/gen-000001'])\n")
    owner = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "repo"), str(bare)],
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    hook = read_pid(pidfile)
    assert quarantine(bare)  # the pack waits there while the hook runs
    owner.send_signal(signal.SIGKILL)
    owner.wait(30)
    assert wait_gone(hook)
    deadline = time.monotonic() + 20
    while quarantine(bare) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not quarantine(bare)


GUARDED = textwrap.dedent("""
    import sys
    from snapops.formats.gitcmd import children, run_git
    if sys.argv[2] == "guarded":
        children.start()
    run_git(["-c", "alias.nap=!sh -c 'echo $$ > " + sys.argv[1] + "; exec sleep 60'", "nap"])
""")


@pytest.mark.parametrize("guarded", [True, False])
def test_git_children_die_with_their_owner_only_when_guarded(tmp_path, guarded):
    pidfile = tmp_path / "nap.pid"
    owner = subprocess.Popen([sys.executable, "-c", GUARDED, str(pidfile),
                              "guarded" if guarded else "bare"], cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    sleeper = read_pid(pidfile)
    owner.send_signal(signal.SIGKILL)
    owner.wait(30)
    try:
        if guarded:
            assert wait_gone(sleeper)
        else:
            time.sleep(0.5)
            assert alive(sleeper)  # what happened to the daemon's git children before
    finally:
        if alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def test_open_git_stops_early_and_reports_failures_after_a_full_read(tmp_path):
    with SnapshotRepo(tmp_path / "repo") as repo:
        (repo.path / "f").write_bytes(b"x" * (1 << 20))
        repo.commit_generation(["f"], "gen 1", "r/gen-000001")
        oid = git("rev-parse", "HEAD:f", cwd=repo.path)
        with open_git(["cat-file", "blob", oid], cwd=repo.path) as blob:
            assert blob.read(4) == b"xxxx"  # leaving now stops git: no error, nothing left
        with pytest.raises(GitError, match=r"git cat-file blob failed: fatal: "):
            with open_git(["cat-file", "blob", "0" * 40], cwd=repo.path) as blob:
                blob.read()


def test_small_blobs_reads_many_in_one_git_and_never_more_than_its_limit(tmp_path):
    """One ``cat-file --batch`` for every spec: blobs by spec, None for what names nothing
    or no blob; reading stops before an object that would pass the limit (None when it is
    the first, else left unanswered), so a tag pointing at a huge blob costs nothing."""
    from snapops.hooks.gitio import Git

    with SnapshotRepo(tmp_path / "repo") as repo:
        (repo.path / "d").mkdir()
        for name, size in (("a", 10), ("b", 20), ("big", 5000), ("c", 30), ("d/e", 1)):
            (repo.path / name).write_bytes(name[-1].encode() * size)
        repo.commit_generation(["a", "b", "big", "c", "d"], "gen 1", "r/gen-000001")
        g = Git(repo.path)
        before = invocations()
        found = g.small_blobs(["HEAD:a", "HEAD:nothing", "HEAD:d", "HEAD:b with space",
                               "HEAD:b", "nope^{commit}:a"], 100)
        assert invocations() - before == 1
        assert found == {"HEAD:a": b"a" * 10, "HEAD:nothing": None, "HEAD:d": None,
                         "HEAD:b with space": None, "HEAD:b": b"b" * 20,
                         "nope^{commit}:a": None}
        assert g.small_blobs(["HEAD:a", "HEAD:big", "HEAD:c"], 1000) == {"HEAD:a": b"a" * 10}
        assert g.small_blobs(["HEAD:big", "HEAD:c"], 1000) == {"HEAD:big": None}
        assert g.small_blobs(["HEAD:a", "HEAD:b", "HEAD:c"], 35) == {"HEAD:a": b"a" * 10,
                                                                     "HEAD:b": b"b" * 20}
        with pytest.raises(ValueError, match="line feed"):
            g.small_blobs(["HEAD:a\nHEAD:b"], 100)
        many = ["HEAD:a", "HEAD:b", "HEAD:c"] + \
            [f"HEAD:missing-{k:05d}" for k in range(2000)]        # 40 KiB of questions
        before = invocations()
        found = g.small_blobs(many, 1000)
        assert invocations() - before == 3 and len(found) == len(many)
        assert [found[s] for s in many[:3]] == [b"a" * 10, b"b" * 20, b"c" * 30]
        assert g.small_blobs(many[:3] + ["HEAD:big"] + many, 1000) == \
            {"HEAD:a": b"a" * 10, "HEAD:b": b"b" * 20, "HEAD:c": b"c" * 30}
        with pytest.raises(ValueError, match="at most 16384"):
            with open_git(["cat-file", "--batch"], cwd=repo.path, input=b"x" * 20_000):
                pass


def test_older_manifests_are_read_a_window_at_a_time(tmp_path):
    """A residual chain asks for gen g, then g-1, ...: the first question reads the
    ``BASE_WINDOW`` gens up to g in one git process, the next ones are answered from it."""
    from snapops.formats.lfs.source import BASE_WINDOW, tag_manifests
    from snapops.hooks.gitio import Git

    with SnapshotRepo(tmp_path / "repo") as repo:
        folder = repo.path / "snapshots" / "r"
        folder.mkdir(parents=True)
        for gen in range(1, 12):
            (folder / "MANIFEST").write_text(f"manifest of {gen}\n")
            repo.commit_generation(["snapshots"], f"gen {gen}", f"r/gen-{gen:06d}")
        read = tag_manifests(Git(repo.path), "r")
        before = invocations()
        assert read(11) == b"manifest of 11\n"
        assert [read(g) for g in range(10, 11 - BASE_WINDOW, -1)] == \
            [f"manifest of {g}\n".encode() for g in range(10, 11 - BASE_WINDOW, -1)]
        assert invocations() - before == 1
        assert read(2) == b"manifest of 2\n" and read(12) is None and read(0) is None
        assert invocations() - before == 4      # a gen not yet held: asked for again


def _two_repositories(tmp_path: Path) -> tuple[Path, Path, str, str]:
    heads = []
    for name in ("named", "other"):
        repo = tmp_path / name
        git("init", "-q", "-b", "main", str(repo))
        git("-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
            "--allow-empty", "-m", name)
        heads.append(git("-C", str(repo), "rev-parse", "HEAD").strip())
    return tmp_path / "named", tmp_path / "other", heads[0], heads[1]


def test_a_named_repository_wins_over_git_variables_inherited_from_a_hook(tmp_path,
                                                                          monkeypatch):
    """git exports GIT_DIR, GIT_INDEX_FILE, the quarantine... to the hooks it runs. A snapops
    command started from a hook of another repository (a post-merge hook restoring weights,
    say) inherited them, and every git call it made read that other repository: `snapops
    verify REPO --rev HEAD` verified the other one's HEAD, the daemon would commit there.
    Only `snapops hook` (run_as_hook) keeps them: they are meant for it."""
    import snapops.formats.gitcmd as gitcmd

    named, other, named_head, other_head = _two_repositories(tmp_path)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    head = run_git(["rev-parse", "HEAD"], cwd=named).stdout.decode().strip()
    assert head == named_head
    proc = subprocess.run([sys.executable, "-m", "snapops", "verify", str(named), "--run", "r",
                           "--rev", "HEAD"], capture_output=True, text=True, timeout=120)
    assert f"commit {named_head[:12]}" in proc.stdout + proc.stderr
    assert other_head[:12] not in proc.stdout + proc.stderr
    monkeypatch.setattr(gitcmd, "_as_hook", True)
    assert run_git(["rev-parse", "HEAD"], cwd=named).stdout.decode().strip() == other_head


def test_the_daemon_forgets_git_variables_for_gitpython(monkeypatch):
    from snapops.formats.gitcmd import LOCATING, forget_hook_environment

    for name in LOCATING:
        monkeypatch.setenv(name, "/elsewhere")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.abbrev'='12'")
    forget_hook_environment()
    assert not set(LOCATING) & set(os.environ)
    assert os.environ["GIT_CONFIG_PARAMETERS"] == "'core.abbrev'='12'"


def _source_with_a_big_blob(tmp_path: Path, nbytes: int) -> Path:
    """A bare repository whose main holds one incompressible blob, stored loose at level 0."""
    src = tmp_path / "src.git"
    git("init", "-q", "--bare", "-b", "main", str(src))
    git("config", "core.looseCompression", "0", cwd=src)
    (tmp_path / "big.bin").write_bytes(os.urandom(nbytes))
    blob = git("hash-object", "-w", str(tmp_path / "big.bin"), cwd=src)
    tree = subprocess.run(["git", "mktree"], cwd=src, input=f"100644 blob {blob}\tbig.bin\n",
                          capture_output=True, text=True, check=True).stdout.strip()
    commit = git("-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", "-m", "big", tree,
                 cwd=src)
    git("update-ref", "refs/heads/main", commit, cwd=src)
    return src


def test_a_fetch_that_would_leave_its_disk_low_is_stopped_and_leaves_no_partial_pack(tmp_path):
    """A remote sending more than the disk can spare: the fetch is ended (with whatever git
    started), says why in one line, and git's temporary pack goes with it. (Another test
    freeing space meanwhile could let one attempt fit: three attempts.)"""
    from snapops.formats.gitwatch import DiskLow, _free_bytes
    from snapops.remote import LOCAL_UPLOAD_PACK

    src = _source_with_a_big_blob(tmp_path, 64 << 20)
    for attempt in range(3):
        dest = tmp_path / f"dest{attempt}.git"
        git("init", "-q", "--bare", str(dest))
        floor = _free_bytes(dest) - (8 << 20)       # the 64 MiB pack cannot fit above it
        try:
            run_git(["fetch", "-q", f"--upload-pack={LOCAL_UPLOAD_PACK}", f"file://{src}",
                     "+refs/heads/main:refs/heads/main"], cwd=dest, what="fetch",
                    keep_free=(dest, floor))
        except DiskLow as exc:          # a GitError of its own kind: not "not there"
            caught = str(exc)
            break
    else:
        pytest.fail("three fetches that could not fit were not stopped")
    assert re.fullmatch(r"git fetch failed: stopped: less than \d+ MiB left free on the disk "
                        r"holding \S+dest\d\.git \(.*", caught), caught
    assert not list((dest / "objects" / "pack").glob("tmp_*"))
    assert run_git(["rev-parse", "--verify", "-q", "refs/heads/main"], cwd=dest,
                   check=False).returncode != 0


def test_a_fetch_keeps_a_gibibyte_free_or_half_of_a_nearly_full_disk(tmp_path):
    from snapops.formats.gitwatch import FETCH_KEEPS_FREE, _free_bytes, fetch_floor

    folder, least = fetch_floor(tmp_path)
    assert folder == str(tmp_path)
    assert least == min(FETCH_KEEPS_FREE, _free_bytes(tmp_path) // 2) or \
        abs(least - min(FETCH_KEEPS_FREE, _free_bytes(tmp_path) // 2)) < (64 << 20)
