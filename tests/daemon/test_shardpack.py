"""Shards stored in the daemon's own packs (whole, or as deltas for sparse pushes), checked
against the real git: our pack and index are the ones git would accept and write
(``index-pack`` makes the same index byte for byte, ``fsck --strict`` passes, ``cat-file``
reads every blob back), ``git push`` reuses what the packs hold, and a real daemon's
generations land on the remote bit-exact with their shards stored as deltas of the previous
generation's."""

from __future__ import annotations

import base64
import os
import random
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from snapops.daemon.shardpack import Candidate, write_shard_pack
from snapops.daemon.gitops import SnapshotRepo
from snapops.daemon.localhistory import CUT_MARK
from snapops.daemon.gitpack import BLOCK, IndexEntry, PackWriter, git_delta, index_bytes
from snapops.formats.errors import GitError
from tests.daemon.daemon_env import DaemonEnv
from tests.daemon.gitserve import git, git_bytes, init_bare


def blob_id(data: bytes, cwd: Path) -> str:
    return subprocess.run(["git", "hash-object", "--stdin"], input=data, cwd=cwd,
                          capture_output=True, check=True).stdout.decode().strip()


def text_state(rng, rows: int, header: bytes = b"meta gen=1\n") -> bytes:
    """WTXT-like text: a header line, then base64 lines of random rows."""
    raw = rng.integers(0, 256, (rows, 768), dtype=np.uint8)
    return header + base64.encodebytes(raw.tobytes())


@pytest.fixture
def empty_repo(tmp_path):
    git("init", "-q", str(tmp_path / "r"))
    return tmp_path / "r"


def pack_pair(repo: Path, base: bytes, target: bytes) -> tuple[str, str]:
    """Pack ``base`` whole and ``target`` as our delta of it into ``repo``; return their ids."""
    old, new = blob_id(base, repo), blob_id(target, repo)
    delta = git_delta(base, target, limit=len(target) + 1)
    assert delta is not None
    pack_dir = repo / ".git" / "objects" / "pack"
    chunks = []
    pack = PackWriter(chunks.append, 2)
    pack.add_blob(old, base)
    pack.add_delta(new, old, delta)
    sha = pack.finish()
    (pack_dir / f"pack-{sha.hex()}.pack").write_bytes(b"".join(chunks))
    ours = index_bytes(pack.entries, sha)
    (pack_dir / f"pack-{sha.hex()}.idx").write_bytes(ours)
    outside = repo.parent / "outside"   # no repository: git indexes the pack on its own
    outside.mkdir()
    (outside / "p.pack").write_bytes(b"".join(chunks))
    git("index-pack", "-o", str(outside / "p.idx"), str(outside / "p.pack"), cwd=outside)
    assert (outside / "p.idx").read_bytes() == ours, "git writes the same index"
    return old, new


