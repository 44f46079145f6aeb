"""`snapops hooks install | uninstall` and `snapops hook` as a user and an operator meet them, in
real repositories: a conflict leaves nothing half-installed, server settings install replaced
come back, a missing snapops or standard input is one clear line, a tracked hooks folder is not
rewritten, and the pre-commit framework's whole-history push checks the branch it creates."""

from __future__ import annotations

import io
import os
import subprocess

import pytest

from snapops.formats.errors import ConfigError, UsageError
from snapops.hooks.install import CHAINED_SUFFIX, install_hooks, uninstall_hooks
from snapops.hooks.runner import run_hook

from .genrepo import SNAPOPS, GenRepo, git_env, make_repo


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return git_env(tmp_path)


def own_hook(path, text: str) -> str:
    script = f"#!/bin/sh\n{text}\n"
    path.write_text(script)
    path.chmod(0o755)
    return script


def test_a_hook_that_cannot_be_chained_leaves_every_hook_as_it_was(tmp_path, env):
    r = make_repo(tmp_path / "work", env)
    hooks = r.path / ".git" / "hooks"
    mine = own_hook(hooks / "pre-commit", "echo mine")
    own_hook(hooks / "pre-push", "exit 0")
    own_hook(hooks / f"pre-push{CHAINED_SUFFIX}", "exit 0")
    with pytest.raises(ConfigError, match="pre-push.snapops-chained exists too"):
        install_hooks(r.path, command=[SNAPOPS])
    assert (hooks / "pre-commit").read_text() == mine      # not chained, not replaced
    assert not (hooks / f"pre-commit{CHAINED_SUFFIX}").exists()


def test_uninstall_restores_a_chained_hook_even_when_ours_was_deleted(tmp_path, env):
    r = make_repo(tmp_path / "work", env)
    hooks = r.path / ".git" / "hooks"
    mine = own_hook(hooks / "pre-push", "exit 0")
    install_hooks(r.path, hooks=("pre-push",), command=[SNAPOPS])
    (hooks / "pre-push").unlink()                 # git no longer runs the user's hook
    actions = {a.name: a.action for a in uninstall_hooks(r.path, hooks=("pre-push",))}
    assert actions == {"pre-push": "restored"}
    assert (hooks / "pre-push").read_text() == mine and os.access(hooks / "pre-push", os.X_OK)


def test_a_folder_that_is_no_repository_is_named_with_what_to_do(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="plain: not a git repository; .*`git init` it first"):
        install_hooks(tmp_path / "plain", command=[SNAPOPS])
    assert not (tmp_path / "plain" / "hooks").exists()


def test_uninstall_puts_back_the_server_settings_install_replaced(tmp_path, env):
    bare = make_repo(tmp_path / "remote.git", env, bare=True)
    bare.git("config", "core.looseCompression", "9")
    out = subprocess.run([SNAPOPS, "hooks", "install", str(bare.path)], env=env, text=True,
                         capture_output=True, check=True).stdout
    assert "configured core.looseCompression=0 in" in out and "(was 9: uninstall restores" in out
    assert "receive.fsckObjects=true" in out and "(was unset: uninstall unsets it" in out
    assert {a.action for a in install_hooks(bare.path, command=[SNAPOPS])} == {"unchanged",
                                                                               "kept"}
    assert bare.out("config", "core.looseCompression") == "0"

    settings = {a.name: (a.action, a.value) for a in uninstall_hooks(bare.path)}
    assert settings["core.looseCompression"] == ("restored", "9")
    assert settings["receive.fsckObjects"] == ("unset", None)
    assert bare.out("config", "core.looseCompression") == "9"
    assert bare.git("config", "receive.fsckObjects", check=False).returncode == 1
    assert bare.git("config", "--get-regexp", "^snapops\\.", check=False).stdout == ""

    install_hooks(bare.path, command=[SNAPOPS])
    bare.git("config", "receive.fsckObjects", "false")     # the operator's choice since
    settings = {a.name: (a.action, a.value) for a in uninstall_hooks(bare.path)}
    assert settings["receive.fsckObjects"] == ("kept", "false")
    assert bare.out("config", "receive.fsckObjects") == "false"


