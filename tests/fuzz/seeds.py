"""The fuzzer's seed files, built by code: one small valid file (or file set) per format, a
WTXT delta and a streaming WTXT with its WSUM, an age-armored file, and a sealed generation
(MANIFEST and ledger), with the keys that verify them. Everything is derived from fixed
random seeds and a fixed timestamp."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

TS = "2026-01-02T03:04:05Z"
RUN = "run1"


LFS_OIDS = ("a" * 64, "b" * 64)


def state(gen: int = 1) -> dict[str, np.ndarray]:
    """A few small arrays of the dtypes that take different paths (bf16 via the dtype record
    where a format lacks it, bool, a 0-d integer); ``gen`` changes one row."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    w[gen % 16] += gen
    return {"blocks.0.w": w, "emb": rng.standard_normal((6, 4)).astype(ml_dtypes.bfloat16),
            "mask": np.array([True, False, True]), "step": np.array(gen, np.int64)}


def build(folder: str | Path) -> dict:
    """Write every seed under ``folder``; returns (and writes to seeds.json) the layout."""
    import snapops
    from snapops.formats.armor import encrypt_file
    from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
    from snapops.formats.keys import generate_keys, load_hmac_key
    from snapops.formats.wtxt.delta import make_delta

    root = Path(folder)
    keys = root / "keys"
    generate_keys(keys)
    wtxt_keys = dict(hmac_key=keys / "hmac.key", sign_key=keys / "signing.key")
    plain = {"aero": ("s.aero", {}), "fold": ("s.fold", {}), "pycauset": ("s.pycauset", {}),
             "finf": ("s.finf", {"compression": "zstd", "checksum": True}),
             "npz": ("s.npz", {}), "safetensors": ("s.safetensors", {}), "pt": ("s.pt", {})}
    for fmt, (name, opts) in plain.items():
        (root / fmt).mkdir()
        snapops.save(state(), root / fmt / name, gen=1, ts=TS, **opts)
    # the options that take other code paths (page digests, Reed-Solomon parity, raw
    # FINF payloads, PyCauset's raw_dense layout)
    variants = {"aero/p.aero": ({"page_hashes": True, "page_size": 64}, state()),
                "fold/e.fold": ({"ecc": "low"}, state()),
                "finf/n.finf": ({"compression": "none", "checksum": False}, state()),
                "pycauset/r.pycauset": ({"layout": "raw_dense"},
                                        {"blocks.0.w": state()["blocks.0.w"]})}
    for rel, (opts, arrays) in variants.items():
        snapops.save(arrays, root / rel, gen=1, ts=TS, **opts)
    # the daemon's inputs from training processes: a spool file (a bf16 array and a box: a rank's
    # piece of a global array) and a WAL with requests, parts, commits and pushes
    from snapops.daemon.spool import write_spool
    from snapops.daemon.lifecycle import COMMITTED, DROPPED, PUSHED, REQ, SERIALIZED, SPOOLED
    from snapops.daemon.wal import Wal

    (root / "daemon").mkdir()
    spooled = dict(state(), emb=state()["emb"].view(np.uint16))     # as the client spools bf16
    write_spool(root / "daemon" / "gen-000001.spool", 1, spooled, meta={"ts": TS},
                logical={"emb": "bf16"}, boxes={"blocks.0.w": ((32, 8), (16, 0))})
    client = Wal(root / "daemon" / "wal.log")
    for gen in (1, 2, 3):
        client.append(REQ, gen, pid=4242, arrays=4)
    client.close()
    wal = Wal(root / "daemon" / "wal.log", writer="daemon")
    wal.append(SPOOLED, 1, file="gen-000000000001.spool", bytes=1234)
    wal.append(DROPPED, 2, reason="coalesced", by=3)
    wal.append(SERIALIZED, 1, bytes=2345)
    wal.append(COMMITTED, 1, commit="0" * 40, merkle="1" * 64, tag=f"{RUN}/gen-000001")
    wal.append(PUSHED, 1, remote="origin")
    wal.close()
    # an LFS batch answer as a server sends it: upload, verify and download actions, an error
    (root / "lfs").mkdir()
    (root / "lfs" / "batch.json").write_text(json.dumps({"transfer": "basic", "objects": [
        {"oid": LFS_OIDS[0], "size": 12, "authenticated": True, "actions": {
            "upload": {"href": "https://lfs.example/o/1", "header": {"Authorization": "x"},
                       "expires_in": 3600},
            "verify": {"href": "https://lfs.example/v/1", "header": {}},
            "download": {"href": "http://127.0.0.1:9/o/1"}}},
        {"oid": LFS_OIDS[1], "size": 3, "error": {"code": 404, "message": "not found"}}]},
        indent=1))
    # an LFS-store residual (the XOR of two generations of one shard) and what it applies to
    from snapops.formats.generation.residual import encode_residual

    (root / "residual").mkdir()
    base = state(1)["blocks.0.w"]
    target = base * np.float32(1.001)
    (root / "residual" / "base.bin").write_bytes(base.tobytes())
    (root / "residual" / "target.bin").write_bytes(target.tobytes())
    (root / "residual" / "r.snrs").write_bytes(
        encode_residual(base.tobytes(), target.tobytes(), itemsize=4))
    # what numpy.savez_compressed writes (deflated members), bf16 left out: numpy has none
    np.savez_compressed(root / "npz" / "c.npz",
                        **{k: v for k, v in state().items() if v.dtype != ml_dtypes.bfloat16})
    (root / "wtxt").mkdir()
    snapops.save(state(), root / "wtxt" / "s.wtxt", gen=1, ts=TS, rows_per_chunk=4,
                 audit="note=seed", **wtxt_keys)
    (root / "aeroset").mkdir()
    snapops.save(state(), root / "aeroset" / "model.aeroset.json", format="aeroset", gen=1,
                 ts=TS)
    (root / "wsum").mkdir()
    snapops.save(state(), root / "wsum" / "s.wtxt", gen=1, ts=TS, streaming=True,
                 rows_per_chunk=4, **wtxt_keys)
    delta = root / "delta"
    delta.mkdir()
    for gen, name in ((1, "base.wtxt"), (2, "target.wtxt")):
        snapops.save(state(gen), delta / name, gen=gen, ts=TS, rows_per_chunk=4, **wtxt_keys)
    make_delta(delta / "base.wtxt", delta / "target.wtxt", delta / "d.wtxtdelta",
               hmac_key=keys / "hmac.key", trusted_keys=[keys])
    (root / "age").mkdir()
    recipient = (keys / "age.pub").read_text().strip()
    encrypt_file(root / "wtxt" / "s.wtxt", root / "age" / "s.wtxt.age", [recipient])
    gen_root = root / "gen"
    spec = GenerationSpec(run=RUN, format="wtxt", shard_max=1024, build="b1",
                          sign_key=keys / "signing.key",
                          hmac_key=load_hmac_key(keys / "hmac.key"))
    seal_in_ledger(gen_root, RUN, write_generation(gen_root, spec, 1, TS, state()))
    aero_root = root / "gen-aero"
    aero = dataclasses.replace(spec, format="aero")
    seal_in_ledger(aero_root, RUN, write_generation(aero_root, aero, 1, TS, state()))
    other_inputs(root, gen_root)
    part_seed(root, load_hmac_key(keys / "hmac.key"))
    loose_object_seed(root)
    layout = {"keys": "keys", "run": RUN}
    (root / "seeds.json").write_text(json.dumps(layout))
    return layout


