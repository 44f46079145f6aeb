"""One training rank for the multi-rank tests: a real ``torch.distributed`` (gloo, CPU) process
with its own Snapshotter, driven line by line on stdin:

    step G     compute generation G's state (a real all_reduce with every rank)
    req G      request this rank's part of it (the Snapshotter takes rank and world size from
               torch.distributed); prints "req G"
    check G    load the newest generation of --clone and check this rank's rows of it
               against expected(G) bit for bit; prints "checked G"
    exit       close the Snapshotter and leave; prints "bye"

The global state of a generation depends on G only (never on the world size), so a run can be
checked, and resumed, at any world size.

    python -m tests.daemon.rank_worker --spool S --rank 1 --world 4 --store FILE [--clone DIR]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def expected(gen: int, one: np.float32 = np.float32(1.0)) -> dict[str, np.ndarray]:
    """Generation ``gen``'s global arrays (numpy; bf16 as ml_dtypes)."""
    import ml_dtypes

    rng = np.random.default_rng(gen)
    return {"emb.weight": rng.standard_normal((64, 16)).astype(np.float32) + one,
            "proj.weight": rng.standard_normal((8, 12)).astype(ml_dtypes.bfloat16),
            "step": np.array(gen, np.int64)}


def rank_state(gen: int, rank: int, world: int, dist) -> dict:
    """This rank's part as torch tensors: rows of emb (through an all_reduce: every rank adds
    (rank + 1), divided by the sum, gives exactly the +1 the expected state has), its rows of
    proj (bf16), and step on rank 0 only."""
    import torch

    from snapops.formats.generation.load import rank_shards

    ones = torch.full((1,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(ones)
    state = expected(gen, one=(ones / (world * (world + 1) / 2)).numpy()[0])
    out = {}
    for name, piece in rank_shards(state, rank, world).items():
        local = np.array(piece.local)   # a C-ordered copy (0-d arrays stay 0-d)
        tensor = torch.from_numpy(local.view(np.int16)).view(torch.bfloat16) \
            if name == "proj.weight" else torch.from_numpy(local)
        out[name] = type(piece)(tensor, global_shape=piece.global_shape, offsets=piece.offsets)
    return out


def check(clone: str, run: str, gen: int, rank: int, world: int) -> None:
    from snapops.formats.generation.load import load_from_source, rank_view
    from snapops.formats.generation.source import FolderSource

    snap = load_from_source(FolderSource(clone), run)
    assert snap.meta["gen"] == gen, snap.meta
    mine, want = rank_view(snap.arrays, rank, world), rank_view(expected(gen), rank, world)
    for name, array in want.items():
        assert mine[name].dtype == array.dtype and mine[name].tobytes() == array.tobytes(), name


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--spool", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--run", default="t")
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--clone")
    args = p.parse_args()
    import torch.distributed as dist

    from snapops.daemon.client import Snapshotter

    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank,
                            world_size=args.world)
    snap = Snapshotter(args.spool, policy="block")
    assert (snap.rank, snap.world_size) == (args.rank, args.world)
    states = {}
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, value = line.strip().partition(" ")
        if command == "step":
            states[int(value)] = rank_state(int(value), args.rank, args.world, dist)
        elif command == "req":
            snap.request(states.pop(int(value)), int(value))
            snap.flush()
        elif command == "check":
            check(args.clone, args.run, int(value), args.rank, args.world)
        elif command == "exit":
            break
        print(f"{command} {value}".strip(), flush=True)
    snap.close()
    dist.destroy_process_group()
    print("bye", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