CASES = {
    "same size, rows changed": lambda b: b[:5000] + b"X" * 700 + b[5700:-900] + b"Y" * 900,
    "header grew": lambda b: b"meta gen=10\n" + b[11:],
    "header shrank by 3": lambda b: b"g\n" + b[5:],
    "tail not a whole block": lambda b: b[: len(b) - 100] + b"Z" * 37,
    "appended": lambda b: b + b"more" * 300,
    "target smaller than a block": lambda b: b[:BLOCK - 1],
    "one byte": lambda b: b[:1],
    "start and end changed": lambda b: b"Q" * 10 + b[10:-10] + b"R" * 10,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_git_reads_our_delta_back_exactly(empty_repo, case):
    base = text_state(np.random.default_rng(7), 120)
    target = CASES[case](base)
    old, new = pack_pair(empty_repo, base, target)
    assert git_bytes("cat-file", "blob", new, cwd=empty_repo) == target
    assert git_bytes("cat-file", "blob", old, cwd=empty_repo) == base
    git("fsck", "--strict", "--no-dangling", cwd=empty_repo)
    listing = git("verify-pack", "-v", *map(str, (empty_repo / ".git/objects/pack").glob("*.idx")))
    assert re.search(rf"^{new} blob .* {old}$", listing, re.M), "stored as a delta of the old"


def test_a_dense_change_or_an_empty_target_gives_no_delta():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, 64 * BLOCK, dtype=np.uint8).tobytes()
    changed = bytearray(base)
    changed[::BLOCK] = bytes(b ^ 1 for b in changed[::BLOCK])    # every block differs
    assert git_delta(base, bytes(changed), limit=len(base) // 4) is None
    assert git_delta(base, b"", limit=len(base)) is None
    sparse = bytearray(base)
    sparse[3 * BLOCK] ^= 1
    delta = git_delta(base, bytes(sparse), limit=len(base) // 4)
    assert delta is not None and len(delta) < 2 * BLOCK


def test_large_offsets_go_to_the_64_bit_table():
    """An index of a pack past 2 GiB (no such file needed: git reads the index alone)."""
    entries = [IndexEntry(bytes([i * 40]) + bytes(19), offset, 1000 + i)
               for i, offset in enumerate([12, (1 << 31) + 5, (1 << 33) + 7, 1 << 31])]
    shown = subprocess.run(["git", "show-index"], input=index_bytes(entries, bytes(20)),
                           capture_output=True, check=True).stdout.decode().splitlines()
    assert [tuple(line.split()[:2]) for line in shown] == \
        [(str(e.offset), e.oid.hex()) for e in entries]
    assert [line.split()[2] for line in shown] == [f"({e.crc32:08x})" for e in entries]


# -- the work repository ------------------------------------------------------------------

def sparse_generations(repo: SnapshotRepo, gens: int, rows: int = 2048, files: int = 3,
                       push_to: Path | None = None) -> list[list[str]]:
    """Commit ``gens`` generations of ``files`` large text files, 1% of rows changed each
    time (packed whole by pack_shards, then as deltas); return each push's progress lines."""
    rng = np.random.default_rng(3)
    raws = [rng.integers(0, 256, (rows, 768), dtype=np.uint8) for _ in range(files)]
    names = [f"shards/{i:04d}.wtxt" for i in range(files)]
    pushes = []
    for gen in range(1, gens + 1):
        for name, raw in zip(names, raws):
            if gen > 1:
                picked = rng.choice(rows, rows // 100, replace=False)
                raw[picked] = rng.integers(0, 256, (len(picked), 768), dtype=np.uint8)
            path = repo.path / name
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(b"meta gen=%d\n" % gen + base64.encodebytes(raw.tobytes()))
        packed = repo.pack_shards(names)
        assert packed is not None and len(packed.paths) == files
        assert packed.deltas == (0 if gen == 1 else files)
        stored = dict(zip(packed.paths, packed.oids))
        repo.commit_generation(names, f"gen {gen}", f"t/gen-{gen:06d}", stored=stored)
        if push_to is not None:
            lines: list[str] = []
            repo.push(str(push_to), [f"t/gen-{gen:06d}"], on_line=lines.append)
            pushes.append(lines)
    return pushes


def test_pushes_reuse_the_deltas_and_the_remote_has_every_generation(tmp_path):
    remote = init_bare(tmp_path / "remote.git")
    git("config", "core.looseCompression", "0", cwd=remote)
    with SnapshotRepo(tmp_path / "repo") as repo:
        pushes = sparse_generations(repo, 3, push_to=remote)
        work = repo.path
    for gen, lines in enumerate(pushes, start=1):
        total = next(line for line in lines if line.startswith("Total"))
        # gen 1: the whole blobs are sent as the daemon packed them; then the deltas
        assert ("reused 3 (delta 0)" if gen == 1 else "reused 3 (delta 3)") in total, total
    git("fsck", "--strict", cwd=work)
    git("fsck", "--strict", cwd=remote)
    for gen in (1, 2, 3):
        for i in range(3):
            spec = f"t/gen-{gen:06d}:shards/{i:04d}.wtxt"
            assert git_bytes("cat-file", "blob", spec, cwd=remote) == \
                git_bytes("cat-file", "blob", spec, cwd=work)
    # the shards of gen 3 are stored as deltas of gen 2's, and no loose copy is left
    check = subprocess.run(["git", "cat-file", "--batch-check=%(objectname) %(deltabase)"],
                           input="".join(f"t/gen-000003:shards/{i:04d}.wtxt\n"
                                         for i in range(3)),
                           cwd=work, capture_output=True, text=True, check=True).stdout
    bases = [line.split()[1] for line in check.splitlines()]
    assert bases == [git("rev-parse", f"t/gen-000002:shards/{i:04d}.wtxt", cwd=work)
                     for i in range(3)]
    loose = {p.parent.name + p.name for p in (work / ".git/objects").glob("??/*")}
    assert not loose & {line.split()[0] for line in check.splitlines()}


def test_each_pack_holds_a_bounded_share_of_deltas(tmp_path, monkeypatch):
    monkeypatch.setattr("snapops.daemon.shardpack.HELD_MAX", 1)   # one delta per pack
    remote = init_bare(tmp_path / "remote.git")
    with SnapshotRepo(tmp_path / "repo") as repo:
        pushes = sparse_generations(repo, 2, push_to=remote)
        work = repo.path
    # gen 1: one pack of 3 whole blobs; gen 2: 3 packs of one delta (and its base) each
    assert len(list((work / ".git/objects/pack").glob("pack-*.idx"))) == 4
    assert any("reused 3 (delta 3)" in line for line in pushes[1])
    git("fsck", "--strict", cwd=work)
    for i in range(3):
        spec = f"t/gen-000002:shards/{i:04d}.wtxt"
        assert git_bytes("cat-file", "blob", spec, cwd=remote) == \
            (work / f"shards/{i:04d}.wtxt").read_bytes()


def test_small_unchanged_dense_or_linked_files_are_left_to_git(tmp_path):
    with SnapshotRepo(tmp_path / "repo") as repo:
        rng = np.random.default_rng(5)
        files = {"small": rng.bytes(1000), "same": rng.bytes(2 << 20),
                 "dense": rng.bytes(2 << 20), "linked": rng.bytes(2 << 20)}
        for name, data in files.items():
            (repo.path / name).write_bytes(data)
        repo.commit_generation(list(files), "gen 1", "t/gen-000001")
        assert repo.pack_shards(list(files)) is None          # nothing changed yet
        (repo.path / "small").write_bytes(rng.bytes(1000))
        (repo.path / "dense").write_bytes(rng.bytes(2 << 20))
        sparse = bytearray(files["linked"])
        sparse[10] ^= 1
        (tmp_path / "elsewhere").write_bytes(bytes(sparse))
        (repo.path / "linked").unlink()
        (repo.path / "linked").symlink_to(tmp_path / "elsewhere")   # never followed
        packed = repo.pack_shards(list(files))
        assert (packed.paths, packed.deltas) == (("dense",), 0)     # a dense change: whole
        (repo.path / "linked").unlink()
        os.mkfifo(repo.path / "linked")                              # never waited on
        assert repo.pack_shards(list(files)) is None                # (dense is stored now)
        assert len(list((repo.path / ".git/objects/pack").glob("*.pack"))) == 1
        # a file git add would convert (a filter, text/eol, ident, an encoding) is left to it
        (repo.path / "linked").unlink()
        (repo.path / "linked").write_bytes(bytes(sparse))
        for attrs in ("linked filter=lfs", "linked text eol=crlf", "linked ident"):
            (repo.path / ".gitattributes").write_text(attrs + "\n")
            assert repo.pack_shards(list(files)) is None, attrs
        (repo.path / ".gitattributes").write_text("linked -text -delta\n")
        packed = repo.pack_shards(list(files))
        assert (packed.paths, packed.deltas) == (("linked",), 1)
        # a shard the caller knows changed densely is packed whole, without a delta tried
        (repo.path / "linked").write_bytes(bytes(reversed(sparse)))
        packed = repo.pack_shards(list(files), dense=["linked"])
        assert (packed.paths, packed.deltas) == (("linked",), 0)


def test_a_blob_git_already_has_is_not_packed_again(tmp_path):
    """Git would read its own copy, never ours: nothing to check, nothing to gain."""
    with SnapshotRepo(tmp_path / "repo") as repo:
        first = np.random.default_rng(9).bytes(2 << 20)
        changed = bytearray(first)
        changed[1000] ^= 1
        for gen, data in enumerate([first, bytes(changed), first], start=1):
            (repo.path / "x").write_bytes(data)
            packed = repo.pack_shards(["x"])
            assert (packed is not None) == (gen != 3)
            repo.commit_generation(["x"], f"gen {gen}", f"t/gen-{gen:06d}",
                                   stored=dict(zip(packed.paths, packed.oids)) if packed else {})
        assert git_bytes("cat-file", "blob", "HEAD:x", cwd=repo.path) == first
        git("fsck", "--strict", cwd=repo.path)


def test_a_pack_git_reads_back_wrong_is_removed_and_nothing_is_lost(tmp_path, monkeypatch):
    """Were a delta wrong, git would read other bytes back: the pack goes, and the commit
    stores the file whole as usual."""
    with SnapshotRepo(tmp_path / "repo") as repo:
        sparse_generations(repo, 1)
        path = repo.path / "shards/0000.wtxt"
        data = bytearray(path.read_bytes())
        data[5000] ^= 1
        path.write_bytes(bytes(data))
        tracked = [Candidate("shards/0000.wtxt",
                             git("rev-parse", "HEAD:shards/0000.wtxt", cwd=repo.path))]
        new = blob_id(bytes(data), repo.path)
        packs = set((repo.git_dir / "objects/pack").iterdir())   # gen 1's, whole

        def cat_blob(oid, out):
            repo._cat_blob(oid, out)
            if oid == new:  # what a wrong delta would make git read
                out.seek(100)
                out.write(b"?")
                out.flush()

        with pytest.raises(GitError, match="git read other bytes back for shards/0000.wtxt"):
            write_shard_pack(repo.git_dir, repo.path, tracked, cat_blob=cat_blob,
                             has_object=lambda oid: False, blob_sizes=repo._blob_sizes)
        assert set((repo.git_dir / "objects/pack").iterdir()) == packs
        repo.commit_generation(["shards/0000.wtxt"], "gen 2", "t/gen-000002")
        assert git_bytes("cat-file", "blob", "HEAD:shards/0000.wtxt", cwd=repo.path) == data
        git("fsck", "--strict", cwd=repo.path)


def whole_repo(tmp_path: Path) -> tuple[SnapshotRepo, bytes]:
    repo = SnapshotRepo(tmp_path / "repo")
    data = np.random.default_rng(4).bytes(3 << 20)
    (repo.path / "x").write_bytes(data)
    return repo, data


def test_whole_shards_are_stored_exactly_with_no_loose_copy(tmp_path):
    repo, data = whole_repo(tmp_path)
    with repo:
        packed = repo.pack_shards(["x"])
        assert (packed.paths, packed.deltas, packed.blob_bytes) == (("x",), 0, len(data))
        assert packed.oids == (blob_id(data, repo.path),)
        repo.commit_generation(["x"], "gen 1", "t/gen-000001",
                               stored=dict(zip(packed.paths, packed.oids)))
        assert git_bytes("cat-file", "blob", "HEAD:x", cwd=repo.path) == data
        git("fsck", "--strict", cwd=repo.path)
        oid = packed.oids[0]
        assert not (repo.git_dir / "objects" / oid[:2] / oid[2:]).exists()   # no loose copy
        verified = git("verify-pack", "-v", *map(str, (repo.git_dir / "objects/pack").glob(
            "*.idx")), cwd=repo.path)
        assert f"{packed.oids[0]} blob   {len(data)}" in verified


def test_a_file_changed_after_it_was_hashed_is_not_packed(tmp_path):
    """The pack copies the file as it was hashed, or not at all: the commit then stores the
    file as it is now, through git add."""
    repo, data = whole_repo(tmp_path)
    with repo:
        def rewrite(oid):   # called between hashing and packing, as a rogue writer would
            (repo.path / "y").write_bytes(b"other" + data[5:])
            os.replace(repo.path / "y", repo.path / "x")
            return False

        with pytest.raises(GitError, match="changed after it was hashed"):
            write_shard_pack(repo.git_dir, repo.path, [Candidate("x", None)],
                             cat_blob=repo._cat_blob, has_object=rewrite,
                             blob_sizes=repo._blob_sizes)
        assert not [p for p in (repo.git_dir / "objects/pack").iterdir()]
        repo.commit_generation(["x"], "gen 1", "t/gen-000001")
        assert git_bytes("cat-file", "blob", "HEAD:x", cwd=repo.path) == b"other" + data[5:]


def test_a_whole_blob_git_does_not_list_as_written_removes_the_pack(tmp_path):
    repo, data = whole_repo(tmp_path)
    with repo:
        def sizes(oids):
            return {oid: size + 1 for oid, size in repo._blob_sizes(oids).items()}

        with pytest.raises(GitError, match="git read other bytes back for x"):
            write_shard_pack(repo.git_dir, repo.path, [Candidate("x", None)],
                             cat_blob=repo._cat_blob, has_object=lambda oid: False,
                             blob_sizes=sizes)
        assert not [p for p in (repo.git_dir / "objects/pack").iterdir()]
        assert repo._blob_sizes([blob_id(data, repo.path)]) == {blob_id(data, repo.path): None}


# -- the daemon ---------------------------------------------------------------------------

def test_daemon_stores_sparse_shards_as_deltas_and_the_remote_gets_them_exactly(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)}, shard_max="4MiB")
    rng = np.random.default_rng(11)
    weight = rng.standard_normal((1024, 1024)).astype(np.float32)
    states = {}
    for gen in (1, 2, 3):
        if gen > 1:
            rows = rng.choice(1024, 10, replace=False)
            weight[rows] += np.float32(0.001)
        states[gen] = {"w": weight.copy(), "step": np.array(gen, np.int64)}
    env.push_all(states)
    log = env.log.read_text()
    assert re.search(r"gen 1: \d+ shard\(s\) packed, 0 of them as deltas", log), log[-2000:]
    assert re.search(r"gen 2: \d+ shard\(s\) packed, [1-9]\d* of them as deltas", log), \
        log[-2000:]
    assert re.search(r"gen 3: \d+ shard\(s\) packed, [1-9]\d* of them as deltas", log), \
        log[-2000:]
    clone = tmp_path / "clone"
    git("clone", "-q", str(bare), str(clone))
    git("fsck", "--strict", cwd=env.repo)
    from snapops.restore import load_generation

    for gen, state in states.items():
        loaded = load_generation(str(bare), "t", gen=gen)
        assert loaded.arrays["w"].dtype == np.float32
        assert np.array_equal(loaded.arrays["w"].view(np.uint32), state["w"].view(np.uint32))
    shards = git("ls-tree", "-r", "--name-only", "t/gen-000003", "--", "snapshots/t/shards",
                 cwd=env.repo).splitlines()
    check = subprocess.run(["git", "cat-file", "--batch-check=%(deltabase)"],
                           input="".join(f"t/gen-000003:{s}\n" for s in shards), text=True,
                           cwd=env.repo, capture_output=True, check=True).stdout.split()
    previous = {git("rev-parse", f"t/gen-000002:{s}", cwd=env.repo) for s in shards}
    assert set(check) & previous, "a gen-3 shard is stored as a delta of its gen-2 version"



def test_cutting_history_keeps_every_kept_generation_readable(tmp_path):
    """Maintenance drops old generations: a kept shard whose delta base goes is stored whole."""
    remote = init_bare(tmp_path / "remote.git")
    with SnapshotRepo(tmp_path / "repo") as repo:
        sparse_generations(repo, 4, push_to=remote)
        kept = {gen: {i: git_bytes("cat-file", "blob", f"t/gen-{gen:06d}:shards/{i:04d}.wtxt",
                                   cwd=repo.path) for i in range(3)} for gen in (3, 4)}
        sizes = repo.forget_history(repo.tag_commit("t/gen-000003"),
                                    ["t/gen-000001", "t/gen-000002"])
        assert sizes is not None and sizes["after"] < sizes["before"]
        git("fsck", "--strict", cwd=repo.path)
        for gen, shards in kept.items():
            for i, data in shards.items():
                assert git_bytes("cat-file", "blob", f"t/gen-{gen:06d}:shards/{i:04d}.wtxt",
                                 cwd=repo.path) == data
        # and the next sparse generation still goes as deltas
        pushes = sparse_generations_after(repo, remote, gen=5)
    assert any("(delta 3)" in line and "reused 3" in line for line in pushes)


def sparse_generations_after(repo: SnapshotRepo, remote: Path, gen: int) -> list[str]:
    names = [f"shards/{i:04d}.wtxt" for i in range(3)]
    for name in names:
        data = bytearray((repo.path / name).read_bytes())
        data[40_000:40_100] = b"A" * 100
        (repo.path / name).write_bytes(bytes(data))
    packed = repo.pack_shards(names)
    assert packed is not None and packed.deltas == 3
    repo.commit_generation(names, f"gen {gen}", f"t/gen-{gen:06d}",
                           stored=dict(zip(packed.paths, packed.oids)))
    lines: list[str] = []
    repo.push(str(remote), [f"t/gen-{gen:06d}"], on_line=lines.append)
    return lines


@pytest.mark.slow
def test_a_daemon_killed_while_packing_recovers_exactly(tmp_path):
    """SIGKILL at random points of sparse generations (serialize, delta pack, commit, push):
    after a restart every committed generation is on the remote bit-exact, once, and both
    repositories pass ``fsck --strict``."""
    from tests.daemon.test_service import assert_recovered_exactly

    rng = random.Random(7)
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)}, shard_max="4MiB")
    weights = np.random.default_rng(2).standard_normal((1024, 1024)).astype(np.float32)
    expected = {}

    def request(client):
        for _ in range(2):
            gen = len(expected) + 1
            weights[rng.sample(range(1024), 10)] += np.float32(0.5)
            expected[gen] = {"w": weights.copy(), "step": np.array(gen, np.int64)}
            client.request(expected[gen], gen)

    env.kill_cycles(rng, 3, request, pause=(0.5, 2.5))
    assert_recovered_exactly(env, bare, tmp_path, expected)
    git("fsck", "--strict", cwd=env.repo)
    git("fsck", "--strict", cwd=bare)
    assert "of them as deltas" in env.log.read_text()


