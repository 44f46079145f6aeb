"""Git hooks and CI verification in real repositories: real ``git`` runs the installed hook
scripts, which run the installed ``snapops`` (the venv's bin is put first on PATH)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from snapops.daemon.ledger import Ledger, LedgerEntry
from snapops.formats import wtxt
from snapops.formats.integrity import merkle_link
from snapops.hooks.install import CHAINED_SUFFIX, install_hooks, uninstall_hooks

TS = "2026-01-02T03:04:05Z"
SNAP = "snapshots/run1/s.wtxt"
LEDGER = "ledger/run1.ledger"
REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A git environment free of the user's config, with this venv's snapops first on PATH."""
    home = tmp_path / "home"
    home.mkdir()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "SNAPOPS_"))}
    return keep | {
        "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "PATH": f"{VENV_BIN}{os.pathsep}"
        f"{os.environ.get('PATH', '')}", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e",
        "GIT_AUTHOR_DATE": "2026-01-02T03:04:05Z", "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z"}


class Repo:
    """A work tree driven with the real git CLI."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path, self.env = path, env

    def git(self, *args: str, check: bool = True, input: str | None = None):
        proc = subprocess.run(["git", *args], cwd=self.path, env=self.env, text=True,
                              capture_output=True, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def commit(self, message: str, *extra: str, check: bool = True):
        self.git("add", "-A")
        return self.git("commit", "-q", "-m", message, *extra, check=check)

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").stdout.strip()

    def snapshot(self, gen: int, prev: str | None, *, keys: Path | None, seed: int | None = None,
                 ledger: bool = True, **options):
        """Write generation ``gen`` at the stable path SNAP and append its ledger entry."""
        rng = np.random.default_rng(gen if seed is None else seed)
        state = {"b": rng.integers(0, 100, 5, dtype=np.int64),
                 "w": rng.standard_normal((64, 16)).astype(np.float32)}
        path = self.path / SNAP
        path.parent.mkdir(parents=True, exist_ok=True)
        signing = {"sign_key": keys / "signing.key"} if keys else {}
        result = wtxt.save(state, path, gen=gen, ts=TS, row_blocking=True, rows_per_chunk=16,
                           merkle_prev=prev, **signing, **options)
        if ledger:
            (self.path / "ledger").mkdir(exist_ok=True)
            Ledger(self.path / LEDGER).append_snapshot(path, root=self.path)
        return result


def make_repo(path: Path, env: dict[str, str], *, bare: bool = False) -> Repo:
    args = ["git", "init", "-q", "-b", "main"] + (["--bare"] if bare else []) + [str(path)]
    subprocess.run(args, check=True, env=env)
    return Repo(path, env)


@pytest.fixture
def repo(tmp_path, env, keydir) -> Repo:
    """A repository with our hooks, requiring signatures by the test keys."""
    r = make_repo(tmp_path / "work", env)
    install_hooks(r.path, command=[str(VENV_BIN / "snapops")])
    r.git("config", "snapops.trustedKeys", str(keydir))
    r.git("config", "snapops.requireSignature", "true")
    return r


def tamper_b64(path: Path, line_no: int) -> None:
    """Change one base64 character of ``line_no`` (1-based), keeping the line's length."""
    lines = path.read_bytes().split(b"\n")
    line = bytearray(lines[line_no - 1])
    line[5] = ord("A") if line[5] != ord("A") else ord("B")
    lines[line_no - 1] = bytes(line)
    path.write_bytes(b"\n".join(lines))


def first_b64_line(path: Path) -> int:
    """The number of the first full-width base64 line (of array w)."""
    lines = path.read_bytes().split(b"\n")
    for no, line in enumerate(lines, 1):
        if line.startswith(b"ch ") and len(lines[no]) >= 76:
            return no + 1
    raise AssertionError("no ch line")


@pytest.mark.parametrize("use_worktree", ["true", "false"])
def test_signed_snapshot_commits_and_tampered_is_refused(repo, keydir, use_worktree):
    repo.git("config", "snapops.useWorktree", use_worktree)
    gen1 = repo.snapshot(1, None, keys=keydir)
    assert "OK, 2 snapshot/ledger file(s) verified" in repo.commit("gen 1").stderr

    repo.snapshot(2, gen1.merkle_this, keys=keydir)
    line = first_b64_line(repo.path / SNAP) + 1
    tamper_b64(repo.path / SNAP, line)
    refused = repo.commit("gen 2, tampered", check=False)
    assert refused.returncode == 1
    assert re.search(rf"{re.escape(SNAP)}:{line}: \[(parity|base64|crc32c)\]", refused.stderr), \
        refused.stderr
    assert "commit refused" in refused.stderr
    assert repo.git("rev-list", "--count", "HEAD").stdout.strip() == "1"


