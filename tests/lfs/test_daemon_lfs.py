"""The daemon with ``store = "lfs"``: a real giftless, a bare remote, git-lfs on the clone side.

Twelve generations of a dense state with K = 4 are committed and pushed; a fresh clone with
plain git sees LFS pointers (git-lfs lists them), every generation verifies from its pointers
without downloading, every generation restores bit-exact from the LFS server, and ``snapops
restore`` of the clone fetches exactly the newest generation's chains.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.manifest import parse_manifest
from snapops.formats.generation.source import GitTreeSource
from snapops.formats.generation.verify import GenerationOptions, verify_generation
from snapops.formats.lfs.access import lfsconfig_url
from snapops.formats.lfs.client import LfsClient
from snapops.formats.lfs.objects import ObjectStore
from snapops.formats.lfs.source import LfsSource, tag_manifests
from snapops.hooks.gitio import Git

from ..daemon.daemon_env import DaemonEnv
from ..daemon.gitserve import git, init_bare

GENS, K = 12, 4


def dense(gen: int) -> dict[str, np.ndarray]:
    """Every weight moves every generation (an AdamW-like relative step of 1e-3)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 128, 128)).astype(np.float32)
    for g in range(1, gen + 1):
        step = np.random.default_rng(g).standard_normal(w.shape).astype(np.float32)
        w = w * (1 + np.float32(1e-3) * step)
    return {"w": w, "step": np.array(gen, np.int64)}


def lfs_env(tmp_path, giftless, bare, k=K) -> DaemonEnv:
    token = giftless.token_file(tmp_path, "write")
    return DaemonEnv(tmp_path, {"origin": str(bare)}, fmt="aero", shard_max="128KiB",
                     repo_extra=f'store = "lfs"\nlfs_url = "{giftless.url}"\n'
                                f'lfs_token_file = "{token}"\nkeyframe_every = {k}\n')


def plain_clone(bare, clone) -> None:
    env = {**os.environ, "GIT_LFS_SKIP_SMUDGE": "1", "GIT_TERMINAL_PROMPT": "0"}
    subprocess.run(["git", "clone", "-q", str(bare), str(clone)], check=True, env=env)


