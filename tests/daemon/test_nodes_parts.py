"""The part-manifest (PART) and part commits: canonical round trip, HMAC seal, every hostile
field refused with a typed error, part trees read with the real git, and a committer that
refuses a forged part (the generation is then dropped naming the ranks and the refusal)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapops.daemon.client import Snapshotter
from snapops.daemon.lifecycle import DROPPED
from snapops.daemon.nodes import NodeGit, build_part, list_parts, part_ref, read_part
from snapops.daemon.parts import MAGIC, PartFile, PartHeader, parse_part, render_part
from snapops.formats.errors import FormatError
from snapops.formats.generation.load import rank_shards
from snapops.formats.generation.write import GenerationSpec, write_part

from .gitserve import git, init_bare
from .rank_worker import expected
from .ranks_env import RankedEnv

KEY = b"k" * 32
TS = "2026-01-02T03:04:05Z"
SPEC = GenerationSpec(run="t", format="wtxt", shard_max=256, build="b")


def make_part(tmp_path, ranks=(2, 3), gen: int = 4) -> PartFile:
    pieces = {r: rank_shards(expected(gen), r, 4) for r in ranks}
    written = write_part(tmp_path / "part", SPEC, gen, TS, pieces, None)
    return PartFile(PartHeader("t", gen, "node-b", 4, tuple(ranks), TS, "wtxt"), written)


def reseal(body: bytes) -> bytes:
    return body + b"seal hmac=" + hmac.new(KEY, body, hashlib.sha256).hexdigest().encode() + b"\n"


def body_of(data: bytes) -> bytes:
    return data[:data.rindex(b"seal ")]


def test_round_trip_is_canonical_and_sealed(tmp_path):
    part = make_part(tmp_path)
    data = render_part(part, KEY)
    again = parse_part(data, "PART", KEY)
    assert again.header == part.header and render_part(again, KEY) == data
    assert [p.partial for p in again.written.pieces] == [p.partial for p in part.written.pieces]
    assert sorted(again.written.paths) == sorted(again.paths())
    assert parse_part(render_part(part, None), "PART", None).header == part.header
    with pytest.raises(FormatError, match=r"\[hmac\].*not sealed under this run's HMAC key"):
        parse_part(render_part(part, None), "PART", KEY)
    with pytest.raises(FormatError, match=r"\[hmac\]"):
        parse_part(render_part(part, b"x" * 32), "PART", KEY)


@pytest.mark.parametrize("old, new, message", [
    (b"ranks=2+3", b"ranks=3+2", "distinct ranks in ascending order"),
    (b"ranks=2+3", b"ranks=2+7", "below the world size 4"),
    (b"shard path=shards/r0002/", b"shard path=shards/r0001/", "under the folder of one of"),
    (b"shard path=shards/r0002/0000.wtxt", b"shard path=../MANIFEST", "unsafe path"),
    (b"shard path=shards/r0002/0000.wtxt", b"shard path=shards/r0002/" + b"x" * 256,
     "at most 255 characters"),                      # the committer could not write it
    (b"box shard=shards/r0002/0000.wtxt", b"box shard=shards/r0003/0000.wtxt",
     "a box in a listed shard of its own rank"),
    (b"piece name=emb.weight rank=2", b"piece name=emb.weight rank=1", "each array once per"),
    (b"part run=t", b"part run=..", "a run name usable"),
    (b" total=", b" total=0", "partial statistics as Python writes floats"),
    (b" total=", b" total=nan x", "a piece line"),
    (b" squares=", b" squares=-", "statistics some values can have"),   # sqrt of it: crash
    (b" min=-2.266982078552246", b" min=4.0", "statistics some values can have"),
    (b" count=256", b" count=0", "statistics some values can have"),
    (b" shape=64,16", b" shape=64,", "canonical dimensions"),           # int(''): crash
    (b" shape=64,16", b" shape=,16", "canonical dimensions"),
    (b" boxes=1\n", b" boxes=2\n", "a box line"),
    (b"format=wtxt store=git", b"format=wtxt store=git extra=1", "part run= gen="),
    (b"object=- object_size=-", b"object=" + b"a" * 64 + b" object_size=1",
     "with store=git none"),
    (b"format=wtxt store=git", b"format=wtxt store=lfs", "a keyframe"),
])
def test_hostile_parts_are_refused(tmp_path, old, new, message):
    body = body_of(render_part(make_part(tmp_path), KEY))
    assert old in body
    with pytest.raises(FormatError, match=message):
        parse_part(reseal(body.replace(old, new, 1)), "PART", KEY)


@given(st.binary(max_size=300), st.integers(0, 2000))
def test_any_bytes_give_only_typed_errors(junk, at):
    base = reseal(MAGIC.encode() + b"\npart run=t gen=000004 node=b world=4 ranks=2 "
                  b"ts=2026-01-02T03:04:05Z format=wtxt store=git\nend\n")
    data = base[:at] + junk + base[at:]
    try:
        parse_part(data, "PART", None)
    except FormatError:
        pass


HEADER = PartHeader("t", 4, "node-b", 4, (2, 3), TS, "wtxt")


def part_commit(tmp_path) -> tuple[NodeGit, dict, str]:
    """A repository ``tmp_path/repo`` holding the part commit of HEADER (built from
    ``tmp_path/scratch``): its git, the pieces and the commit."""
    repo = tmp_path / "repo"
    git("init", "-q", "-b", "main", str(repo))
    git("config", "user.name", "t", cwd=repo)
    git("config", "user.email", "t@t", cwd=repo)
    gitn = NodeGit(repo, 30)
    pieces = {r: rank_shards(expected(4), r, 4) for r in (2, 3)}
    return gitn, pieces, build_part(gitn, tmp_path / "scratch", SPEC, HEADER, pieces, KEY)


def test_part_commits_are_read_back_exactly_and_refused_when_their_tree_differs(tmp_path):
    gitn, pieces, commit = part_commit(tmp_path)
    repo, header = gitn.repo, HEADER
    assert build_part(gitn, tmp_path / "again", SPEC, header, pieces, KEY) == commit  # same part
    part = read_part(gitn, commit, KEY)
    assert part.header == header and git("cat-file", "-t", commit, cwd=repo) == "commit"
    (tmp_path / "scratch" / "shards" / "r0002" / "extra").write_bytes(b"x")
    forged = build_forged(gitn, tmp_path / "scratch", commit)
    with pytest.raises(FormatError, match=r"\[fileset\].*not what its PART lists"):
        read_part(gitn, forged, KEY)


def test_only_canonical_part_refs_are_parts(tmp_path):
    """Anyone who can push may name a ref ``refs/snapops/parts/...``: digits that are not
    ASCII (``int`` reads Arabic-Indic ones, and raised ValueError on a superscript two: the
    committer's poll died), 5,000 digits, a non-canonical gen, a node no daemon could have."""
    gitn, _, commit = part_commit(tmp_path)
    repo = gitn.repo
    bare = init_bare(tmp_path / "remote.git")
    git("push", "-q", str(bare), f"{commit}:{part_ref('t', 4, 'node-b')}", cwd=repo)
    hostile = ["\u00b2" * 6 + "/evil", "\u0660" * 5 + "\u0661/evil", "0000004/evil", "4/evil",
               "000004/-evil", "000004/evil/deeper", "1" * 19 + "/evil"]
    for tail in hostile:
        git("update-ref", f"refs/snapops/parts/t/{tail}", commit, cwd=bare)
    with open(bare / "packed-refs", "a") as packed:   # too long for a file name
        packed.write(f"{commit} refs/snapops/parts/t/{'9' * 5000}/evil\n")
    assert len(git("ls-remote", str(bare), "refs/snapops/*").splitlines()) == len(hostile) + 2
    found = list_parts(gitn, str(bare), "t")
    assert [(p.gen, p.node, p.ref) for p in found] == [(4, "node-b", part_ref("t", 4, "node-b"))]


def build_forged(gitn: NodeGit, scratch, base: str) -> str:
    """A commit of ``scratch`` as it is now (with whatever was added), PART unchanged."""
    env = {"GIT_INDEX_FILE": str(scratch.parent / "forged.index"), "GIT_WORK_TREE": str(scratch),
           "GIT_DIR": str(gitn.repo / ".git")}
    gitn.run("read-tree", "--empty", env=env)
    gitn.run("add", "-A", "-f", ".", env=env, cwd=scratch)
    tree = gitn.text("write-tree", env=env)
    return gitn.text("commit-tree", tree, input=b"forged\n")


def test_a_committer_refuses_a_forged_part_and_drops_the_generation_naming_why(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = RankedEnv(tmp_path, {"origin": str(bare)}, world=2, timeout=3,
                    cluster='ranks = "0"\nnode = "a"\ncommitter = "a"\n')
    forger = tmp_path / "forger"
    git("clone", "-q", str(bare), str(forger))
    git("config", "user.name", "t", cwd=forger)
    git("config", "user.email", "t@t", cwd=forger)
    header = PartHeader("t", 1, "evil", 2, (0, 1), TS, "wtxt")   # claims the committer's rank
    pieces = {r: rank_shards(expected(1), r, 2) for r in (0, 1)}
    spec = dataclasses.replace(SPEC, shard_max=64 << 10)
    commit = build_part(NodeGit(forger, 30), tmp_path / "scratch", spec, header, pieces,
                        None)   # the forger has no HMAC key
    ref = part_ref("t", 1, "evil")
    git("push", "-q", str(bare), f"{commit}:{ref}", cwd=forger)
    env.start()
    with Snapshotter(env.spool, rank=0, world_size=2) as snap:
        snap.request(rank_shards(expected(1), 0, 2), 1)
    env.wait(lambda: 1 in env.state().gens and env.state().gens[1].state == DROPPED,
             what="gen 1 dropped")
    fields = env.state().gens[1].fields
    assert fields["reason"] == "missing_ranks" and fields["missing"] == "1"
    assert "node_evil" in fields["error"] and "hmac" in fields["error"]
    env.wait(lambda: git("ls-remote", str(bare), "refs/snapops/*") == "", what="ref swept")
    assert env.terminate() == 0