def test_a_hook_whose_snapops_is_gone_says_how_to_fix_it(tmp_path, env):
    r = make_repo(tmp_path / "work", env)
    install_hooks(r.path, hooks=("pre-commit",), command=[str(tmp_path / "gone" / "snapops")])
    (r.path / "a.txt").write_text("a\n")
    r.git("add", "a.txt")
    bare_path = os.pathsep.join(p for p in ("/usr/bin", "/bin") if os.path.isdir(p))
    refused = r.git("commit", "-q", "-m", "a", check=False, env=env | {"PATH": bare_path})
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        f"snapops pre-commit hook: cannot run snapops: {tmp_path}/gone/snapops is gone and no "
        "snapops is on PATH; run `snapops hooks install` again with the snapops to use"]


def test_hook_input_from_a_closed_stdin_or_a_terminal_is_one_usage_line(tmp_path, env):
    bare = make_repo(tmp_path / "remote.git", env, bare=True)
    closed = subprocess.run(["sh", "-c", f"exec {SNAPOPS} hook pre-receive <&-"],
                            cwd=bare.path, env=env, text=True, capture_output=True)
    assert closed.returncode == 2, closed.stderr
    assert closed.stderr.startswith("snapops: error: snapops hook pre-receive reads git's ref")
    assert "internal error" not in closed.stderr and len(closed.stderr.splitlines()) == 1
    leader, follower = os.openpty()
    os.write(leader, b"\x04")                 # end of input, typed: no ref lines, no check
    with open(follower, encoding="utf-8") as terminal:
        with pytest.raises(UsageError, match="standard input, which is a terminal or closed"):
            run_hook("pre-push", ["origin"], repo=str(bare.path), stdin=terminal,
                     out=io.StringIO())
    os.close(leader)


def test_a_tracked_hooks_folder_is_not_rewritten(tmp_path, env):
    r = make_repo(tmp_path / "work", env)
    (r.path / ".githooks").mkdir()
    team = own_hook(r.path / ".githooks" / "pre-commit", "echo team hook")
    r.git("add", ".githooks")
    r.git("commit", "-q", "-m", "team hooks")
    r.git("config", "core.hooksPath", ".githooks")
    with pytest.raises(ConfigError, match=r"pre-commit is tracked by git.*--hook NAME"):
        install_hooks(r.path, command=[SNAPOPS])
    assert (r.path / ".githooks" / "pre-commit").read_text() == team
    assert r.out("status", "--porcelain") == ""               # nothing to commit by mistake
    assert [a.action for a in install_hooks(r.path, hooks=("pre-push",),
                                            command=[SNAPOPS])] == ["installed"]


def test_framework_whole_history_push_checks_the_remote_branch_it_creates(tmp_path, env,
                                                                          keydir):
    """pre-commit passes only the branches when a push starts a new history; pushing a
    ledger-less local ``main`` as a new remote branch must not pass as ``main`` itself."""
    make_repo(tmp_path / "remote.git", env, bare=True)
    make_repo(tmp_path / "work", env)
    repo = GenRepo(tmp_path / "work", env, keydir)
    repo.git("config", "snapops.protectedBranch", "main")
    repo.git("remote", "add", "origin", str(tmp_path / "remote.git"))
    repo.generation(1)
    assert repo.push("main").returncode == 0
    empty_tree = repo.out("hash-object", "-t", "tree", "/dev/null")
    repo.git("update-ref", "refs/heads/main", repo.out("commit-tree", "-m", "new", empty_tree))
    push_env = {"PRE_COMMIT_LOCAL_BRANCH": "refs/heads/main", "PRE_COMMIT_REMOTE_NAME": "origin",
                "PRE_COMMIT_REMOTE_BRANCH": "refs/heads/feature"}
    out = io.StringIO()
    assert run_hook("pre-commit-framework", [], repo=str(repo.path), env=push_env, out=out) == 1
    assert "[append-only] ledger deleted (it existed in the protected branch main" \
        in out.getvalue(), out.getvalue()
