"""Multi-rank training end to end: real ``torch.distributed`` (gloo, CPU) rank processes, each with
its own Snapshotter on one spool, a real daemon process and a real bare remote."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from snapops.daemon.lifecycle import DROPPED
from snapops.formats.generation.load import load_from_source, rank_view
from snapops.formats.generation.source import FolderSource
from snapops.formats.generation.verify import GenerationOptions, verify_generation

from .gitserve import git, init_bare
from .rank_worker import expected
from .ranks_env import RankedEnv, World


def check_remote(env: RankedEnv, url: str, tmp_path, gens: dict[int, int]) -> None:
    """Every tag of ``url`` verifies and restores bit-exact, whole and sliced for 1, 2 and 4
    ranks; ``gens``: {gen: world size it was written at}."""
    clone = tmp_path / "check"
    git("clone", "-q", url, str(clone))
    assert env.remote_tags(url) == [f"t/gen-{g:06d}" for g in sorted(gens)]
    options = GenerationOptions(hmac_key=env.keys / "hmac.key",
                                trusted_keys=[env.keys / "signing.pub"], require_signature=True)
    for gen, world in gens.items():
        git("checkout", "-q", f"t/gen-{gen:06d}", cwd=clone)
        report = verify_generation(FolderSource(clone), "t", options)
        assert report.ok, (gen, report.failure)
        snap = load_from_source(FolderSource(clone), "t", verify=False)
        manifest = (clone / "snapshots/t/MANIFEST").read_text()
        assert f" world={world} " in manifest
        want = expected(gen)
        for name, array in want.items():
            assert snap[name].dtype == array.dtype and snap[name].tobytes() == array.tobytes()
        for size in (1, 2, 4):
            for rank in range(size):
                mine, theirs = rank_view(snap.arrays, rank, size), rank_view(want, rank, size)
                assert all(np.array_equal(mine[n], theirs[n]) for n in want)
    shutil.rmtree(clone)


@pytest.mark.slow
def test_four_ranks_five_generations_then_resumed_on_two_and_one(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = RankedEnv(tmp_path, {"origin": str(bare)}, world=4)
    env.start()
    world = World(tmp_path, env.spool, 4, name="w4")
    try:
        for gen in range(1, 6):
            world.do(f"step {gen}")
            world.do(f"req {gen}", ranks=reversed(range(4)))  # parts arrive in any order
    finally:
        world.close()
    env.wait(lambda: env.all_pushed() and len(env.state().gens) == 5, what="5 gens pushed")
    assert env.terminate() == 0
    check_remote(env, str(bare), tmp_path, {g: 4 for g in range(1, 6)})
    # resume the run at world size 2, then 1: load gen 5, check each rank's rows, go on
    clone = tmp_path / "resume"
    git("clone", "-q", str(bare), str(clone))
    for size, gen in ((2, 6), (1, 7)):
        env = RankedEnv(tmp_path, {"origin": str(bare)}, world=size, spool=f"spool-{size}")
        env.start()
        world = World(tmp_path, env.spool, size, name=f"w{size}", clone=clone)
        try:
            world.do(f"check {gen - 1}")
            world.do(f"step {gen}")
            world.do(f"req {gen}")
        finally:
            world.close()
        env.wait(lambda: env.all_pushed() and gen in env.state().gens, what=f"gen {gen}")
        assert env.terminate() == 0
        git("pull", "-q", cwd=clone)
    check_remote(env, str(bare), tmp_path, {**{g: 4 for g in range(1, 6)}, 6: 2, 7: 1})


@pytest.mark.slow
def test_a_killed_rank_drops_its_generation_naming_it_and_the_restarted_world_commits(
        tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = RankedEnv(tmp_path, {"origin": str(bare)}, world=3, timeout=3)
    env.start()
    world = World(tmp_path, env.spool, 3, name="first")
    try:
        world.do("step 1")
        world.do("req 1")
        world.do("step 2")
        world.kill(1)                         # mid-generation: rank 1 never requests gen 2
        world.do("req 2")                     # ranks 0 and 2 do
        env.wait(lambda: env.state().gens[2].state == DROPPED, what="gen 2 dropped")
    finally:
        world.close()
    dropped = env.state().gens[2].fields
    assert (dropped["reason"], dropped["missing"]) == ("missing_ranks", "1")
    assert "ranks_1_of_world_size_3_did_not_deliver_within_3s" in dropped["error"]
    world = World(tmp_path, env.spool, 3, name="restarted")   # as torchrun restarts the job
    try:
        for gen in (3, 4):
            world.do(f"step {gen}")
            world.do(f"req {gen}")
    finally:
        world.close()
    env.wait(lambda: env.all_pushed() and 4 in env.state().gens, what="gens 3 and 4")
    status = env.status()
    assert status["dropped_details"][0]["missing"] == "1"
    assert env.terminate() == 0
    check_remote(env, str(bare), tmp_path, {1: 3, 3: 3, 4: 3})
