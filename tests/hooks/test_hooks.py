"""Git hooks and CI verification in real repositories: real ``git`` runs the installed hook
scripts, which run the installed ``snapops``; every tree is checked as whole generations."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from snapops.hooks.install import CHAINED_SUFFIX, install_hooks, uninstall_hooks

from .genrepo import (
    LEDGER, MANIFEST, SNAPOPS, GenRepo, git_env, guarded_remote, make_repo, state, tag,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARD = "snapshots/run1/shards/0000.wtxt"


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return git_env(tmp_path)


@pytest.fixture
def repo(tmp_path, env, keydir) -> GenRepo:
    """A work tree with our hooks, requiring signed and HMAC'd generations."""
    make_repo(tmp_path / "work", env)
    r = GenRepo(tmp_path / "work", env, keydir)
    install_hooks(r.path, command=[SNAPOPS])
    r.git("config", "snapops.trustedKeys", str(keydir / "signing.pub"))
    r.git("config", "snapops.requireSignature", "true")
    r.git("config", "snapops.hmacKey", str(keydir / "hmac.key"))
    r.git("config", "snapops.requireHmac", "true")
    return r


def flip(path: Path, at: int | None = None) -> None:
    """Change one byte (default: the middle one) to another printable byte."""
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    path.write_bytes(bytes(data))


def test_generations_commit_and_a_tampered_shard_is_refused(repo):
    accepted = repo.generation(1)
    assert repo.head() == accepted
    repo.write(2)
    flip(repo.path / SHARD)
    refused = repo.commit("gen 2, tampered", check=False)
    assert refused.returncode == 1
    assert f"snapops pre-commit: {SHARD}: [digest] file bytes do not match the MANIFEST digest" \
        in refused.stderr, refused.stderr
    assert "commit refused: 1 problem(s)" in refused.stderr
    assert repo.out("rev-list", "--count", "HEAD") == "1"


@pytest.mark.parametrize("use_worktree", ["true", "false"])
def test_the_staged_tree_is_verified_not_the_work_tree(repo, use_worktree):
    repo.git("config", "snapops.useWorktree", use_worktree)
    repo.generation(1)
    repo.write(2)
    good = (repo.path / SHARD).read_bytes()
    flip(repo.path / SHARD)
    repo.git("add", "-A")
    (repo.path / SHARD).write_bytes(good)            # work tree good, index tampered
    refused = repo.git("commit", "-q", "-m", "staged tampered", check=False)
    assert refused.returncode == 1 and f"{SHARD}: [digest]" in refused.stderr
    repo.git("add", "-A")                            # index good ...
    flip(repo.path / SHARD)                          # ... work tree tampered
    assert repo.git("commit", "-q", "-m", "staged good", check=False).returncode == 0


def test_unsigned_generation_is_refused_when_signatures_are_required(repo):
    repo.extra = {}
    repo.write(1)
    (repo.path / MANIFEST).write_bytes(  # strip the seal: an unsigned generation
        re.sub(rb"keyid=[0-9a-f]{16}", b"keyid=-", (repo.path / MANIFEST).read_bytes()))
    refused = repo.commit("unsigned", check=False)
    assert refused.returncode == 1 and f"{MANIFEST}:" in refused.stderr, refused.stderr
    assert "[signature]" in refused.stderr or "[hmac]" in refused.stderr


def test_edited_or_deleted_ledger_line_is_refused(repo):
    repo.generation(1)
    repo.generation(2)
    path = repo.path / LEDGER
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0].replace(b"build=b1", b"build=b2") + lines[1])
    refused = repo.commit("edit ledger", check=False)
    assert refused.returncode == 1
    assert f"{LEDGER}:1: [append-only] line 1 of HEAD was changed" in refused.stderr
    path.write_bytes(lines[0])
    refused = repo.commit("drop a line", check=False)
    assert f"{LEDGER}:2: [append-only] 1 line(s) of HEAD removed" in refused.stderr
    repo.git("rm", "-q", "-f", LEDGER)
    refused = repo.git("commit", "-q", "-m", "delete ledger", check=False)
    assert refused.returncode == 1 and f"{LEDGER}: [append-only] ledger deleted" in refused.stderr