CONFIG = f"""[daemon]
spool_dir = "spool"
state_dir = "state"
log_level = "info"
log_format = "json"
poll_interval = 60.0
nice = 10
cpu_policy = "batch"
io_class = "best-effort"
max_attempts = 3
retry_initial = 0.5
retry_max = 30.0
abandon_after = 30.0

[client]
max_in_flight = 2
policy = "coalesce"

[snapshot]
run = "{RUN}"
format = "wtxt"
row_blocking = true
rows_per_chunk = 4
shard_max = "32MiB"
streaming_threshold = "1GiB"
delta = false
build = "b1"

[seal]
hmac_key = "keys/hmac.key"
sign_key = "keys/signing.key"
age_recipients = ["age1qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqs3290gq"]

[repo]
path = "repo"
branch = "main"
compression = 0
delta = "auto"
gc_interval = 3600.0
store = "lfs"
lfs_url = "https://lfs.example/org/weights.git/info/lfs"
lfs_token_file = "keys/lfs.token"
keyframe_every = 8

[[repo.remote]]
name = "origin"
url = "https://git.example/org/weights.git"

[[repo.remote]]
name = "backup"
url = "/srv/git/weights.git"

[push]
backoff_initial = 1.0
backoff_max = 300.0
stall_timeout = 120.0
batch_bytes = "256MiB"

[cluster]
world_size = 4
ranks = "0-1"
rank_timeout = 300.0
node = "node-a"
committer = "node-a"
remote = "origin"
"""