def test_the_staged_blob_is_verified_not_the_work_tree(repo, keydir):
    gen1 = repo.snapshot(1, None, keys=keydir)
    repo.commit("gen 1")
    repo.snapshot(2, gen1.merkle_this, keys=keydir)
    good = (repo.path / SNAP).read_bytes()
    line = first_b64_line(repo.path / SNAP)
    tamper_b64(repo.path / SNAP, line)
    repo.git("add", "-A")
    (repo.path / SNAP).write_bytes(good)          # work tree good, index tampered
    refused = repo.git("commit", "-q", "-m", "staged tampered", check=False)
    assert refused.returncode == 1 and f"{SNAP}:{line}:" in refused.stderr

    repo.git("add", "-A")                         # index good ...
    tamper_b64(repo.path / SNAP, line)            # ... same-size work tree tampered
    accepted = repo.git("commit", "-q", "-m", "staged good", check=False)
    assert accepted.returncode == 0, accepted.stderr


def test_unsigned_snapshot_is_refused_when_signatures_are_required(repo):
    repo.snapshot(1, None, keys=None)
    refused = repo.commit("unsigned", check=False)
    assert refused.returncode == 1
    assert f"{SNAP}:4: [signature]" in refused.stderr, refused.stderr
    repo.git("config", "snapops.requireSignature", "false")
    repo.git("config", "--unset", "snapops.trustedKeys")
    assert repo.commit("unsigned, nothing required").returncode == 0


def test_edited_ledger_line_is_refused(repo, keydir):
    gen1 = repo.snapshot(1, None, keys=keydir)
    repo.commit("gen 1")
    repo.snapshot(2, gen1.merkle_this, keys=keydir)
    repo.commit("gen 2")
    path = repo.path / LEDGER
    lines = path.read_bytes().splitlines(keepends=True)
    lines[0] = lines[0].replace(b"build=unknown", b"build=unknowm")
    path.write_bytes(b"".join(lines))
    refused = repo.commit("edit ledger", check=False)
    assert refused.returncode == 1
    assert f"{LEDGER}:1: [append-only] line 1 of HEAD was changed" in refused.stderr
    assert f"{LEDGER}:1: [chain]" in refused.stderr

    path.write_bytes(b"".join(lines[:1]).replace(b"build=unknowm", b"build=unknown"))
    refused = repo.commit("drop a line", check=False)
    assert refused.returncode == 1 and f"{LEDGER}:2: [append-only] 1 line(s) of HEAD removed" \
        in refused.stderr, refused.stderr
    repo.git("rm", "-q", "-f", LEDGER)
    refused = repo.git("commit", "-q", "-m", "delete ledger", check=False)
    assert refused.returncode == 1 and f"{LEDGER}: [append-only] ledger deleted" in refused.stderr


def test_new_entry_must_match_its_snapshot_and_chain(repo, keydir):
    gen1 = repo.snapshot(1, None, keys=keydir)
    repo.commit("gen 1")
    repo.snapshot(2, gen1.merkle_this, keys=keydir, ledger=False)
    # a well-chained, well-formed entry that names the snapshot with a wrong sha256_all
    sha = "f" * 64
    forged = LedgerEntry(gen=2, ts=TS, sha256_all=sha, merkle_prev=gen1.merkle_this,
                         merkle_this=merkle_link(gen1.merkle_this, sha, TS, "000002", "unknown"),
                         path=SNAP, keyid=None)
    Ledger(repo.path / LEDGER).append(forged)
    refused = repo.commit("forged entry", check=False)
    assert refused.returncode == 1
    assert f"{LEDGER}:2: [file] snapshot {SNAP} does not match its entry" in refused.stderr

    repo.git("checkout", "-q", "HEAD", "--", LEDGER)
    Ledger(repo.path / LEDGER).append_snapshot(repo.path / SNAP, root=repo.path)
    assert repo.commit("gen 2").returncode == 0


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
    assert r.commit("plain file").returncode == 0
    assert ran.read_text() == "existing\n"           # the chained hook still runs
    r.env = r.env | {"EXISTING_STATUS": "3"}
    (r.path / "b.txt").write_text("b\n")
    refused = r.commit("refused by the chained hook", check=False)
    assert refused.returncode == 1 and ran.read_text() == "existing\nexisting\n"
    r.env = env

    assert {a.name: a.action for a in uninstall_hooks(r.path)} == {
        "pre-commit": "restored", "pre-push": "removed", "pre-receive": "absent"}
    assert (hooks / "pre-commit").read_text() == original
    assert os.access(hooks / "pre-commit", os.X_OK)
    assert not (hooks / "pre-push").exists()
    assert not (hooks / f"pre-commit{CHAINED_SUFFIX}").exists()


