"""Retention of an LFS-store run: the right objects go, kept chains stay whole, pruned
generations verify as "pruned by retention", a restore of one says so, kept ones restore."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from snapops.formats.errors import FormatError, SnapopsError
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.manifest import parse_manifest
from snapops.formats.generation.source import GitTreeSource
from snapops.formats.generation.verify import GenerationOptions, verify_generation
from snapops.formats.generation.write import (
    GenerationSpec,
    seal_in_ledger,
    write_generation,
)
from snapops.formats.lfs.client import LfsClient
from snapops.formats.lfs.objects import ObjectStore
from snapops.formats.lfs.retention import Policy, parse_record, plan_retention
from snapops.formats.lfs.source import LfsSource, tag_manifests
from snapops.formats.lfs.stash import LfsStash
from snapops.hooks.gitio import Git

from snapops.cli import main
from snapops.formats.lfs.access import read_record

from ..daemon.gitserve import git
from .giftless_env import ORG, REPO

GENS, K = 9, 3      # keyframes at gens 1 and 8: a restore applies at most K - 1 = 2 residuals
KEYFRAMES = (1, 8)


def chain(gen: int) -> set[int]:
    """Independently of the stash: the gens a restore of ``gen`` reads (skip residuals, shard
    number n against n & (n - 1) since the keyframe)."""
    key = max(k for k in KEYFRAMES if k <= gen)
    number, gens = gen - key, {gen}
    while number:
        number &= number - 1
        gens.add(key + number)
    return gens


def state(gen: int) -> dict[str, np.ndarray]:
    w = np.random.default_rng(0).standard_normal((2, 64, 64)).astype(np.float32)
    step = np.random.default_rng(gen).standard_normal(w.shape).astype(np.float32)
    return {"w": w * (1 + np.float32(1e-3) * gen * step)}


@pytest.fixture
def lfs_run(tmp_path, giftless):
    """GENS generations of run r written with the LFS stash, committed and tagged by git."""
    repo = tmp_path / "repo"
    git("init", "-q", "-b", "main", str(repo))
    git("config", "user.email", "t@t", cwd=repo)
    git("config", "user.name", "t", cwd=repo)
    stash = LfsStash(ObjectStore(tmp_path / "cache", LfsClient(giftless.url, giftless.token())),
                     keyframe_every=K)
    spec = GenerationSpec(run="r", format="aero", store="lfs", lfs=stash)
    previous, objects = None, {}
    for gen in range(1, GENS + 1):
        written = write_generation(repo, spec, gen, f"2026-01-02T03:04:{gen:02d}Z", state(gen),
                                   previous)
        seal_in_ledger(repo, "r", written)
        previous = written.data
        objects[gen] = {s.object for s in written.manifest.shards}
        git("add", "-A", cwd=repo)
        git("commit", "-qm", f"gen {gen}", cwd=repo)
        git("tag", f"r/gen-{gen:06d}", cwd=repo)
    return repo, objects


def test_prune_never_writes_its_record_through_a_symlink(lfs_run, giftless, tmp_path, capsys):
    """A `retention` folder checked out as a symlink: the record would have been written
    outside the repository. Refused before any object is deleted."""
    repo, objects = lfs_run
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "retention").symlink_to(outside, target_is_directory=True)
    code = main(["lfs", "prune", str(repo), "--run", "r", "--keep-last", "2",
                 "--local-storage", str(giftless.storage / ORG / REPO)])
    assert code != 0 and list(outside.iterdir()) == []
    assert "retention/r.retention: [fileset] retention is a symlink (not followed)" \
        in capsys.readouterr().err          # the record is read, through the same rule, first
    assert set(giftless.objects()) == set().union(*objects.values())


def test_prune_keeps_exactly_the_chains_of_kept_generations(lfs_run, giftless, tmp_path,
                                                            capsys):
    repo, objects = lfs_run
    assert set(giftless.objects()) == set().union(*objects.values())
    git("tag", "r/milestone-premi\u00e8re-\u00e9val", "r/gen-000002", cwd=repo)   # not ASCII
    code = main(["lfs", "prune", str(repo), "--run", "r", "--keep-last", "2", "--keep-every",
                 "5", "--local-storage", str(giftless.storage / ORG / REPO), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    kept = {8, 9} | {5} | {2}
    assert summary["kept"] == sorted(kept)
    needed = set().union(*(chain(k) for k in kept))
    assert needed == {1, 2, 5, 8, 9}
    assert set(giftless.objects()) == set().union(*(objects[g] for g in needed))
    assert summary["objects_deleted"] == len(set().union(*objects.values())) - \
        len(giftless.objects())
    record = parse_record((repo / "retention/r.retention").read_bytes())
    assert record.pruned == {1, 3, 4, 6, 7}
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "retention", cwd=repo)
    # verification: pruned gens report it (never missing or corrupt), kept ones fully
    assert read_record(Git(repo), str(repo), "r") == record
    store = ObjectStore(tmp_path / "fresh", LfsClient(giftless.url, giftless.token("read")))
    options = GenerationOptions(retention=record)
    for gen in range(1, GENS + 1):
        scratch = tmp_path / f"s{gen}"
        scratch.mkdir()
        src = LfsSource(GitTreeSource(Git(repo), f"r/gen-{gen:06d}", scratch), "r", store,
                        manifests=tag_manifests(Git(repo), "r"))
        report = verify_generation(src, "r", options)
        assert report.ok, report.failure
        if gen in record.pruned:
            assert report.details["pruned"] == f"gen {gen} pruned by retention (policy " \
                "keep_last=2 keep_every=5 milestones=2)"
            with pytest.raises(FormatError, match="pruned by retention"):
                load_from_source(src, "r", options=options)
        else:
            assert "shards" in report.checks
            snap = load_from_source(src, "r", options=options)
            assert snap["w"].tobytes() == state(gen)["w"].tobytes()
    code = main(["verify", str(repo), "--run", "r", "--rev", "r/gen-000003", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and "gen 3 pruned by retention (policy keep_last=2" in out
    token = giftless.token_file(tmp_path, "read")
    restore = ["lfs", "restore", str(repo), "--run", "r", "--lfs-url", giftless.url,
               "--lfs-token-file", str(token)]
    # `snapops lfs restore` is an alias of `snapops restore`: a pruned generation exits 1
    assert main(restore + ["--rev", "r/gen-000003", "--out", str(tmp_path / "g3.npz")]) == 1
    assert "gen 3 pruned by retention" in capsys.readouterr().err
    assert main(restore + ["--rev", "r/gen-000009", "--out", str(tmp_path / "g9.npz")]) == 0
    assert "2 LFS object(s) fetched" in capsys.readouterr().out      # keyframe 8, residual 9
    with np.load(tmp_path / "g9.npz") as npz:
        assert npz["w"].tobytes() == state(9)["w"].tobytes()
    # the newest generation, with the record of its own tree: kept, so it verifies
    assert main(["verify", str(repo), "--run", "r"]) == 0
    capsys.readouterr()
    # a record in that same tree claiming the newest is pruned holds no policy: refused
    (repo / "retention/r.retention").write_bytes(
        record.render().replace(b"pruned 1,3,4,6,7", b"pruned 1,3,4,6,7,9"))
    assert main(["verify", str(repo), "--run", "r"]) == 1
    assert re.search(r"retention/r\.retention: \[retention\] it prunes gen 9, the newest "
                     r"generation of its own tree", capsys.readouterr().err)


def test_plan_never_breaks_a_chain_and_refuses_a_missing_base(lfs_run):
    repo, _ = lfs_run
    manifests = {g: parse_manifest(git("show", f"r/gen-{g:06d}:snapshots/r/MANIFEST",
                                       cwd=repo).encode() + b"\n") for g in range(1, GENS + 1)}
    plan = plan_retention(manifests, Policy(1))
    assert plan.kept == {9}
    assert len(plan.keep_objects) == len(chain(9)) == 2      # keyframe 8, residual 9
    del manifests[8]
    with pytest.raises(FormatError, match="base"):
        plan_retention(manifests, Policy(1))


@pytest.mark.parametrize("body,why", [
    # found by the fuzzer: a list out of order or with a repeat parsed into a set, so the
    # record rendered back to other bytes than it was read from
    ("milestones=-\npruned 6,2", r"pruned generations are not in increasing order"),
    ("milestones=-\npruned 2,2,6", r"pruned generations are not in increasing order"),
    ("milestones=5,3\npruned 2", r"milestone generations are not in increasing order"),
    # a record that prunes what its own policy keeps does not come from `snapops lfs prune`
    ("milestones=3\npruned 1,3", r"it prunes gen 3, which its own policy keeps"),
    ("milestones=-\npruned 1,10", r"it prunes gen 10, which its own policy keeps"),
])
def test_a_record_is_canonical_and_keeps_what_its_policy_keeps(body, why):
    data = f"SNAPOPS-RETENTION 1\npolicy keep_last=2 keep_every=5 {body}\n".encode()
    with pytest.raises(FormatError, match=r"retention/r\.retention: .*" + why):
        parse_record(data, "retention/r.retention")


def test_a_record_that_holds_renders_back_to_its_bytes():
    data = b"SNAPOPS-RETENTION 1\npolicy keep_last=2 keep_every=5 milestones=3,7\npruned 1,2,4\n"
    record = parse_record(data)
    assert record.render() == data and record.pruned == {1, 2, 4}


def test_a_work_tree_record_is_read_as_untrusted_input(tmp_path):
    """A checked-out tree may hold a symlink (pointing at any file or folder) or a huge file
    where the record belongs: read_record read either whole; now each is one typed error."""
    (tmp_path / "retention").mkdir()
    record = tmp_path / "retention" / "r.retention"
    os.symlink("/etc/passwd", record)
    with pytest.raises(FormatError, match=r"r\.retention: .*not a regular file \(a symlink"):
        read_record(None, tmp_path, "r")
    record.unlink()
    record.write_bytes(b"SNAPOPS-RETENTION 1\n" + b"x" * (4 << 20))
    with pytest.raises(SnapopsError, match=r"r\.retention: .*at most 4194304 bytes"):
        read_record(None, tmp_path, "r")
    record.write_bytes(b"SNAPOPS-RETENTION 1\npolicy keep_last=2\npruned 1\n")
    (tmp_path / "retention").rename(tmp_path / "elsewhere")
    (tmp_path / "retention").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(FormatError, match=r"\[fileset\] retention is a symlink \(not followed"):
        read_record(None, tmp_path, "r")
