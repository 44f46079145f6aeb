"""Attacks on a snapshot repository by someone without any key, each a real ``git push`` to a
bare remote whose installed ``pre-receive`` requires signatures and HMACs (trusted keys in a
folder outside the repository). Each is refused with one line naming the rule; ``snapops verify
--ci --range`` fails on the same history; no file appears anywhere but in the attacker's own
work tree (the hooks' scratch folders are gone again)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from snapops import save
from snapops.formats.generation import parse_manifest, seal_manifest
from snapops.formats.integrity import file_sha256
from snapops.formats.generation.write import Written, seal_in_ledger
from snapops.formats.keys import generate_keys

from .genrepo import (
    MANIFEST, RUN, SNAPOPS, GenRepo, Repo, commit_with, files_under, git_env, guarded_remote,
    make_repo, state, tag,
)

SHARDS = Path("snapshots") / RUN / "shards"


@dataclasses.dataclass
class World:
    """A guarded remote holding generations 1 and 2, and the attacker's clone of it."""

    root: Path
    remote: object
    work: GenRepo
    keys: Path

    def refused(self, *refspecs: str, rule: str, message: str = "") -> str:
        """Push; assert it is refused with ``[rule]`` (and ``message``), that nothing was
        written outside the attacker's work tree, and that CI fails on the pushed range."""
        before = self.outside()
        remote_main = self.remote.out("rev-parse", "main")
        pushed = self.work.push(*refspecs)
        assert pushed.returncode != 0, pushed.stderr
        lines = [line for line in pushed.stderr.splitlines()
                 if line.startswith("remote: snapops pre-receive:")]
        assert any(named(line, rule) and message in line for line in lines), pushed.stderr
        assert lines[-1].startswith("remote: snapops pre-receive: push rejected")
        assert self.outside() == before
        assert self.remote.out("rev-parse", "main") == remote_main
        return pushed.stderr

    def ci_fails(self, base: str, head: str = "HEAD", rule: str | None = None) -> str:
        checked = self.work.snapops(
            "verify", "--ci", "--range", f"{base}..{head}", "--trusted-key",
            str(self.keys / "signing.pub"), "--hmac-key", str(self.keys / "hmac.key"),
            "--require-signature", "--require-hmac")
        assert checked.returncode == 1, checked.stderr
        assert rule is None or named(checked.stderr, rule), checked.stderr
        return checked.stderr

    def outside(self) -> set[str]:
        """Every file under the test's folder but the attacker's work tree."""
        return {p for p in files_under(self.root) if not p.startswith("work")}


def named(text: str, rules: str) -> bool:
    """``text`` names one of the ``|``-separated rules as ``[rule]``."""
    return any(f"[{rule}]" in text for rule in rules.split("|"))


def make_world(tmp_path: Path, keys: Path, fmt: str = "wtxt", *, fsck: bool = True,
               **spec) -> World:
    """Generations 1 and 2 pushed through the guarded remote. Built once per worker and
    kind (format, fsck, spec, keys), then copied: the copy differs only in where its work
    tree's origin points, so every test still gets its own remote and work tree."""
    env = git_env(tmp_path)
    built = _template(keys, fmt, fsck, spec)
    for name in ("remote.git", "work"):
        shutil.copytree(built / name, tmp_path / name, symlinks=True)
    remote = Repo(tmp_path / "remote.git", env)
    work = GenRepo(tmp_path / "work", env, keys, fmt, **spec)
    work.git("remote", "set-url", "origin", str(remote.path))
    return World(tmp_path, remote, work, keys)


_TEMPLATES: dict[str, Path] = {}


def _template(keys: Path, fmt: str, fsck: bool, spec: dict) -> Path:
    key = repr((str(keys), fmt, fsck, sorted(spec.items())))
    if key not in _TEMPLATES:
        root = Path(keys.parent, f"world-{len(_TEMPLATES)}")
        root.mkdir()
        env = git_env(root)
        remote = guarded_remote(root / "remote.git", env, keys, fsck=fsck)
        make_repo(root / "work", env)
        work = GenRepo(root / "work", env, keys, fmt, **spec)
        work.git("remote", "add", "origin", str(remote.path))
        for gen in (1, 2):
            work.generation(gen)
            pushed = work.push("main", tag(gen))
            assert pushed.returncode == 0, pushed.stderr
        _TEMPLATES[key] = root
    return _TEMPLATES[key]



@pytest.fixture
def world(tmp_path, keydir) -> World:
    return make_world(tmp_path, keydir)