def test_cutting_history_rewrites_only_packs_holding_something_to_drop(tmp_path):
    """Dense generations are packed whole, one pack each: a history cut deletes the packs of
    the dropped generations and leaves the kept ones as they are (not copied again)."""
    with SnapshotRepo(tmp_path / "repo") as repo:
        rng = np.random.default_rng(8)
        packs = {}
        for gen in range(1, 5):
            before = set((repo.git_dir / "objects/pack").glob("*.pack"))
            (repo.path / "x").write_bytes(rng.bytes(2 << 20))
            (repo.path / "same").write_bytes(b"unchanged\n")
            packed = repo.pack_shards(["x", "same"])
            repo.commit_generation(["x", "same"], f"gen {gen}", f"t/gen-{gen:06d}",
                                   stored=dict(zip(packed.paths, packed.oids)))
            new, = set((repo.git_dir / "objects/pack").glob("*.pack")) - before
            packs[gen] = (new, new.stat().st_ino)
        kept = {gen: git_bytes("cat-file", "blob", f"t/gen-{gen:06d}:x", cwd=repo.path)
                for gen in (3, 4)}
        (repo.git_dir / "objects/pack" / (packs[4][0].stem + ".keep")).write_bytes(
            CUT_MARK)                                               # a killed cut's mark
        repo.forget_history(repo.tag_commit("t/gen-000003"), ["t/gen-000001", "t/gen-000002"])
        left = set((repo.git_dir / "objects/pack").glob("*.pack"))
        assert not {packs[1][0], packs[2][0]} & left
        assert all(path.stat().st_ino == ino for path, ino in (packs[3], packs[4]))
        # the one new pack holds what was loose (commits, trees, small files), no shard
        assert all(p.stat().st_size < 64 << 10 for p in left - {packs[3][0], packs[4][0]})
        assert not list((repo.git_dir / "objects/pack").glob("*.keep"))
        for gen, data in kept.items():
            assert git_bytes("cat-file", "blob", f"t/gen-{gen:06d}:x", cwd=repo.path) == data
        git("fsck", "--strict", cwd=repo.path)
