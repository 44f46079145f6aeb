"""A daemon SIGKILLed at seeded random points while it uploads to the LFS store recovers:
no committed pointer lacks its object on the server (upload before commit), and no object is
stored twice (the batch API reports what the server has; it is skipped)."""

from __future__ import annotations

import random
import re
import time

import numpy as np
from snapops.formats.generation.manifest import parse_manifest
from snapops.formats.lfs.pointer import parse_pointer

from ..daemon.daemon_env import DaemonEnv
from ..daemon.gitserve import git, git_bytes, init_bare

GENS = 4
_PUT = re.compile(r'"PUT /\S+/objects/storage/([0-9a-f]{64}) HTTP/1\.1" 200')


def dense(gen: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(gen)
    w = np.random.default_rng(0).standard_normal((4, 128, 128)).astype(np.float32)
    return {"w": w * (1 + np.float32(1e-3) * gen * rng.standard_normal(w.shape)
                      .astype(np.float32))}


def test_killed_during_uploads_recovers_without_orphans_or_double_uploads(tmp_path, giftless):
    bare = init_bare(tmp_path / "remote.git")
    token = giftless.token_file(tmp_path, "write")
    env = DaemonEnv(tmp_path, {"origin": str(bare)}, fmt="aero", shard_max="16KiB",
                    repo_extra=f'store = "lfs"\nlfs_url = "{giftless.url}"\n'
                               f'lfs_token_file = "{token}"\nkeyframe_every = 3\n')
    chance = random.Random(15)
    log = tmp_path / "giftless.log"
    with env.client(policy="block") as client:   # the WAL and the spool: no daemon needed
        for gen in range(1, GENS + 1):
            client.request(dense(gen), gen)
    kills = 0

    def puts() -> int:
        return len(_PUT.findall(log.read_text()))

    try:
        for _ in range(3):
            # killed after a seeded number of new uploads: inside some generation's uploads,
            # however fast this machine pushes (GENS x 16 shards: more uploads than 3 kills take)
            due = puts() + chance.randint(1, 12)
            env.start()
            env.wait(lambda due=due: puts() >= due or env.all_pushed(), timeout=60,
                     what="uploads")
            if env.all_pushed():
                break
            env.kill()
            kills += 1
        if env.proc.poll() is not None:     # else it pushed everything before the next kill
            env.start()
        env.wait(env.all_pushed, timeout=180, what="every generation pushed after the kills")
        assert env.terminate() == 0
    finally:
        env.kill()
    assert kills >= 2
    stored = giftless.objects()
    puts: dict[str, int] = {}
    for oid in _PUT.findall((tmp_path / "giftless.log").read_text()):
        puts[oid] = puts.get(oid, 0) + 1
    assert puts and max(puts.values()) == 1, {o: n for o, n in puts.items() if n > 1}
    for gen in range(1, GENS + 1):
        tag = f"t/gen-{gen:06d}"
        manifest = parse_manifest(git_bytes("show", f"{tag}:snapshots/t/MANIFEST", cwd=bare))
        for shard in manifest.shards:
            pointer = parse_pointer(git_bytes("show", f"{tag}:snapshots/t/{shard.path}",
                                              cwd=bare))
            assert pointer.oid in stored, f"gen {gen}: {shard.path} points to a missing object"
            assert stored[pointer.oid].stat().st_size == pointer.size
    assert git("tag", "--list", "t/*", cwd=bare).split() == \
        [f"t/gen-{g:06d}" for g in range(1, GENS + 1)]
