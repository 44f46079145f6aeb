"""``snapops restore`` of a run in the Git LFS store, from a URL, exactly like a Git-stored run.

A real daemon writes five generations (K = 3: a keyframe at gen 1, skip residuals after it)
with giftless on 127.0.0.1 as its LFS server and pushes them to a bare remote that ``git
daemon`` serves on 127.0.0.1. Every generation comes back bit-exact from ``git://`` (checked
with numpy's own npz reader against the arrays the test requested), downloading exactly the
objects of its chains: the count is checked against the chains computed from the MANIFESTs
that plain git shows, and against the downloads giftless logged. Then retention prunes gens
1-3 (``snapops lfs prune`` on a plain clone, the record pushed): they are refused with the
retention reason, and ``--latest-verified`` names that reason for each one it skips. The
tests share one remote and run in file order; the last one deletes objects from the store.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from snapops.formats.generation.manifest import parse_manifest
from snapops.formats.lfs.retention import chain_objects

import snapops
from snapops.bench.giftless import ORG, REPO, serving
from snapops.cli import main
from snapops.remote import open_repository

from ..daemon.gitserve import GitDaemon, free_port, git, init_bare
from ..lfs.giftless_env import Giftless
from ..lfs.test_daemon_lfs import lfs_env, plain_clone

GENS, K, RUN = 5, 3, "t"


def weights(gen: int) -> dict[str, np.ndarray]:
    """Two 96 KiB matrices (two shards) that move every generation, and the step."""
    rng = np.random.default_rng(0)
    out = {}
    for name in ("a", "b"):
        w = rng.standard_normal((24, 1024)).astype(np.float32)
        for g in range(1, gen + 1):
            step = np.random.default_rng([g, ord(name)]).standard_normal(w.shape)
            w = w * (1 + np.float32(1e-3) * step.astype(np.float32))
        out[name] = w
    out["step"] = np.array(gen, np.int64)
    return out


class Remote:
    def __init__(self, root: Path, url: str, bare: Path, lfs: Giftless, keys: Path) -> None:
        self.root, self.url, self.bare, self.lfs, self.keys = root, url, bare, lfs, keys
        self.token = lfs.token_file(root, "read")

    def manifests(self) -> dict:
        """Every generation's MANIFEST as plain git shows it in the bare remote."""
        return {g: parse_manifest(git("show", f"{RUN}/gen-{g:06d}:snapshots/{RUN}/MANIFEST",
                                      cwd=self.bare).encode() + b"\n")
                for g in range(1, GENS + 1)}

    def downloads(self) -> int:
        """Object downloads (GET of a 64-hex oid) giftless has logged so far."""
        log = (self.root / "giftless.log").read_text()
        return len(re.findall(r'"GET [^" ]*/[0-9a-f]{64}[/?"][^"]*" 200', log))

    def batches(self) -> int:
        """Download batch calls giftless has logged so far (upload batches are the daemon's,
        all made before the restores)."""
        log = (self.root / "giftless.log").read_text()
        return len(re.findall(r'"POST [^" ]*/objects/batch[^"]*" 200', log))

    def restore(self, *args: str) -> list[str]:
        return ["restore", self.url, "--run", RUN, "--lfs-token-file", str(self.token),
                "--hmac-key", str(self.keys / "hmac.key"), "--trusted-key",
                str(self.keys / "signing.pub"), "--require-signature", *args]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    root = tmp_path_factory.mktemp("restore-lfs")
    secret = "test-secret-" + root.name
    with serving(root, secret) as lfs_url:
        lfs = Giftless(lfs_url, root / "lfs-storage", secret)
        served = root / "served"
        bare = init_bare(served / "remote.git")
        env = lfs_env(root, lfs, bare, k=K)
        env.push_all({gen: weights(gen) for gen in range(1, GENS + 1)},
                     what="LFS-store generations pushed")
        daemon = GitDaemon(served)
        daemon.start()
        try:
            yield Remote(root, daemon.url("remote.git"), bare, lfs, env.keys)
        finally:
            daemon.stop()


def test_every_generation_restores_bit_exact_fetching_exactly_its_chains(remote, tmp_path,
                                                                         capsys):
    manifests = remote.manifests()
    assert [sorted({s.encoding for s in manifests[g].shards}) for g in manifests] == \
        [["key"], ["res"], ["res"], ["res"], ["res"]]
    assert len(manifests[1].shards) == 2
    for gen in range(1, GENS + 1):
        chains = set().union(*(chain_objects(manifests, gen, s) for s in manifests[gen].shards))
        # independently: shard number gen - 1 applies one residual per set bit; two shards
        assert len(chains) == 2 * (bin(gen - 1).count("1") + 1)
        out = tmp_path / f"gen{gen}.npz"
        served, asked = remote.downloads(), remote.batches()
        assert main(remote.restore("--gen", str(gen), "-o", str(out))) == 0
        line = capsys.readouterr().out
        assert f"restored run t gen {gen} (verified; tag t/gen-{gen:06d}" in line
        assert f", {len(chains)} LFS object(s) fetched in " in line
        assert remote.downloads() - served == len(chains)
        assert remote.batches() - asked == 1     # the whole generation asked for at once
        with np.load(out) as npz:
            want = weights(gen)
            assert sorted(npz.files) == sorted([*want, "snapops.json"])   # + gen, ts, build
            for name, array in want.items():
                assert npz[name].dtype == array.dtype
                assert npz[name].tobytes() == array.tobytes(), (gen, name)