def commit_all(world: World, message: str) -> str:
    world.work.commit(message, "--no-verify")
    return world.work.head()


def shard_paths(world: World, suffix: str = "") -> list[Path]:
    return sorted(p for p in (world.work.path / SHARDS).iterdir()
                  if p.name.endswith(suffix) and not p.name.endswith(".wsum"))


# --- paths -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fsck", [False, True])
def test_dotdot_tree_aimed_at_the_remote_pre_receive(tmp_path, keydir, fsck):
    world = make_world(tmp_path, keydir, fsck=fsck)
    target = world.remote.path / "hooks" / "pre-receive"
    original = target.read_bytes()
    script = world.work.git("hash-object", "-w", "--stdin",
                            input="#!/bin/sh\ntouch pwned\n").stdout.strip()
    climb = "/".join([".."] * 40) + str(target)  # from any scratch folder up to / and down
    commit_with(world.work, f"snapshots/{RUN}/{climb}", "100755", script, "evil tree")
    if fsck:  # git itself refuses the tree (receive.fsckObjects, set by hooks install)
        pushed = world.work.push("main")
        assert pushed.returncode != 0 and "fsck" in pushed.stderr, pushed.stderr
    else:     # and without git's check, the hook refuses it before reading anything
        world.refused("main", rule="path", message="unsafe path in the tree")
        world.ci_fails("origin/main", rule="path")
    assert target.read_bytes() == original
    assert not list(tmp_path.rglob("pwned"))


def test_dot_git_component_is_refused(tmp_path, keydir):
    world = make_world(tmp_path, keydir, fsck=False)
    blob = world.work.git("hash-object", "-w", "--stdin", input="x\n").stdout.strip()
    commit_with(world.work, f"snapshots/{RUN}/.git/hooks/post-checkout", "100755", blob, "evil")
    world.refused("main", rule="path", message="unsafe path in the tree")


# --- rollback, replay, forgery -----------------------------------------------------------------

def test_older_signed_shard_put_back_over_the_newest(world):
    gen1 = world.work.out("rev-parse", tag(1))
    changed = world.work.out("diff", "--name-only", tag(1), tag(2), "--", str(SHARDS))
    shard = changed.split()[0]
    world.work.git("checkout", gen1, "--", shard)
    commit_all(world, "rollback one shard")
    world.refused("main", rule="size|digest")
    world.ci_fails("origin/main", rule="size|digest")


def test_whole_older_generation_replayed(world):
    world.work.git("checkout", tag(1), "--", f"snapshots/{RUN}")
    commit_all(world, "replay gen 1")
    world.refused("main", rule="chain", message="rollback, replay or a forged history")
    world.ci_fails("origin/main", rule="chain")


@pytest.mark.parametrize("seal", ["kept", "stripped", "attacker"])
def test_forged_generation_with_recomputed_ledger_line(world, seal, tmp_path):
    """Old shards, an edited MANIFEST (gen 3 after gen 2) and a ledger line computed from the
    public formula: only the seal is out of reach."""
    work = world.work.path
    newest = (work / MANIFEST).read_bytes()
    world.work.git("checkout", tag(1), "--", str(SHARDS))
    old = parse_manifest(world.work.git("show", f"{tag(1)}:{MANIFEST}", input=b"").stdout)
    forged = parse_manifest(newest)
    forged.header = dataclasses.replace(forged.header, gen=3)
    forged.prev = dataclasses.replace(forged.prev, gen=2,
                                      sha256=hashlib.sha256(newest).hexdigest())
    forged.shards, forged.files, forged.arrays = old.shards, old.files, old.arrays
    if seal == "stripped":
        forged = seal_manifest(forged)
    elif seal == "attacker":
        generate_keys(tmp_path / "attacker")
        forged = seal_manifest(forged, tmp_path / "attacker" / "signing.key", b"k" * 32)
    data = forged.render()
    (work / MANIFEST).write_bytes(data)
    seal_in_ledger(work, RUN, Written(forged, data, [], []))
    commit_all(world, "forged gen 3")
    message = {"kept": "signature does not verify", "stripped": "not signed",
               "attacker": "not trusted"}[seal]
    world.refused("main", rule="signature", message=message)
    world.ci_fails("origin/main", rule="signature")


# --- substituted shard content -----------------------------------------------------------------

