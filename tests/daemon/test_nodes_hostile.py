"""The committer against hostile part refs and crashes, through its functions (no daemon): a
real bare remote, real part commits pushed with the real git, a real WAL. Anyone who can push
may write any ref under refs/snapops/parts/, with or without the run's HMAC key."""

from __future__ import annotations

import pytest

from snapops.config.schema import RemoteConfig
from snapops.daemon.lifecycle import DROPPED, REQ, SPOOLED
from snapops.daemon.nodes import (
    DELETE_BATCH, NodeGit, PartExchange, build_part, list_parts, part_ref, read_part,
)
from snapops.daemon.ranks import Cluster
from snapops.daemon.wal import Wal, WalReader, WalState
from snapops.formats.errors import FormatError

from .gitserve import git, init_bare
from .test_nodes_parts import HEADER, KEY, SPEC, part_commit

REF = part_ref("t", HEADER.gen, HEADER.node)   # node-b brings ranks 2 and 3 of gen 4


class Committer:
    """Node a (ranks 0 and 1 of 4) with its WAL and state, and the remote parts travel by."""

    def __init__(self, tmp_path, key: bytes | None = KEY) -> None:
        self.bare = init_bare(tmp_path / "remote.git")
        repo = tmp_path / "a"
        git("init", "-q", "-b", "main", str(repo))
        self.cluster = Cluster(4, frozenset({0, 1}), 60.0, "a", True,
                               RemoteConfig("origin", str(self.bare)))
        self.state = WalState(**self.cluster.wal_scope())
        self.wal = Wal(tmp_path / "wal", writer="daemon")
        self.reader = WalReader(tmp_path / "wal")
        self.exchange = PartExchange(NodeGit(repo, 30), self.cluster, "t", "wtxt", key)
        self.now = 0.0

    def record(self, event: str, gen: int, **fields) -> None:
        self.wal.append(event, gen, **fields)
        for record in self.reader.read_new():
            self.state.apply(record)

    def poll(self) -> None:
        self.now += self.exchange.interval
        self.exchange.poll(self.state, self.record, self.now)

    def ranks_in(self, gen: int = HEADER.gen) -> dict[str, tuple[str, str | None]]:
        parts = self.state.gens[gen].parts if gen in self.state.gens else {}
        return {rank: (p.state, p.fields.get("commit")) for rank, p in parts.items()}


def push(repo, bare, commit: str, ref: str = REF) -> None:
    git("push", "-q", "--force", str(bare), f"{commit}:{ref}", cwd=repo)


def test_a_forged_part_pushed_first_does_not_shut_out_the_real_one(tmp_path):
    """A forger without the key pushes node-b's ref before node-b does; node-b's force-push
    then replaces it. The committer refused the forged commit: it must look at the new one
    (it refused the ref for good, and the generation was dropped missing ranks 2 and 3)."""
    a = Committer(tmp_path)
    gitn, pieces, real = part_commit(tmp_path)
    forged = build_part(gitn, tmp_path / "forged", SPEC, HEADER, pieces, None)
    push(gitn.repo, a.bare, forged)
    a.poll()
    assert a.ranks_in() == {} and "[hmac]" in a.exchange.refused[(4, "node-b")]
    push(gitn.repo, a.bare, real)
    a.poll()
    assert a.ranks_in() == {"2": (SPOOLED, real), "3": (SPOOLED, real)}
    assert a.exchange.refused == {}


def test_a_committer_restarted_between_the_ranks_of_a_part_records_the_rest(tmp_path):
    """SIGKILL after the first rank's records of a two-rank part: the restarted committer
    must record rank 3 too (it took the part as taken, rank 3 never came, the generation
    was dropped after rank_timeout)."""
    a = Committer(tmp_path)
    gitn, _, real = part_commit(tmp_path)
    push(gitn.repo, a.bare, real)
    a.record(REQ, 4, world=4, part=2, node="node-b")
    a.record(SPOOLED, 4, part=2, node="node-b", commit=real)
    a.poll()
    assert a.ranks_in() == {"2": (SPOOLED, real), "3": (SPOOLED, real)}
    lines = (tmp_path / "wal").read_text().splitlines()
    assert len(lines) == 4 and lines.count(lines[-1]) == 1   # nothing recorded twice
    a.poll()   # taken: neither fetched nor recorded again
    assert (tmp_path / "wal").read_text().splitlines() == lines


def test_another_commit_of_a_node_that_delivered_is_refused(tmp_path):
    """After a restart node-b's ref holds another commit (re-armored, or forged by a key
    holder) than the one its rank 2 was recorded with: both must never be placed."""
    a = Committer(tmp_path)
    gitn, _, real = part_commit(tmp_path)
    other = git("commit-tree", "-m", "other", f"{real}^{{tree}}", cwd=gitn.repo)
    push(gitn.repo, a.bare, other)
    a.record(REQ, 4, world=4, part=2, node="node-b")
    a.record(SPOOLED, 4, part=2, node="node-b", commit=real)
    a.poll()
    assert a.ranks_in() == {"2": (SPOOLED, real)}
    assert "another node or part commit" in a.exchange.refused[(4, "node-b")]