@pytest.mark.parametrize("path,rule", [
    ("snapshots/notes.txt", "layout"), ("ledger/foo.txt", "layout"),
    ("snapshots/run1/shards/extra.wtxt", "fileset"), ("Snapshots/run1/x", "layout"),
])
def test_files_no_rule_recognises_are_refused(repo, path, rule):
    repo.generation(1)
    target = repo.path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("hello\n")
    refused = repo.commit("stray file", check=False)
    assert refused.returncode == 1 and f"{path}: [{rule}]" in refused.stderr, refused.stderr
    os.unlink(target)
    (repo.path / "README.md").write_text("outside snapshots/ and ledger/: not our business\n")
    assert repo.commit("readme").returncode == 0


def test_a_run_changed_without_a_new_generation_is_refused(repo):
    repo.generation(1)
    wsum = repo.path / "snapshots/run1/shards/0000.wtxt"
    wsum.chmod(0o755)  # a mode change is a change of the run's files
    refused = repo.commit("chmod", check=False)
    assert refused.returncode == 1
    assert f"{MANIFEST}: [generation] files of run run1 changed without a new generation" \
        in refused.stderr, refused.stderr


def test_install_is_idempotent_chains_existing_hook_and_uninstall_restores(tmp_path, env):
    r = make_repo(tmp_path / "work", env)
    hooks = r.path / ".git" / "hooks"
    ran = tmp_path / "existing-ran"
    original = f"#!/bin/sh\necho existing >> {ran}\nexit ${{EXISTING_STATUS:-0}}\n"
    (hooks / "pre-commit").write_text(original)
    (hooks / "pre-commit").chmod(0o755)

    first = {a.name: a.action for a in install_hooks(r.path)}
    assert first == {"pre-commit": "chained", "pre-push": "installed"}
    snapshot_of = {p.name: p.read_bytes() for p in hooks.iterdir()}
    second = {a.name: a.action for a in install_hooks(r.path)}
    assert second == {"pre-commit": "unchanged", "pre-push": "unchanged"}
    assert {p.name: p.read_bytes() for p in hooks.iterdir()} == snapshot_of
    assert (hooks / f"pre-commit{CHAINED_SUFFIX}").read_text() == original

    (r.path / "a.txt").write_text("a\n")
    r.git("add", "-A")
    assert r.git("commit", "-q", "-m", "plain file").returncode == 0
    assert ran.read_text() == "existing\n"           # the chained hook still runs
    (r.path / "b.txt").write_text("b\n")
    r.git("add", "-A")
    refused = r.git("commit", "-q", "-m", "refused by the chained hook", check=False,
                    env=env | {"EXISTING_STATUS": "3"})
    assert refused.returncode == 1 and ran.read_text() == "existing\nexisting\n"

    assert {a.name: a.action for a in uninstall_hooks(r.path)} == {
        "pre-commit": "restored", "pre-push": "removed", "pre-receive": "absent"}
    assert (hooks / "pre-commit").read_text() == original
    assert os.access(hooks / "pre-commit", os.X_OK)
    assert not (hooks / "pre-push").exists()
    assert not (hooks / f"pre-commit{CHAINED_SUFFIX}").exists()


def test_hook_runs_snapops_with_one_blas_thread_unless_the_user_chose(tmp_path, env):
    """The installed script gives snapops OPENBLAS_NUM_THREADS=1 (idle BLAS threads cost a
    hook 0.1 CPU-s at start-up), keeps a value the user set, and leaves chained hooks alone."""
    r = make_repo(tmp_path / "work", env)
    hooks = r.path / ".git" / "hooks"
    seen, chained_seen = tmp_path / "seen", tmp_path / "chained-seen"
    (hooks / "pre-commit").write_text(
        f"#!/bin/sh\necho \"${{OPENBLAS_NUM_THREADS-unset}}\" >> {chained_seen}\n")
    (hooks / "pre-commit").chmod(0o755)
    recorder = tmp_path / "record-snapops"
    recorder.write_text(f"#!/bin/sh\necho \"$1 $2 $OPENBLAS_NUM_THREADS\" >> {seen}\n")
    recorder.chmod(0o755)
    install_hooks(r.path, hooks=("pre-commit",), command=[str(recorder)])
    base = {k: v for k, v in env.items() if k != "OPENBLAS_NUM_THREADS"}
    for n, extra in enumerate(({}, {"OPENBLAS_NUM_THREADS": "3"})):
        (r.path / f"{n}.txt").write_text("a\n")
        r.git("add", "-A")
        assert r.git("commit", "-q", "-m", str(n), env=base | extra).returncode == 0
    assert seen.read_text().splitlines() == ["hook pre-commit 1", "hook pre-commit 3"]
    assert chained_seen.read_text().splitlines() == ["unset", "3"]