def substitute(world: World, shard: Path, content: bytes, *, edit_manifest: bool) -> None:
    """Put ``content`` at ``shard``; optionally make the MANIFEST's record match it (the seal
    line left as it was: the attacker has no key)."""
    shard.write_bytes(content)
    if edit_manifest:
        path = (world.work.path / MANIFEST)
        m = parse_manifest(path.read_bytes())
        rel = shard.relative_to(world.work.path / "snapshots" / RUN).as_posix()
        m.shards = [dataclasses.replace(s, size=len(content), sha256=file_sha256(shard))
                    if s.path == rel else s for s in m.shards]
        path.write_bytes(m.render())


def fold_bytes(tmp_path: Path) -> bytes:
    save({"emb.weight": np.zeros((64, 16), np.float32)}, tmp_path / "evil.fold")
    return (tmp_path / "evil.fold").read_bytes()


@pytest.mark.parametrize("kind", ["fold", "delta", "lfs"])
@pytest.mark.parametrize("edit_manifest", [False, True])
def test_wtxt_shard_replaced(world, tmp_path, kind, edit_manifest):
    shard = shard_paths(world, ".wtxt")[0]
    content = {"fold": fold_bytes(tmp_path),
               "delta": b"WTXT-DELTA 2\nbase sha256=" + b"0" * 64 + b"\n",
               "lfs": b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64
                      + b"\nsize 12345\n"}[kind]
    substitute(world, shard, content, edit_manifest=edit_manifest)
    commit_all(world, f"{kind} under a .wtxt name")
    rule = "signature" if edit_manifest else "size|digest"
    world.refused("main", rule=rule)
    world.ci_fails("origin/main", rule=rule)


@pytest.mark.parametrize("fmt", ["fold", "aero", "pycauset", "finf"])
def test_arbitrary_weights_in_a_binary_format_repository(tmp_path, keydir, fmt):
    world = make_world(tmp_path, keydir, fmt)
    shard = shard_paths(world, f".{fmt}")[0]
    evil = tmp_path / f"evil.{fmt}"
    save({"emb.weight": np.full((64, 16), 1e6, np.float32)}, evil)
    substitute(world, shard, evil.read_bytes(), edit_manifest=True)
    commit_all(world, "arbitrary weights")
    world.refused("main", rule="signature")
    world.ci_fails("origin/main", rule="signature")


def test_unsigned_age_armored_shard(tmp_path, keydir):
    from snapops.formats.armor import encrypt_file

    recipient = (keydir / "age.pub").read_text().strip()
    world = make_world(tmp_path, keydir, "aero", recipients=(recipient,))
    shard = shard_paths(world, ".aero.age")[0]
    evil = tmp_path / "evil.aero"
    save({"emb.weight": np.zeros((64, 16), np.float32)}, evil)
    encrypt_file(evil, tmp_path / "evil.aero.age", [recipient])  # the recipient is public
    substitute(world, shard, (tmp_path / "evil.aero.age").read_bytes(), edit_manifest=False)
    commit_all(world, "unsigned age shard")
    world.refused("main", rule="size|digest")
    shutil.copy(tmp_path / "evil.aero.age", shard.with_name("extra.aero.age"))
    commit_all(world, "and an extra one")
    world.refused("main", rule="size|digest")
    world.ci_fails("origin/main", rule="fileset")


# --- kinds of entries ------------------------------------------------------------------------

def test_symlink_in_place_of_a_shard(world):
    shard = shard_paths(world, ".wtxt")[0]
    shard.unlink()
    os.symlink("/etc/passwd", shard)
    commit_all(world, "symlink")
    world.refused("main", rule="fileset", message="a symlink where the MANIFEST lists")
    world.ci_fails("origin/main", rule="fileset")


def test_submodule_in_place_of_a_shard(world):
    shard = shard_paths(world, ".wtxt")[0].relative_to(world.work.path).as_posix()
    commit = world.work.head()
    world.work.git("rm", "-q", "--cached", shard)
    world.work.git("update-index", "--add", "--cacheinfo", f"160000,{commit},{shard}")
    world.work.git("commit", "-q", "--no-verify", "-m", "submodule")
    world.refused("main", rule="fileset", message="a gitlink where the MANIFEST lists")
    world.ci_fails("origin/main", rule="fileset")


def test_deleted_wsum_of_a_streaming_shard(tmp_path, keydir):
    world = make_world(tmp_path, keydir, streaming_threshold=500)
    wsum = next((world.work.path / SHARDS).glob("*.wsum"))
    world.work.write(3)
    wsum.unlink()
    commit_all(world, "gen 3 without its wsum")
    world.refused("main", rule="fileset", message="lists is missing")
    world.ci_fails("origin/main", rule="fileset")