def test_a_committer_without_the_hmac_key_refuses_every_part(tmp_path):
    """Nothing can authenticate a part then: fail closed, saying why (it took them in
    unchecked, and sealed and signed whatever anyone pushed)."""
    a = Committer(tmp_path, key=None)
    gitn, _, real = part_commit(tmp_path)
    push(gitn.repo, a.bare, real)
    a.poll()
    assert a.ranks_in() == {}
    assert "no HMAC key" in a.exchange.refused[(4, "node-b")]


def mktree(gitn: NodeGit, entries: list[tuple[str, str, str]]) -> str:
    text = "".join(f"{mode} {kind} {oid}\t{name}\n" for mode, kind, oid, name in entries)
    return gitn.text("mktree", input=text.encode())


def test_a_tree_bomb_behind_a_replayed_part_is_refused_at_once(tmp_path):
    """The real PART (a replay: it needs no key) beside a folder of 64 folders of 64 ...
    (64**8 paths, a few hundred bytes to push): ls-tree -r never ends (here: git stalls, a
    GitError, so the part was fetched again at every poll; full blobs instead of empty trees
    grow the committer's memory without end)."""
    gitn, _, real = part_commit(tmp_path)
    gitn.stall = 5
    level = gitn.text("hash-object", "-w", "-t", "tree", "/dev/null")
    for _ in range(8):
        level = mktree(gitn, [("040000", "tree", level, f"d{i:02d}") for i in range(64)])
    part_blob = gitn.text("rev-parse", f"{real}:PART")
    root = mktree(gitn, [("100644", "blob", part_blob, "PART"), ("040000", "tree", level, "x")])
    bomb = gitn.text("commit-tree", root, input=b"bomb\n")
    refused = (r"part commit [0-9a-f]{12}: \[fileset\] the part.s files are not what its PART "
               r"lists; expected at most \d+ paths, got more")
    with pytest.raises(FormatError, match=refused):
        read_part(gitn, bomb, KEY)


@pytest.mark.parametrize("shape", ["with a parent", "a tree", "an annotated tag"])
def test_a_part_ref_at_anything_but_a_parentless_commit_is_refused(tmp_path, shape):
    """A commit with history would bring all of it; a tree or tag is not what the committer
    records (each was read as a part)."""
    gitn, _, real = part_commit(tmp_path)
    tree = gitn.text("rev-parse", f"{real}^{{tree}}")
    if shape == "with a parent":
        oid = gitn.text("commit-tree", tree, "-p", real, input=b"child\n")
    elif shape == "a tree":
        oid = tree
    else:
        gitn.run("tag", "-a", "-m", "t", "v", real)
        oid = gitn.text("rev-parse", "v")
    with pytest.raises(FormatError, match=r"\[fileset\].*not a part commit.*without parents"):
        read_part(gitn, oid, KEY)
    assert read_part(gitn, real, KEY).header == HEADER


def test_a_part_ref_moved_between_listing_and_fetch_keeps_the_recorded_commit(tmp_path):
    """The recorded commit must stay under the local part ref until the generation is done
    (maintenance prunes unreachable objects; the fetch left the ref at the newer one)."""
    a = Committer(tmp_path)
    gitn, _, real = part_commit(tmp_path)
    push(gitn.repo, a.bare, real)
    listed = list_parts(a.exchange.git, str(a.bare), "t")
    a.exchange.git.run("fetch", str(a.bare), f"{real}")   # already here from an earlier poll
    moved = git("commit-tree", "-m", "moved", f"{real}^{{tree}}", cwd=gitn.repo)
    push(gitn.repo, a.bare, moved)
    a.exchange._take(a.state, listed[0], a.record)
    assert a.ranks_in() == {"2": (SPOOLED, real), "3": (SPOOLED, real)}
    assert a.exchange.git.text("rev-parse", REF) == real


def test_thousands_of_stale_part_refs_are_swept_a_batch_per_poll_finished_ones_first(tmp_path):
    """Anyone who can push can make thousands of refs of an old generation. Deleting them
    all in one push took git minutes (each refspec is matched against every remote ref) and
    over a megabyte of arguments: it stalled or failed with E2BIG at every poll, blocking the
    daemon each time, and no ref, not even those of finished generations, was deleted."""
    a = Committer(tmp_path)
    gitn, _, real = part_commit(tmp_path)
    push(gitn.repo, a.bare, real, part_ref("t", 5, "node-b"))
    with open(a.bare / "packed-refs", "a") as packed:
        packed.writelines(f"{real} {part_ref('t', 1, f'{i:04d}' + 'x' * 60)}\n"
                          for i in range(DELETE_BATCH + 40))
    a.record(REQ, 5, world=4, part=0)
    a.record(DROPPED, 5, reason="missing_ranks", error="x")

    def left() -> list[str]:
        return git("ls-remote", str(a.bare), "refs/snapops/*").splitlines()

    a.poll()
    assert len(left()) == 41 and part_ref("t", 5, "node-b") not in "".join(left())
    a.poll()
    assert left() == []