def test_cli_install_in_bare_repository_adds_pre_receive(tmp_path, env):
    bare = make_repo(tmp_path / "remote.git", env, bare=True)
    out = subprocess.run(["snapops", "hooks", "install", str(bare.path)], env=env, text=True,
                         capture_output=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()] == ["installed"] * 3
    script = (bare.path / "hooks" / "pre-receive").read_text()
    assert 'hook pre-receive "$@" < "$input"' in script and str(VENV_BIN / "snapops") in script


@pytest.fixture
def remote(tmp_path, env, keydir) -> Repo:
    bare = make_repo(tmp_path / "remote.git", env, bare=True)
    install_hooks(bare.path, command=[str(VENV_BIN / "snapops")])
    bare.git("config", "snapops.trustedKeys", str(keydir))
    bare.git("config", "snapops.requireSignature", "true")
    return bare


def test_pre_receive_accepts_clean_pushes_and_rejects_a_rewritten_ledger(repo, remote, keydir):
    repo.git("remote", "add", "origin", str(remote.path))
    gen1 = repo.snapshot(1, None, keys=keydir)
    repo.commit("gen 1")
    gen2 = repo.snapshot(2, gen1.merkle_this, keys=keydir)
    repo.commit("gen 2")
    pushed = repo.git("push", "-q", "origin", "main", check=False)
    assert pushed.returncode == 0, pushed.stderr
    assert "snapops pre-receive: OK" in pushed.stderr

    # an edited ledger line, committed past the local hook and pushed past pre-push
    path = repo.path / LEDGER
    path.write_bytes(path.read_bytes().replace(b"build=unknown", b"build=rewrite", 1))
    repo.commit("rewrite ledger", "--no-verify")
    bad = repo.head()
    refused = repo.git("push", "origin", "main", check=False)   # the client's pre-push
    assert refused.returncode != 0
    assert f'snapops pre-push: commit {bad[:12]} "rewrite ledger": {LEDGER}:1: [append-only]' \
        in refused.stderr, refused.stderr
    rejected = repo.git("push", "--no-verify", "origin", "main", check=False)
    assert rejected.returncode != 0 and "pre-receive hook declined" in rejected.stderr
    assert f'remote: snapops pre-receive: commit {bad[:12]} "rewrite ledger": {LEDGER}:1: ' \
        "[append-only]" in rejected.stderr, rejected.stderr
    assert remote.git("rev-parse", "main").stdout.strip() != bad

    # a whole history rewritten consistently (every commit valid on its own): only the
    # ref's old tip shows it, so force-pushing it is rejected too
    repo.git("checkout", "-q", "--orphan", "rewritten")
    repo.git("rm", "-q", "-r", "--cached", ".")
    (repo.path / LEDGER).unlink()
    repo.snapshot(1, None, keys=keydir, seed=99)
    repo.commit("rewritten gen 1")
    forced = repo.git("push", "--no-verify", "-f", "origin", "rewritten:main", check=False)
    assert forced.returncode != 0
    assert re.search(rf"remote: snapops pre-receive: ref refs/heads/main \w+\.\.\w+: "
                     rf"{re.escape(LEDGER)}:1: \[append-only\] line 1 of the old tip",
                     forced.stderr), forced.stderr
    assert remote.git("rev-parse", "main").stdout.strip() == \
        repo.git("rev-parse", "main~1").stdout.strip()

    repo.git("checkout", "-q", "-f", "main")
    repo.git("reset", "-q", "--hard", "HEAD~1")
    repo.snapshot(3, gen2.merkle_this, keys=keydir)
    repo.commit("gen 3")
    assert repo.git("push", "-q", "origin", "main", check=False).returncode == 0


