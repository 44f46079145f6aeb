"""Two nodes with ``store = "lfs"``: the contributor uploads its rank's shards to a real giftless
as keyframes and publishes pointer files in its part; the committer places them (checked byte
for byte against the PART), stores its own rank's shards, and pushes one generation whose every
shard is in the LFS store. Every generation restores bit-exact from the server."""

from __future__ import annotations

import snapops
from snapops.daemon.lifecycle import PUSHED
from snapops.formats.generation import parse_manifest
from snapops.formats.generation.write import rank_prefix

from ..daemon.gitserve import git, init_bare
from ..daemon.rank_worker import expected
from ..daemon.test_nodes import three_generations, two_nodes


def test_two_lfs_nodes_make_generations_whose_shards_are_all_in_the_lfs_store(tmp_path,
                                                                              giftless):
    bare = init_bare(tmp_path / "remote.git")
    token = giftless.token_file(tmp_path, "write")
    envs = two_nodes(tmp_path, bare, fmt="aero", shard_max="2KiB",
                     repo_extra=f'store = "lfs"\nlfs_url = "{giftless.url}"\n'
                                f'lfs_token_file = "{token}"\nkeyframe_every = 4\n')
    three_generations(envs, bare)
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