def test_stray_files_under_snapshots_and_ledger(world):
    for path in ("snapshots/x", "ledger/foo.txt"):
        (world.work.path / path).write_text("x\n")
    commit_all(world, "stray files")
    stderr = world.refused("main", rule="layout", message="no rule allows this path")
    assert "snapshots/x: [layout]" in stderr and "ledger/foo.txt: [layout]" in stderr


@pytest.mark.parametrize("pruned,message", [
    ("1,2", "it prunes gen 2, the newest generation of its own tree"),
    ("1", "it prunes gen 1, which its own policy keeps"),             # a milestone
    ("2,1", "not in increasing order"),
])
def test_retention_record_that_prunes_what_it_must_keep(world, pruned, message):
    """A pushed record saying the newest generation (or a milestone) is pruned would make
    every restore of it refuse with "pruned by retention": the record must hold together."""
    record = world.work.path / "retention" / f"{RUN}.retention"
    record.parent.mkdir()
    milestones = "1" if pruned == "1" else "-"
    record.write_text(f"SNAPOPS-RETENTION 1\npolicy keep_last=1 keep_every=0 "
                      f"milestones={milestones}\npruned {pruned}\n")
    commit_all(world, "retention record")
    world.refused("main", rule="retention", message=message)
    world.ci_fails("origin/main", rule="retention")


def test_retention_record_that_holds_is_accepted(world):
    """What `snapops lfs prune` writes after gen 2 with --keep-last 1: gen 1 pruned."""
    record = world.work.path / "retention" / f"{RUN}.retention"
    record.parent.mkdir()
    record.write_text("SNAPOPS-RETENTION 1\npolicy keep_last=1 keep_every=0 milestones=-\n"
                      "pruned 1\n")
    commit_all(world, "retention record")
    pushed = world.work.push("main")
    assert pushed.returncode == 0, pushed.stderr
    assert world.remote.out("rev-parse", "main") == world.work.head()


def test_retention_record_as_a_symlink_or_a_stray_file(world):
    folder = world.work.path / "retention"
    folder.mkdir()
    os.symlink("/etc/passwd", folder / f"{RUN}.retention")
    (folder / "notes.txt").write_text("x\n")
    commit_all(world, "retention links")
    stderr = world.refused("main", rule="layout", message="must be a regular file, not a symlink")
    assert "retention/notes.txt: [layout] no rule allows this path" in stderr


# --- refs ------------------------------------------------------------------------------------

def test_deleting_a_generation_tag_or_the_branch_then_pushing_again(world):
    world.refused(f":refs/tags/{tag(1)}", rule="tag", message="deleting a generation tag")
    world.refused(":main", rule="ref", message="deleting the protected branch")
    # a new branch cannot start a rewritten history: it must extend the protected branch
    world.work.git("checkout", "-q", "-b", "evil", tag(1))
    world.work.write(2, state(99))
    commit_all(world, "rewritten gen 2")
    world.refused("evil", rule="append-only", message="of the protected branch main")
    world.ci_fails("origin/main", rule="append-only")


def test_generation_tags_name_their_generation_and_never_move(world):
    # a no-break space ends the name: str.split() cut it off, so the hook checked (and
    # accepted) gen-000001
    world.work.git("tag", "-a", "-m", "nbsp", f"{tag(1)}\u00a0", tag(1))
    world.refused(f"{tag(1)}\u00a0", rule="tag", message="malformed generation tag")
    world.work.git("tag", "-a", "-m", "lie", f"{RUN}/gen-000005", tag(2))
    world.refused(f"{RUN}/gen-000005", rule="tag", message="does not name its generation")
    world.work.git("tag", "-f", "-a", "-m", "moved", tag(1), tag(2))
    world.refused("-f", tag(1), rule="tag", message="never moves")
    world.work.git("tag", "-a", "-m", "bad name", f"{RUN}/gen-5", tag(2))
    world.refused(f"{RUN}/gen-5", rule="tag", message="malformed generation tag")
    # str.isdigit takes the superscript two, int() does not (the hook died with ValueError)
    world.work.git("tag", "-a", "-m", "digits", f"{RUN}/gen-\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2",
                   tag(2))
    world.refused(f"{RUN}/gen-\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2", rule="tag",
                  message="malformed generation tag")
    stderr = world.ci_fails("0" * 40, rule="tag")  # the whole history and the tags into it
    assert f"refs/tags/{RUN}/gen-000005: [tag]" in stderr and \
        f"refs/tags/{tag(1)}: [tag]" in stderr, stderr