def other_inputs(root: Path, gen_root: Path) -> None:
    """What the daemon, a restore and the hooks read besides snapshot files: the config file,
    the daemon's status file (beside a WAL), an LFS pointer, a retention record, a tree's
    ``.lfsconfig``, and the pre-receive and pre-push hooks' input lines for a repository that
    holds a sealed generation."""
    import shutil
    import subprocess

    from snapops.formats.lfs.pointer import render_pointer

    (root / "config").mkdir()
    (root / "config" / "snapops.toml").write_text(CONFIG)
    status = root / "status"
    (status / "state").mkdir(parents=True)
    (status / "spool").mkdir()
    (status / "snapops.toml").write_text(
        '[daemon]\nspool_dir = "spool"\nstate_dir = "state"\n[snapshot]\nrun = "run1"\n'
        '[[repo.remote]]\nname = "origin"\nurl = "/srv/git/weights.git"\n')
    shutil.copy(root / "daemon" / "wal.log", status / "spool" / "wal.log")
    t = 1_780_000_000.0
    push = {"url": "https://host/snap.git", "pending": [3], "depth": 1, "pending_bytes": 1 << 20,
            "unmeasured": 0, "in_flight": {"gens": [3], "bytes": 1 << 20, "started": t - 12,
                                           "seconds": 12.0, "phase": "Writing objects",
                                           "percent": 37, "sent": 1 << 19, "rate": 1 << 16,
                                           "last_line": ""},
            "rate": 65536.0, "eta": 9.7, "attempts": 2, "last_error": "stalled",
            "next_retry": t + 31, "backoff": 30.0, "last_pushed": 1, "last_success": t - 3600,
            "pushed": 1, "default_branch": "refs/heads/main",
            "history": [{"time": t - 60, "gens": [2], "ok": False, "error": "refused"}]}
    (status / "state" / "status.json").write_text(json.dumps({
        "pid": 4242, "started": t - 7500, "retry_at": t + 5,
        "failures": [{"gen": 5, "stage": "serialize/commit", "error": "disk", "time": t}],
        "push": {"origin": push}, "retrying": {"5": {"attempts": 1, "max_attempts": 3}},
        "waiting_for_spool": [{"gen": 4, "writer": "0", "waiting_s": 12.5,
                               "writer_alive": True}],
        "waiting_for_ranks": [{"gen": 4, "missing": [1], "waiting_s": 3.0, "timeout_s": 300}],
        "wal_problem": None, "leftovers_removed": ["x.tmp"], "node": "node-a",
        "committer": "node-a", "ranks": [0, 1], "parts_remote_reachable": True,
        "parts_refused": [{"gen": 3, "node": "node-b", "why": "bad seal"}]}, indent=1))
    (root / "lfs" / "pointer").write_bytes(render_pointer(LFS_OIDS[0], 12))
    from snapops.formats.lfs.retention import Policy, RetentionRecord

    (root / "lfs" / "run1.retention").write_bytes(
        RetentionRecord(Policy(4, 5, frozenset({3, 40})), frozenset({1, 2, 6})).render())
    (root / "lfs" / "lfsconfig").write_text(
        "[lfs]\n\turl = https://lfs.example/org/weights.git/info/lfs\n")
    hook = root / "hook"
    work = hook / "work"
    git = ["git", "-c", "user.name=s", "-c", "user.email=s@x", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", "--bare", str(hook / "remote.git")], check=True)
    shutil.copytree(gen_root, work)
    subprocess.run([*git, "-C", str(work), "init", "-q"], check=True)
    subprocess.run([*git, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-q", "-m", "gen 1"], check=True)
    subprocess.run([*git, "-C", str(work), "push", "-q", str(hook / "remote.git"),
                    "HEAD:refs/heads/main", f"HEAD:refs/tags/{RUN}/gen-000001"], check=True)
    commit = subprocess.run([*git, "-C", str(work), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    shutil.rmtree(work)
    zero = "0" * 40
    (hook / "stdin").write_text(f"{zero} {commit} refs/heads/main\n"
                                f"{zero} {commit} refs/tags/{RUN}/gen-000001\n"
                                f"{commit} {zero} refs/heads/old\n")
    (hook / "push-stdin").write_text(f"refs/heads/main {commit} refs/heads/main {zero}\n"
                                     f"refs/tags/{RUN}/gen-000001 {commit} "
                                     f"refs/tags/{RUN}/gen-000001 {zero}\n"
                                     f"(delete) {zero} refs/heads/old {commit}\n")


PART_WORLD = 3


def part_seed(root: Path, hmac_key: bytes) -> None:
    """A contributor's sealed PART (node-b, ranks 1 and 2 of a world of 3): row slices of a
    float32 and a bf16 array, and a whole integer array rank 1 alone holds."""
    from snapops.daemon.parts import PartFile, PartHeader, render_part
    from snapops.formats.generation.plan import Shard
    from snapops.formats.generation.write import GenerationSpec, write_part

    arrays = state()
    w, emb = arrays["blocks.0.w"], arrays["emb"]
    rows = {1: (5, 10), 2: (10, 16)}     # the committer's rank 0 holds rows 0-4
    pieces = {rank: {"blocks.0.w": Shard(w[slice(*rows[rank])], global_shape=w.shape,
                                         offsets=(rows[rank][0], 0)),
                     "emb": Shard(emb[rank * 2:rank * 2 + 2], global_shape=emb.shape,
                                  offsets=(rank * 2, 0))}
              for rank in (1, 2)}
    pieces[1]["step"] = Shard(arrays["step"], global_shape=(), offsets=())
    spec = GenerationSpec(run=RUN, format="wtxt", shard_max=256, build="b1")
    written = write_part(root / "parts" / "files", spec, 2, TS, pieces, None)
    header = PartHeader(RUN, 2, "node-b", PART_WORLD, (1, 2), TS, "wtxt")
    (root / "parts" / "PART").write_bytes(render_part(PartFile(header, written), hmac_key))


LOOSE_CONTENT_SEED = 7


def loose_object_seed(root: Path) -> None:
    """A loose blob as a snapops repository stores it (``core.looseCompression 0``): 100 KB
    of content in git's stored deflate blocks, written by the real git."""
    import subprocess

    repo = root / "loose" / "repo"
    repo.mkdir(parents=True)
    for args in (["init", "-q"], ["config", "core.looseCompression", "0"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    content = np.random.default_rng(LOOSE_CONTENT_SEED).bytes(100_000)
    oid = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input=content,
                         capture_output=True, check=True).stdout.decode().strip()
    object_file = repo / ".git" / "objects" / oid[:2] / oid[2:]
    (root / "loose" / "object").write_bytes(object_file.read_bytes())
    (root / "loose" / "size").write_text(str(len(content)))


if __name__ == "__main__":
    build(sys.argv[1])