def test_ci_range_names_the_bad_commit(repo, keydir):
    gen1 = repo.snapshot(1, None, keys=keydir)
    repo.commit("gen 1")
    base = repo.head()
    repo.snapshot(2, gen1.merkle_this, keys=keydir)
    line = first_b64_line(repo.path / SNAP)
    tamper_b64(repo.path / SNAP, line)
    repo.commit("gen 2 tampered", "--no-verify")
    bad = repo.head()
    (repo.path / "notes.txt").write_text("later\n")
    repo.commit("unrelated")

    def ci(rng: str, *extra: str):
        return subprocess.run(["snapops", "verify", "--ci", "--range", rng, *extra],
                              cwd=repo.path, env=repo.env, text=True, capture_output=True)

    failed = ci(f"{base}..HEAD")
    assert failed.returncode == 1
    assert f'snapops ci: commit {bad[:12]} "gen 2 tampered": {SNAP}:{line}: [' in failed.stderr
    assert failed.stderr.count(f"commit {bad[:12]}") == 1 and "unrelated" not in failed.stderr
    assert ci(f"{'0' * 40}..{base}").returncode == 0       # a new branch: whole history
    assert ci(f"{bad}..HEAD").returncode == 0
    listed = ci(f"{base}..HEAD", "--json")
    assert [o["commit"] for o in json.loads(listed.stdout) if not o["ok"]] == [bad]
    assert ci("nope..HEAD").returncode == 2


def test_streaming_snapshot_is_verified_with_its_staged_wsum(repo, keydir):
    gen1 = repo.snapshot(1, None, keys=keydir, streaming=True, hmac_key=keydir / "hmac.key")
    repo.git("config", "snapops.hmacKey", str(keydir / "hmac.key"))
    repo.git("config", "snapops.requireHmac", "true")
    assert repo.commit("gen 1 streaming").returncode == 0
    repo.snapshot(2, gen1.merkle_this, keys=keydir, streaming=True, hmac_key=keydir / "hmac.key")
    wsum = repo.path / (SNAP + ".wsum")
    text = wsum.read_bytes()
    at = text.index(b"sha256_all=") + len(b"sha256_all=")
    wsum.write_bytes(text[:at] + (b"0" if text[at:at + 1] != b"0" else b"1") + text[at + 1:])
    refused = repo.commit("gen 2, tampered WSUM", check=False)
    assert refused.returncode == 1
    assert f"{SNAP}.wsum:1: [signature] expected a WSUM signature by a trusted key" \
        in refused.stderr, refused.stderr
    assert f"{LEDGER}:2: [file] snapshot {SNAP} does not match its entry; expected sha256_all=" \
        in refused.stderr


def test_binary_format_blob_is_verified(repo):
    from snapops.formats import fold

    path = repo.path / "snapshots" / "run1" / "w.fold"
    path.parent.mkdir(parents=True)
    fold.save({"w": np.arange(4096, dtype=np.float32)}, path, compression="none")
    assert "OK, 1 snapshot/ledger file(s)" in repo.commit("fold").stderr
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    refused = repo.commit("fold, flipped bit", check=False)
    assert refused.returncode == 1 and "snapshots/run1/w.fold" in refused.stderr, refused.stderr
    assert "snapops-hook-" not in refused.stderr          # scratch paths never leak


def test_pre_commit_framework_manifest(repo, keydir):
    (manifest,) = yaml.safe_load((REPO_ROOT / ".pre-commit-hooks.yaml").read_text())
    assert manifest["id"] == "snapops-verify" and manifest["pass_filenames"] is False
    entry = manifest["entry"].split()
    gen1 = repo.snapshot(1, None, keys=keydir)
    repo.commit("gen 1")
    base = repo.head()
    repo.snapshot(2, gen1.merkle_this, keys=keydir, seed=5)
    tamper_b64(repo.path / SNAP, first_b64_line(repo.path / SNAP))
    repo.git("add", "-A")
    staged = subprocess.run(entry, cwd=repo.path, env=repo.env, text=True, capture_output=True)
    assert staged.returncode == 1 and f"{SNAP}:" in staged.stderr
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


def test_hook_input_deletions_pass_and_malformed_lines_are_errors(tmp_path, env):
    bare = make_repo(tmp_path / "remote.git", env, bare=True)

    def hook(text: str):
        return subprocess.run(["snapops", "hook", "pre-receive"], cwd=bare.path, env=env,
                              input=text, text=True, capture_output=True)

    deleted = hook(f"{'1' * 40} {'0' * 40} refs/heads/gone\n")
    assert deleted.returncode == 0 and deleted.stderr == ""
    malformed = hook("old new refs/heads/main\n")
    assert malformed.returncode == 2 and "[input] malformed hook input" in malformed.stderr