def test_force_pushed_rewritten_history(world):
    world.work.git("reset", "-q", "--hard", tag(1))
    world.work.write(2, state(42))
    commit_all(world, "another gen 2")
    world.refused("-f", "main", rule="append-only", message="of the old tip")
    world.ci_fails(world.remote.out("rev-parse", "main"), rule="append-only")


# --- sizes -----------------------------------------------------------------------------------

def test_oversized_blob_is_refused_before_it_is_read(world):
    """A 64 MiB blob of zeros travels as a few KiB (git deflates it): it is refused from its
    size, read from git, and never written to the scratch folder."""
    world.remote.git("config", "snapops.maxBlobSize", "16m")
    blob = world.work.git("hash-object", "-w", "--stdin", input=b"\0" * (64 << 20)).stdout
    shard = shard_paths(world, ".wtxt")[0].relative_to(world.work.path).as_posix()
    commit_with(world.work, shard, "100644", blob.decode().strip(), "bomb")
    world.refused("main", rule="limit", message="snapops.maxBlobSize")
    assert not any((world.root / "tmp").iterdir())


def tree_bomb(repo: GenRepo, depth: int) -> str:
    """A tree of ``2 ** depth`` paths in ``depth + 1`` small objects: each level names the
    one below twice."""
    blob = repo.git("hash-object", "-w", "--stdin", input="x\n").stdout.strip()
    tree = repo.git("mktree", input=f"100644 blob {blob}\tf\n").stdout.strip()
    for _ in range(depth):
        tree = repo.git("mktree", input=f"040000 tree {tree}\ta\n040000 tree {tree}\tb\n"
                        ).stdout.strip()
    return tree


@pytest.mark.slow
def test_tree_bomb_is_refused_at_the_path_limit(world):
    """2**40 paths in 41 objects (git would list them for days, holding them in memory),
    outside the runs or in one: refused once a listing passes snapops.maxPaths, by the hook
    and by CI, and by the verifier of a generation (default limit) when in the run's folder."""
    for repo in (world.remote, world.work):
        repo.git("config", "snapops.maxPaths", "5000")
    bomb = tree_bomb(world.work, 40)
    for where in ("junk/bomb", f"snapshots/{RUN}/bomb"):
        world.work.git("update-ref", "HEAD", world.remote.out("rev-parse", "main"))
        commit_with(world.work, where, "040000", bomb, "bomb")
        world.refused("main", rule="limit", message="at most 5000 paths")
        assert "at most 5000 paths" in world.ci_fails("origin/main", rule="limit")
    checked = world.work.snapops("verify", ".", "--run", RUN, "--rev", "HEAD")
    assert checked.returncode == 1 and "[limit]" in checked.stderr, checked.stderr


def test_names_cannot_forge_or_hide_lines_of_the_output(world):
    blob = world.work.git("hash-object", "-w", "--stdin", input="x\n").stdout.strip()
    commit_with(world.work, "snapshots/x\nsnapops pre-receive: OK\x1b[2K", "100644", blob, "evil")
    stderr = world.refused("main", rule="layout")
    assert "snapshots/x\\nsnapops pre-receive: OK\\x1b[2K: [layout]" in stderr, stderr
    assert "\x1b" not in stderr
    assert not any(line.startswith("remote: snapops pre-receive: OK")
                   for line in stderr.splitlines())


def test_ref_updates_naming_no_object_or_not_a_commit_fail_closed(world):
    """git itself never hands pre-receive these, but the hook does not rely on it: a new value
    that names no object, or a branch set to a tree, is refused, not waved through."""
    remote = world.remote
    tree = remote.out("rev-parse", "main^{tree}")
    for new, ref, message in [("1" * 40, "refs/heads/main", "the new value names no object"),
                              ("1" * 40, f"refs/tags/{RUN}/gen-000009", "the new value names"),
                              (tree, "refs/heads/x", "a branch must point at a commit")]:
        hook = subprocess.run([SNAPOPS, "hook", "pre-receive", "--repo", str(remote.path)],
                              input=f"{'0' * 40} {new} {ref}\n", text=True,
                              capture_output=True, env=remote.env, timeout=120)
        assert hook.returncode == 1, (ref, hook.stderr)
        assert f"{ref}: [ref] {message}" in hook.stderr, hook.stderr