def test_cli_install_in_bare_repository_adds_pre_receive_and_fsck(tmp_path, env):
    bare = make_repo(tmp_path / "remote.git", env, bare=True)
    out = subprocess.run([SNAPOPS, "hooks", "install", str(bare.path)], env=env, text=True,
                         capture_output=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()] == ["installed"] * 2 + ["configured"] * 2
    assert not (bare.path / "hooks" / "pre-commit").exists()     # no commits are made there
    assert "receive.fsckObjects=true" in out and "core.looseCompression=0" in out
    assert bare.out("config", "receive.fsckObjects") == "true"
    assert bare.out("config", "core.looseCompression") == "0"
    script = (bare.path / "hooks" / "pre-receive").read_text()
    assert 'hook pre-receive "$@" < "$input"' in script and SNAPOPS in script
    again = subprocess.run([SNAPOPS, "hooks", "install", str(bare.path)], env=env, text=True,
                           capture_output=True, check=True).stdout
    assert [line.split()[0] for line in again.splitlines()] == ["unchanged"] * 2 + ["kept"] * 2


def test_pre_push_refuses_locally_and_pre_receive_on_the_server(repo, tmp_path, env, keydir):
    remote = guarded_remote(tmp_path / "remote.git", env, keydir)
    repo.git("remote", "add", "origin", str(remote.path))
    repo.generation(1)
    pushed = repo.push("main", tag(1), verify=True)
    assert pushed.returncode == 0 and "snapops pre-receive: OK" in pushed.stderr, pushed.stderr
    repo.write(2)
    flip(repo.path / SHARD)
    repo.commit("gen 2 tampered", "--no-verify")
    bad = repo.head()
    refused = repo.push("main", verify=True)
    assert refused.returncode != 0
    assert f'snapops pre-push: commit {bad[:12]} "gen 2 tampered": {SHARD}: [digest]' \
        in refused.stderr, refused.stderr
    rejected = repo.push("main")
    assert rejected.returncode != 0 and "pre-receive hook declined" in rejected.stderr
    assert f'remote: snapops pre-receive: commit {bad[:12]} "gen 2 tampered": {SHARD}: ' \
        "[digest]" in rejected.stderr, rejected.stderr
    assert remote.out("rev-parse", "main") != bad


def ci(repo: GenRepo, rng: str, *extra: str) -> subprocess.CompletedProcess:
    return repo.snapops("verify", "--ci", "--range", rng, *extra)


def test_ci_range_names_the_bad_commit(repo):
    repo.generation(1)
    base = repo.head()
    repo.write(2)
    flip(repo.path / SHARD)
    repo.commit("gen 2 tampered", "--no-verify")
    bad = repo.head()
    (repo.path / "notes.txt").write_text("later\n")
    repo.commit("unrelated")
    failed = ci(repo, f"{base}..HEAD")
    assert failed.returncode == 1
    assert f'snapops ci: commit {bad[:12]} "gen 2 tampered": {SHARD}: [digest]' in failed.stderr
    assert failed.stderr.count(f"commit {bad[:12]}") == 1 and "unrelated" not in failed.stderr
    assert ci(repo, f"{'0' * 40}..{base}").returncode == 0      # a new branch: whole history
    assert ci(repo, f"{bad}..HEAD").returncode == 0
    listed = ci(repo, f"{base}..HEAD", "--json")
    assert [o["commit"] for o in json.loads(listed.stdout) if not o["ok"]] == [bad]
    usage = ci(repo, "nope..HEAD")
    assert usage.returncode == 2 and "nope is not a commit" in usage.stderr


def test_streaming_shard_with_its_wsum(repo):
    repo.extra = {"streaming_threshold": 500}
    repo.generation(1)
    repo.write(2)
    wsum = next((repo.path / "snapshots/run1/shards").glob("*.wsum"))
    flip(wsum, wsum.read_bytes().index(b"sha256_all=") + 11)
    refused = repo.commit("gen 2, tampered WSUM", check=False)
    assert refused.returncode == 1
    assert f"{wsum.relative_to(repo.path).as_posix()}: [digest]" in refused.stderr


