"""Two nodes with ``store = "lfs"``: the contributor uploads its rank's shards to a real giftless
as keyframes and publishes pointer files in its part; the committer places them (checked byte
for byte against the PART), stores its own rank's shards, and pushes one generation whose every
shard is in the LFS store. Every generation restores bit-exact from the server."""

from __future__ import annotations

import shutil

import numpy as np

import snapops
from snapops.formats.generation import parse_manifest

from ..daemon.gitserve import git, init_bare
from ..daemon.rank_worker import expected
from ..daemon.ranks_env import RankedEnv
from ..daemon.test_nodes import NODES, finished, part_refs
from snapops.daemon.client import Snapshotter
from snapops.daemon.lifecycle import PUSHED
from snapops.formats.generation.load import rank_shards
from snapops.formats.generation.write import rank_prefix


def lfs_nodes(tmp_path, bare, giftless) -> dict[str, RankedEnv]:
    envs = {}
    for node, ranks in NODES.items():
        root = tmp_path / node
        root.mkdir()
        if envs:  # every node seals with the run's keys
            shutil.copytree(envs["a"].keys, root / "keys")
        token = giftless.token_file(root, "write")
        envs[node] = RankedEnv(
            root, {"origin": str(bare)}, world=2, timeout=20, fmt="aero", shard_max="2KiB",
            repo_extra=f'store = "lfs"\nlfs_url = "{giftless.url}"\n'
                       f'lfs_token_file = "{token}"\nkeyframe_every = 4\n',
            cluster=f'ranks = "{ranks}"\nnode = "{node}"\ncommitter = "a"\n')
    return envs


def test_two_lfs_nodes_make_generations_whose_shards_are_all_in_the_lfs_store(tmp_path,
                                                                              giftless):
    bare = init_bare(tmp_path / "remote.git")
    envs = lfs_nodes(tmp_path, bare, giftless)
    for env in envs.values():
        env.start()
    snaps = {node: Snapshotter(envs[node].spool, rank=int(r), world_size=2, policy="block")
             for node, r in NODES.items()}
    try:
        for gen in (1, 2, 3):
            for node, rank in NODES.items():
                snaps[node].request(rank_shards(expected(gen), int(rank), 2), gen)
        envs["a"].wait(lambda: finished(envs["a"], 3), what="gen 3 on the committer")
    finally:
        for snap in snaps.values():
            snap.close()
    envs["a"].wait(lambda: not part_refs(bare), what="part refs swept")
    state_b = envs["b"].state()
    assert all(state_b.gens[g].state == PUSHED for g in (1, 2, 3))
    for env in envs.values():
        assert env.terminate() == 0
    stored = giftless.objects()
    read = giftless.token_file(tmp_path, "read")
    keys = envs["a"].keys
    for gen in (1, 2, 3):
        text = git("show", f"t/gen-{gen:06d}:snapshots/t/MANIFEST", cwd=bare)
        manifest = parse_manifest(text.encode() + b"\n")
        assert manifest.header.store == "lfs" and manifest.header.world == 2
        assert {rank for rank in (0, 1) for s in manifest.shards
                if s.path.startswith(rank_prefix(rank))} == {0, 1}
        for shard in manifest.shards:
            assert shard.object in stored          # uploaded before anything was committed
            pointer = git("show", f"t/gen-{gen:06d}:snapshots/t/{shard.path}", cwd=bare)
            assert f"oid sha256:{shard.object}\nsize {shard.object_size}" in pointer
            if shard.path.startswith(rank_prefix(1)):  # the contributor's: keyframes
                assert shard.encoding == "key" and shard.object == shard.sha256
        snap = snapops.load_generation(bare, "t", gen=gen, lfs_url=giftless.url,
                                       lfs_token_file=read, hmac_key=keys / "hmac.key",
                                       trusted_keys=[keys / "signing.pub"],
                                       require_signature=True)
        for name, array in expected(gen).items():
            assert snap[name].dtype == array.dtype
            assert snap[name].tobytes() == array.tobytes(), (gen, name)
    # the contributor keeps no LFS objects: it never needs a base
    assert not [p for p in (tmp_path / "b" / "state" / "lfs").iterdir() if len(p.name) == 64]