@pytest.mark.slow
def test_twelve_dense_generations_pushed_cloned_restored_exactly(tmp_path, giftless):
    bare = init_bare(tmp_path / "remote.git")
    env = lfs_env(tmp_path, giftless, bare)
    states = {gen: dense(gen) for gen in range(1, GENS + 1)}
    env.push_all(states, what="twelve generations pushed", timeout=240)
    assert giftless.token(  # the token file's content never reaches the log
        "write")[:20] not in env.log.read_text()
    cached = {p.name for p in (tmp_path / "state" / "lfs").iterdir()}
    clone = tmp_path / "clone"
    plain_clone(bare, clone)
    repo = Git(clone)
    options = GenerationOptions(hmac_key=env.keys / "hmac.key",
                                trusted_keys=[env.keys / "signing.pub"], require_signature=True)
    store = ObjectStore(tmp_path / "restore-cache",
                        LfsClient(giftless.url, giftless.token("read")))
    encodings, manifests = [], {}
    for gen, state in states.items():
        tag = f"t/gen-{gen:06d}"
        manifest = manifests[gen] = parse_manifest(
            git("show", f"{tag}:snapshots/t/MANIFEST", cwd=clone).encode() + b"\n")
        assert manifest.header.store == "lfs"
        encodings.append({s.encoding for s in manifest.shards if s.gen == gen})
        for shard in manifest.shards:   # plain git sees pointers naming the stored objects
            pointer = git("show", f"{tag}:snapshots/t/{shard.path}", cwd=clone)
            assert pointer.startswith("version https://git-lfs.github.com/spec/v1")
            assert f"oid sha256:{shard.object}" in pointer
            assert shard.object in giftless.objects()
        scratch = tmp_path / f"scratch{gen}"
        scratch.mkdir()
        tree = GitTreeSource(repo, tag, scratch)
        report = verify_generation(tree, "t", options)          # pointers only, nothing fetched
        assert report.ok, report.failure
        assert "lfs-pointers" in report.checks and "shards" not in report.checks
        fetched = store.fetched
        snap = load_from_source(LfsSource(tree, "t", store,
                                          manifests=tag_manifests(repo, "t")), "t",
                                options=options)
        assert snap["w"].dtype == np.float32 and snap["w"].tobytes() == state["w"].tobytes()
        assert int(snap["step"]) == gen
        assert store.fetched - fetched <= len(manifest.shards) * K   # at most a whole chain
    # K = 4: restores apply at most 3 residuals, so skip residuals run to shard number 14;
    # in 12 generations only gen 1 is a keyframe (every residual clearly smaller)
    assert [sorted(e) for e in encodings] == [["key"]] + [["res"]] * 11
    # the daemon's cache: the last shards and what later residuals may use as bases
    # (number 11 = 0b1011: numbers 0, 8 and 10, i.e. gens 1, 9 and 11)
    spine = {s.sha256 for g in (1, 9, 11, 12) for s in manifests[g].shards if s.gen == g}
    assert cached == spine | {f"{s.sha256}.spine" for s in manifests[12].shards}
    snapops = [sys.executable, "-m", "snapops", "verify", str(clone), "--run", "t", "--rev",
               "t/gen-000011", "--hmac-key", str(env.keys / "hmac.key"), "--json"]
    plain = subprocess.run(snapops, capture_output=True, text=True, check=False)
    assert plain.returncode == 0, plain.stderr
    assert "contents not fetched" in plain.stdout
    token = giftless.token_file(tmp_path, "read")   # the URL comes from the tree's .lfsconfig
    fetched = subprocess.run(snapops + ["--fetch-lfs", "--lfs-token-file", str(token)],
                             capture_output=True, text=True, check=False)
    assert fetched.returncode == 0, fetched.stderr
    assert '"shards"' in fetched.stdout and "not fetched" not in fetched.stdout
    denied = subprocess.run(snapops + ["--fetch-lfs"], capture_output=True, text=True, check=False)
    assert denied.returncode == 1 and "[lfs]" in denied.stdout + denied.stderr
    # cloned from a network remote on another host than the tree's .lfsconfig endpoint (a
    # pushed .lfsconfig, say): the token goes there only when the user names the endpoint
    endpoint = lfsconfig_url((clone / ".lfsconfig").read_bytes())
    origin = git("config", "--get", "remote.origin.url", cwd=clone).strip()
    git("config", "remote.origin.url", "git://localhost/weights.git", cwd=clone)
    for argv in (snapops, [sys.executable, "-m", "snapops", "restore", str(clone), "--run", "t",
                           "--gen", "11", "-o", str(tmp_path / "no.npz")]):
        kept = subprocess.run(argv + ["--fetch-lfs"] * (argv is snapops) +
                              ["--lfs-token-file", str(token)], capture_output=True, text=True)
        assert kept.returncode == 2 and "not on the remote's host localhost" in kept.stderr, \
            kept.stderr
        assert token.read_text().strip() not in kept.stderr and kept.stderr.count("\n") == 1
    named = subprocess.run(snapops + ["--fetch-lfs", "--lfs-token-file", str(token),
                                      "--lfs-url", endpoint], capture_output=True, text=True)
    assert named.returncode == 0, named.stderr
    git("config", "remote.origin.url", origin, cwd=clone)
    ci = [sys.executable, "-m", "snapops", "verify", "--ci", "--range",
          "t/gen-000010..t/gen-000012", "--repo", str(clone), "--hmac-key",
          str(env.keys / "hmac.key"), "--json"]
    checked = subprocess.run(ci + ["--fetch-lfs", "--lfs-token-file", str(token)],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.count('"shards"') >= 2 and "not fetched" not in checked.stdout
    listed = git("lfs", "ls-files", "--long", "t/gen-000012", cwd=clone)
    assert listed.count(" - snapshots/t/shards/") + listed.count(" * snapshots/t/shards/") \
        == len(manifest.shards)
    restore = subprocess.run([sys.executable, "-m", "snapops", "restore", str(clone), "--run",
                              "t", "--gen", "12", "-o", str(tmp_path / "x.npz"),
                              "--lfs-token-file", str(token)],
                             capture_output=True, text=True, check=False)
    assert restore.returncode == 0, restore.stderr          # the clone's .lfsconfig endpoint
    assert f"{len(manifest.shards) * K} LFS object(s) fetched" in restore.stdout   # gens 9-12
    with np.load(tmp_path / "x.npz") as npz:
        assert npz["w"].tobytes() == states[12]["w"].tobytes()