def test_pre_commit_framework_manifest(repo):
    (manifest,) = yaml.safe_load((REPO_ROOT / ".pre-commit-hooks.yaml").read_text())
    assert manifest["id"] == "snapops-verify" and manifest["pass_filenames"] is False
    entry = manifest["entry"].split()
    repo.generation(1)
    base = repo.head()
    repo.write(2, state(5))
    flip(repo.path / SHARD)
    repo.git("add", "-A")
    staged = subprocess.run(entry, cwd=repo.path, env=repo.env, text=True, capture_output=True)
    assert staged.returncode == 1 and f"{SHARD}: [digest]" in staged.stderr, staged.stderr
    repo.git("commit", "-q", "--no-verify", "-m", "bad")
    pushed = subprocess.run(entry, cwd=repo.path, text=True, capture_output=True,
                            env=repo.env | {"PRE_COMMIT_FROM_REF": base,
                                            "PRE_COMMIT_TO_REF": repo.head()})
    assert pushed.returncode == 1 and f"commit {repo.head()[:12]}" in pushed.stderr


def test_ci_examples_run_the_range_check():
    for name in ("github-actions.yml", "gitlab-ci.yml"):
        text = (REPO_ROOT / "deploy" / "ci" / name).read_text()
        assert yaml.safe_load(text)
        assert 'snapops verify --ci --range "$BASE..' in text


def test_hook_input_and_config_errors_exit_2(tmp_path, env):
    bare = make_repo(tmp_path / "remote.git", env, bare=True)

    def hook(text: str):
        return subprocess.run([SNAPOPS, "hook", "pre-receive"], cwd=bare.path, env=env,
                              input=text, text=True, capture_output=True)

    deleted = hook(f"{'1' * 40} {'0' * 40} refs/heads/gone\n")
    assert deleted.returncode == 0 and deleted.stderr == ""
    malformed = hook("old new refs/heads/main\n")
    assert malformed.returncode == 2 and "[input] malformed hook input" in malformed.stderr
    binary = subprocess.run([SNAPOPS, "hook", "pre-receive"], cwd=bare.path, env=env,
                            input=b"\xff\x1b[2J" + b"x" * 500 + b"\n", capture_output=True)
    assert binary.returncode == 2 and b"Traceback" not in binary.stderr
    assert b"malformed hook input" in binary.stderr and b"\x1b" not in binary.stderr
    assert len(binary.stderr.splitlines()) == 1 and len(binary.stderr) < 400
    with open("/dev/zero", "rb") as endless:       # never ends: refused after a bound
        flood = subprocess.run([SNAPOPS, "hook", "pre-receive"], cwd=bare.path, env=env,
                               stdin=endless, capture_output=True, text=True, timeout=120)
    assert flood.returncode == 2 and "more ref update lines than any push sends" in flood.stderr
    bare.git("config", "snapops.requireHmac", "true")
    unset = hook(f"{'1' * 40} {'0' * 40} refs/heads/gone\n")
    assert unset.returncode == 2 and "snapops.hmacKey is not set" in unset.stderr
    bare.git("config", "--unset", "snapops.requireHmac")
    bare.git("config", "snapops.maxBlobSize", "lots")
    bad = hook(f"{'1' * 40} {'0' * 40} refs/heads/gone\n")
    assert bad.returncode == 2 and "snapops.maxBlobSize" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_pre_receive_reads_only_shards_the_accepted_parent_does_not_have(repo, tmp_path, env,
                                                                          keydir):
    remote = guarded_remote(tmp_path / "remote.git", env, keydir)
    remote.git("config", "snapops.verbose", "true")
    repo.git("remote", "add", "origin", str(remote.path))
    repo.generation(1)
    first = repo.push("main")
    assert first.returncode == 0 and "not read again" not in first.stderr, first.stderr
    repo.generation(2)
    second = repo.push("main")
    assert second.returncode == 0, second.stderr
    reused = re.search(r"note: snapshots/run1/MANIFEST: (\d+) of (\d+) shard\(s\) unchanged "
                       r"since a generation verified before", second.stderr)
    assert reused and 0 < int(reused[1]) < int(reused[2]), second.stderr