def test_python_api_from_url_and_local_bare_repository(remote, tmp_path, monkeypatch):
    bare, token = remote.bare, remote.token
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    synced: list[str] = []                      # what was fsync'd, by path
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (
        synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1])
    snap, skipped = snapops.latest_verified(remote.url, RUN, lfs_token_file=token)
    assert snap.meta["gen"] == GENS and skipped == [] and snap.meta["lfs_fetched"] == 4
    assert list(scratch.iterdir()) == []        # private repository and object cache removed
    assert not [p for p in synced if p.startswith(str(scratch))]   # a throw-away cache
    cache = tmp_path / "cache"
    arrived: list[int] = []
    snap = snapops.load_generation(bare, RUN, gen=4, lfs_token_file=token, lfs_cache=cache,
                                   lfs_progress=arrived.append)
    assert snap.meta["lfs_fetched"] == 6 and snap["b"].tobytes() == weights(4)["b"].tobytes()
    assert [p for p in synced if p.startswith(str(cache))]         # a kept one is durable
    manifests = remote.manifests()
    sizes = {s.object: s.object_size for m in manifests.values() for s in m.shards}
    chains = set().union(*(chain_objects(manifests, 4, s) for s in manifests[4].shards))
    assert sum(arrived) == sum(sizes[oid] for oid in chains)     # every downloaded byte told
    again = snapops.load_generation(f"file://{bare}", RUN, gen=3, lfs_token_file=token,
                                    lfs_cache=cache, lfs_url=remote.lfs.url)
    assert again.meta["lfs_fetched"] == 0       # its whole chain (gens 3 and 1) is cached
    assert again["a"].tobytes() == weights(3)["a"].tobytes()


def test_a_url_fetches_only_the_base_tags_and_the_default_branch(remote):
    with open_repository(remote.url) as repo:
        def count() -> str:        # commits in the private repository
            return git("rev-list", "--all", "--count", cwd=repo.git.cwd)

        assert repo.manifests(RUN)(4).startswith(b"SNAPOPS-MANIFEST 2\n")
        assert count() == "1" and (Path(repo.git.cwd) / "shallow").is_file()
        assert repo.retention(RUN) is None and count() == "2"
        assert repo.manifests(RUN)(9) is None            # no such tag: nothing fetched
        assert count() == "2"


def test_a_wrong_lfs_endpoint_is_one_line_naming_it_without_secrets(remote, tmp_path, capsys):
    port = free_port()
    token = tmp_path / "token"
    token.write_text("tok-Very-Secret\n")
    bad_token = remote.lfs.token_file(tmp_path, "read")
    bad_token.write_text("not-a-jwt\n")
    cases = [
        (["--lfs-url", f"http://user:s3cret@127.0.0.1:{port}/x.git/info/lfs?key=abc",
          "--lfs-token-file", str(token)],
         f"LFS endpoint http://***@127.0.0.1:{port}/x.git/info/lfs?key=***"),
        (["--lfs-url", remote.lfs.url.replace(REPO, "nope")], "/nope.git/info/lfs"),
        (["--lfs-url", "ftp://user:pw@host/lfs"], "expected an http(s):// Git LFS endpoint"),
        (["--lfs-token-file", str(bad_token)], "HTTP 401"),
        (["--lfs-token-file", str(tmp_path / "absent")], "LFS token: cannot read"),
    ]
    for args, says in cases:
        out = tmp_path / "x.npz"
        code = main([*remote.restore("--gen", "5", "-o", str(out)), *args])
        err = capsys.readouterr().err
        assert code == 2, (args, err)
        line, = err.splitlines()
        assert says in line and "Traceback" not in line, line
        assert not re.search(r"s3cret|Very-Secret|abc|:pw@", line), line
        assert not out.exists()
    first = main([*remote.restore("--gen", "5", "-o", str(tmp_path / "y.npz")), "--lfs-url",
                  f"http://127.0.0.1:{port}/x.git/info/lfs"])
    assert first == 2
    assert "expected a Git LFS server whose batch API grants read access" in \
        capsys.readouterr().err


def test_pruned_generations_are_refused_and_skipped_with_the_retention_reason(remote, tmp_path,
                                                                              capsys):
    clone = tmp_path / "clone"
    plain_clone(remote.bare, clone)
    assert main(["lfs", "prune", str(clone), "--run", RUN, "--keep-last", "2",
                 "--local-storage", str(remote.lfs.storage / ORG / REPO)]) == 0
    reason = "pruned by retention (policy keep_last=2 keep_every=0 milestones=-)"
    assert "kept gens [4, 5], pruned [1, 2, 3]" in capsys.readouterr().out
    for args in (("add", "-A"), ("-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm",
                                 "retention"), ("push", "-q", "origin", "HEAD")):
        git(*args, cwd=clone)
    out = tmp_path / "g2.npz"
    assert main(remote.restore("--gen", "2", "-o", str(out))) == 1
    err = capsys.readouterr().err
    assert f"[pruned] gen 2 {reason}" in err and not out.exists()
    assert main(remote.restore("--gen", "5", "-o", str(out))) == 0     # kept: its chain is there
    capsys.readouterr()
    for oid in {s.object for s in remote.manifests()[1].shards}:       # lose the keyframes
        (remote.lfs.storage / ORG / REPO / oid).unlink()
    assert main(remote.restore("--latest-verified", "-o", str(out))) == 1
    err = capsys.readouterr().err
    skipped = dict(re.findall(r"skipped gen (\d+): (.*)", err))
    assert sorted(skipped) == ["1", "2", "3", "4", "5"]
    for gen in "123":
        assert f"gen {gen} {reason}" in skipped[gen]
    assert "[lfs]" in skipped["4"] and "[lfs]" in skipped["5"]
