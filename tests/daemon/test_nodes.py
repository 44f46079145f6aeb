"""Two daemons ("nodes") with their own spools and working clones make one generation through one
bare remote: node a commits (rank 0), node b contributes its part (rank 1) through
refs/snapops/parts/. Daemons are real processes, killed with SIGKILL at random points."""

from __future__ import annotations

import random
import shutil
import time

import numpy as np
import pytest

from snapops.daemon.client import Snapshotter
from snapops.daemon.lifecycle import COMMITTED, DROP_REASONS, DROPPED, PUSHED
from snapops.formats.ledger import Ledger
from snapops.formats.generation import parse_manifest
from snapops.formats.generation.load import load_from_source, rank_shards
from snapops.formats.generation.source import FolderSource
from snapops.formats.generation.verify import GenerationOptions, verify_generation

from .gitserve import git, init_bare
from .rank_worker import expected
from .ranks_env import RankedEnv

NODES = {"a": "0", "b": "1"}


def two_nodes(tmp_path, bare, timeout: float = 20, **options) -> dict[str, RankedEnv]:
    """Node a commits rank 0, node b contributes rank 1; ``options`` go to every daemon's
    environment (format, shard size, [repo] lines)."""
    envs = {}
    for node, ranks in NODES.items():
        root = tmp_path / node
        root.mkdir()
        if envs:  # every node seals with the run's keys
            shutil.copytree(envs["a"].keys, root / "keys")
        envs[node] = RankedEnv(root, {"origin": str(bare)}, world=2, timeout=timeout,
                               cluster=f'ranks = "{ranks}"\nnode = "{node}"\ncommitter = "a"\n',
                               **options)
    return envs


def finished(env: RankedEnv, gen: int) -> bool:
    record = env.state().gens.get(gen)
    return record is not None and (record.state == DROPPED or record.fully_pushed({"origin"}))


def part_refs(bare) -> list[str]:
    out = git("ls-remote", str(bare), "refs/snapops/parts/*")
    return [line.split("\t")[1] for line in out.splitlines()]


def check_remote(env: RankedEnv, bare, tmp_path, committed: list[int]) -> None:
    """Exactly the committed generations, each once, whole (both ranks), verifying, exact."""
    clone = tmp_path / "check"
    git("clone", "-q", str(bare), str(clone))
    assert env.remote_tags(str(bare)) == [f"t/gen-{g:06d}" for g in committed]
    ledger = Ledger(clone / "ledger" / "t.ledger", root=clone)
    assert [e.gen for e in ledger.entries()] == committed
    subjects = git("log", "--format=%s", "main", cwd=clone).splitlines()
    assert subjects == [f"snapops: t gen {g} " + s.split(" ", 4)[4] for g, s in
                        zip(reversed(committed), subjects)]   # one commit per generation
    options = GenerationOptions(hmac_key=env.keys / "hmac.key",
                                trusted_keys=[env.keys / "signing.pub"], require_signature=True)
    for gen in committed:
        git("checkout", "-q", f"t/gen-{gen:06d}", cwd=clone)
        assert verify_generation(FolderSource(clone), "t", options).ok
        manifest = parse_manifest((clone / "snapshots/t/MANIFEST").read_bytes())
        assert manifest.header.world == 2
        assert {p.rank for a in manifest.arrays for p in a.parts} == {0, 1}
        snap = load_from_source(FolderSource(clone), "t", verify=False)
        assert all(np.array_equal(snap[n], a) and snap[n].dtype == a.dtype
                   for n, a in expected(gen).items())
    shutil.rmtree(clone)


def three_generations(envs: dict[str, RankedEnv], bare) -> None:
    """Start both nodes, request gens 1-3 from both ranks (in alternating order), wait until
    the committer has landed gen 3 and every part ref is swept."""
    for env in envs.values():
        env.start()
    snaps = {node: Snapshotter(envs[node].spool, rank=int(r), world_size=2, policy="block")
             for node, r in NODES.items()}
    try:
        for gen in (1, 2, 3):
            for node, rank in sorted(NODES.items(), key=lambda kv: -gen * int(kv[1])):
                snaps[node].request(rank_shards(expected(gen), int(rank), 2), gen)
        envs["a"].wait(lambda: finished(envs["a"], 3), what="gen 3 on the committer")
    finally:
        for snap in snaps.values():
            snap.close()
    envs["a"].wait(lambda: not part_refs(bare), what="part refs swept")


def test_two_nodes_make_each_generation_once_through_the_remote(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    envs = two_nodes(tmp_path, bare)
    three_generations(envs, bare)
    state_b = envs["b"].state()
    assert all(state_b.gens[g].state == PUSHED and state_b.gens[g].fields["ref"] ==
               f"refs/snapops/parts/t/{g:06d}/b" for g in (1, 2, 3))
    status = envs["a"].status()
    assert status["last_committed"] == 3 and status["dropped"] == []
    for env in envs.values():
        assert env.terminate() == 0
    check_remote(envs["a"], bare, tmp_path, [1, 2, 3])
    assert git("for-each-ref", "refs/snapops", cwd=envs["b"].repo) == ""   # b keeps nothing


@pytest.mark.slow
def test_a_node_killed_at_random_points_never_leaves_a_partial_generation(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    envs = two_nodes(tmp_path, bare, timeout=4)
    for env in envs.values():
        env.start()
        env.wait_ready()
    rng = random.Random(17)
    snaps = {node: Snapshotter(envs[node].spool, rank=int(r), world_size=2, policy="block")
             for node, r in NODES.items()}

    def request(gen: int) -> None:
        for node, rank in NODES.items():
            snaps[node].request(rank_shards(expected(gen), int(rank), 2), gen)

    try:
        for gen in range(1, 7):
            victim = "ab"[gen % 2]
            request(gen)
            time.sleep(rng.uniform(0.0, 0.8))   # in spooling, writing, pushing, fetching...
            envs[victim].kill()
            time.sleep(rng.uniform(0.0, 0.3))
            envs[victim].start()
            envs[victim].wait_ready()
            envs["a"].wait(lambda: finished(envs["a"], gen), what=f"gen {gen} settled")
        envs["b"].kill()                        # node b dies for longer than rank_timeout
        request(7)
        envs["a"].wait(lambda: finished(envs["a"], 7), what="gen 7 dropped")
        envs["b"].start()                       # comes back, pushes its stale part of gen 7
        request(8)
        envs["a"].wait(lambda: finished(envs["a"], 8), what="gen 8 settled")
    finally:
        for snap in snaps.values():
            snap.close()
    state = envs["a"].state()
    assert state.gens[7].state == DROPPED and state.gens[7].fields["missing"] == "1"
    committed = [g for g in range(1, 9) if state.gens[g].state in (COMMITTED, PUSHED)]
    for gen in set(range(1, 9)) - set(committed):   # dropped: with a reason, never pushed
        fields = state.gens[gen].fields
        assert fields["reason"] in DROP_REASONS and fields.get("error"), fields
    assert 8 in committed, "the node that came back does not contribute"
    envs["a"].wait(lambda: not part_refs(bare), what="part refs swept")
    for env in envs.values():
        assert env.terminate() == 0
    check_remote(envs["a"], bare, tmp_path, committed)
