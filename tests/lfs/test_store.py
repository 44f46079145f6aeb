"""The LFS store at the generation level: real giftless, keyframes and residuals, restore exact."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import struct

import numpy as np
import pytest
import zstandard as zstd
from snapops.formats.errors import FormatError
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.manifest import ShardRecord, parse_manifest
from snapops.formats.generation.residual import (
    HEADER,
    decode_residual,
    encode_residual,
    read_header,
)
from snapops.formats.generation.source import FolderSource
from snapops.formats.generation.verify import verify_generation
from snapops.formats.generation.write import (
    GenerationSpec,
    seal_in_ledger,
    write_generation,
)
from snapops.formats.lfs.client import LfsClient
from snapops.formats.lfs.objects import ObjectStore
from snapops.formats.lfs.pointer import parse_pointer
from snapops.formats.lfs.source import LfsSource
from snapops.formats.lfs.stash import LfsStash
from snapops.formats.zstdframe import frame_sizes


def states(count, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 64, 64)).astype(np.float32)
    for _ in range(count):
        w = w * (1 + np.float32(1e-3) * rng.standard_normal(w.shape).astype(np.float32))
        yield {"w": w.copy(), "step": np.array(7, np.int64)}


def write_run(root, giftless, cache, gens, k=3, fmt="aero"):
    client = LfsClient(giftless.url, giftless.token())
    spec = GenerationSpec(run="r", format=fmt, shard_max=1 << 20, store="lfs",
                          lfs=LfsStash(ObjectStore(cache, client), keyframe_every=k))
    manifests, previous = {}, None
    for gen, state in enumerate(states(gens), start=1):
        written = write_generation(root, spec, gen, f"2026-01-02T03:04:{gen:02d}Z", state,
                                   previous)
        seal_in_ledger(root, "r", written)
        previous = manifests[gen] = written.data
    return manifests, client


def test_chain_of_keyframes_and_residuals_restores_exactly(giftless, tmp_path):
    root = tmp_path / "repo"
    manifests, _ = write_run(root, giftless, tmp_path / "daemon-cache", 7, k=3)
    shards = [parse_manifest(manifests[g]).shards[0] for g in range(1, 8)]
    assert [s.encoding for s in shards] == ["key"] + ["res"] * 6
    # skip residuals: shard number n (gen n + 1) against number n & (n - 1)
    assert [s.base for s in shards] == [None, 1, 1, 3, 1, 5, 5]
    last = shards[-1]
    assert last.object_size < 0.75 * last.size
    pointer = parse_pointer((root / "snapshots/r" / last.path).read_bytes())
    assert (pointer.oid, pointer.size) == (last.object, last.object_size)
    assert last.object in giftless.objects()
    # without fetching: pointers against the sealed MANIFEST
    report = verify_generation(FolderSource(root), "r")
    assert report.ok, report.failure
    assert "lfs-pointers" in report.checks and "not fetched" in " ".join(report.notes)
    # with fetching: an empty cache, objects from giftless, the chain applied
    store = ObjectStore(tmp_path / "restore-cache",
                        LfsClient(giftless.url, giftless.token("read")))
    src = LfsSource(FolderSource(root), "r", store, manifests=manifests.get)
    snap = load_from_source(src, "r")
    want = list(states(7))[-1]
    assert snap["w"].tobytes() == want["w"].tobytes() and snap["w"].dtype == np.float32
    assert store.fetched == 3           # exactly residuals 7 and 5 and keyframe 1 (K - 1 = 2)


def _first_shards(tmp_path, generations, k):
    """Server-less: each generation written with the stash (``keyframe_every`` k); the
    records of its first shard, by gen."""
    spec = GenerationSpec(run="r", format="aero", shard_max=1 << 20, store="lfs",
                          lfs=LfsStash(ObjectStore(tmp_path / "cache"), keyframe_every=k))
    previous, records = None, []
    for gen, state in enumerate(generations, start=1):
        written = write_generation(tmp_path / "repo", spec, gen, f"2026-01-02T03:04:{gen:02d}Z",
                                   state, previous)
        previous = written.data
        records.append(written.manifest.shards[0])
    return records


def test_a_keyframe_is_due_when_a_restore_would_apply_k_residuals(tmp_path):
    """Without a server: the stash's choice of base for each generation of one shard."""
    records = _first_shards(tmp_path, states(10), k=3)
    # numbers 0-6 since gen 1; number 7 would need 3 residuals: gen 8 is a keyframe
    assert [r.encoding for r in records] == ["key"] + ["res"] * 6 + ["key", "res", "res"]
    assert [r.base for r in records] == [None, 1, 1, 3, 1, 5, 5, None, 8, 8]
    cached = {p.name for p in (tmp_path / "cache").iterdir()}
    assert {r.sha256 for r in records[7:]} <= cached   # the spine of gen 10: gens 8 and 10


def sparse_states(count, seed=0):
    """One row of 256 changes per generation (0.4% of the bytes)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 64, 64)).astype(np.float32)
    for gen in range(count):
        w[gen % 4, gen % 64] += np.float32(1e-3)
        yield {"w": w.copy(), "step": np.array(7, np.int64)}


@pytest.mark.parametrize("changes, chain", [(states, 3), (sparse_states, 4)])
def test_past_three_residuals_only_a_small_one_goes_on_the_chain(tmp_path, changes, chain):
    """keyframe_every 8: number 15 (gen 16) is the first whose restore would apply 4
    residuals. A dense change (every weight moves: residuals over half the shard) starts a
    keyframe there; a sparse one (residuals of a few hundred bytes) goes on."""
    records = _first_shards(tmp_path, changes(17), k=8)
    share = max(r.object_size / r.size for r in records[1:15])
    assert share > 0.3 if changes is states else share < 0.05
    assert [r.encoding for r in records[:15]] == ["key"] + ["res"] * 14
    if chain == 3:
        assert [(r.encoding, r.base) for r in records[15:]] == [("key", None), ("res", 16)]
    else:
        assert [(r.encoding, r.base) for r in records[15:]] == [("res", 15), ("res", 1)]
    by_gen = {r.gen: r for r in records}
    lengths = []
    for record in records:                    # residuals a restore of each gen applies
        n = 0
        while record.encoding == "res":
            record, n = by_gen[record.base], n + 1
        lengths.append(n)
    assert max(lengths) == chain


def test_pointer_not_matching_the_manifest_is_refused(giftless, tmp_path):
    root = tmp_path / "repo"
    write_run(root, giftless, tmp_path / "cache", 2)
    m = parse_manifest((root / "snapshots/r/MANIFEST").read_bytes())
    shard = root / "snapshots/r" / m.shards[0].path
    shard.write_bytes(shard.read_bytes().replace(b"size ", b"size 1"))
    report = verify_generation(FolderSource(root), "r")
    assert not report.ok and report.failure.check in ("lfs-pointer", "size")


def test_object_missing_on_the_server_is_a_typed_failure(giftless, tmp_path):
    root = tmp_path / "repo"
    manifests, _ = write_run(root, giftless, tmp_path / "cache", 2)
    shutil.rmtree(giftless.storage / "snapops")
    store = ObjectStore(tmp_path / "empty", LfsClient(giftless.url, giftless.token("read")))
    report = verify_generation(LfsSource(FolderSource(root), "r", store,
                                         manifests=manifests.get), "r")
    assert not report.ok and "LFS" in str(report.failure)


def _chain(store, lengths, seed=3, itemsizes=None, every=97):
    """Server-less: shard files of the given lengths, gen 1 a keyframe and each later gen a
    residual against the one before (with ``itemsizes[gen - 1]``, default 4; every
    ``every``-th byte changed); (records by gen, the files' bytes)."""
    rng = np.random.default_rng(seed)
    files = [rng.integers(0, 256, lengths[0], dtype=np.uint8).tobytes()]
    for length in lengths[1:]:
        prev = np.frombuffer(files[-1], np.uint8)
        nxt = np.resize(prev, length).copy()
        nxt[::every] ^= rng.integers(1, 256, len(nxt[::every]), dtype=np.uint8)
        files.append(nxt.tobytes())
    records = {}
    for gen, data in enumerate(files, start=1):
        sha = hashlib.sha256(data).hexdigest()
        if gen == 1:
            oid, size = store.put_written(lambda f: f.write(data))
            extra = {"encoding": "key"}
        else:
            size_of_items = itemsizes[gen - 1] if itemsizes else 4
            blob = encode_residual(files[gen - 2], data, itemsize=size_of_items)
            oid, size = store.put_written(lambda f: f.write(blob))
            extra = {"encoding": "res", "base": gen - 1}
        records[gen] = ShardRecord("shards/0000.aero", "aero", len(data), sha, gen, "-",
                                   object=oid, object_size=size, **extra)
    return records, files


def test_a_residual_chain_of_changing_lengths_restores_exactly(tmp_path):
    """Lengths grow and shrink along the chain (AERO headers differ by a few bytes from
    generation to generation): every generation comes back byte for byte, and only the
    requested shard enters the cache beside the stored objects."""
    store = ObjectStore(tmp_path / "cache")
    records, files = _chain(store, [4000, 4013, 3990, 4001, 3001, 5003])
    before = {p.name for p in store.root.iterdir()}
    path = store.shard(records[6], records.get)
    assert path.read_bytes() == files[5]
    assert {p.name for p in store.root.iterdir()} - before == {records[6].sha256}
    for gen in (2, 4, 5):
        assert store.shard(records[gen], records.get).read_bytes() == files[gen - 1]


@pytest.mark.parametrize("durable", [True, False])
def test_only_a_durable_store_fsyncs_the_shards_it_rebuilds(tmp_path, monkeypatch, durable):
    """A restore's private cache (``durable=False``) rebuilds the same bytes without fsyncs;
    a kept cache fsyncs the rebuilt shard and its folder before the shard is visible."""
    store = ObjectStore(tmp_path / "cache", durable=durable)
    records, files = _chain(store, [40_000, 40_013, 39_990])
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    assert store.shard(records[3], records.get).read_bytes() == files[-1]
    assert bool(synced) is durable
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("lengths,itemsizes,every", [
    ([4000, 4003, 3998, 4001, 4001, 4010], None, 97),           # one run of five residuals
    ([4000, 4000, 4000, 4000], [2] * 4, 97),
    ([4000, 4003, 9000, 9004, 8999, 12, 15], None, 97),         # jumps start new runs
    ([4000, 4001, 4002, 4005, 4003], [4, 4, 2, 2, 8], 97),      # the item size changes
    ([7, 5, 9, 3], None, 97),                                   # shorter than two items
    ([80_004, 80_000, 80_001, 80_004, 79_999, 80_004, 80_004, 80_003], None, 4099),
    ([4000] * 4, [8] * 4, 8),                     # only plane 0 changes: others no values
])
def test_a_chain_restores_as_its_residuals_one_by_one(tmp_path, lengths, itemsizes, every):
    """However the residuals group into plane runs, the restored shard is the one that
    decoding them one at a time gives; their sparse planes (every ``every``-th byte changes:
    each case has some; at 1 in 4099, a chain of 7 whose bitmaps are nearly all zero words)
    are applied from their bitmaps."""
    store = ObjectStore(tmp_path / "cache")
    records, files = _chain(store, lengths, itemsizes=itemsizes, every=every)
    heads = [read_header(store.path(records[gen].object).read_bytes())
             for gen in range(2, len(files) + 1)]
    assert any(head.sparse for head in heads)
    assert store.shard(records[len(files)], records.get).read_bytes() == files[-1]
    one_by_one = files[0]
    for gen in range(2, len(files) + 1):
        one_by_one = decode_residual(one_by_one, store.path(records[gen].object).read_bytes())
    assert one_by_one == files[-1]


@pytest.mark.parametrize("where,check", [("low plane", "residual-digest"),
                                         ("top plane's frame header", "residual")])
def test_a_damaged_residual_payload_is_a_typed_failure_and_caches_nothing(tmp_path, where,
                                                                          check):
    """Every byte changed: a flipped byte in the lowest plane (random bytes, stored as raw
    literals: the middle of the first frame) decodes to the wrong shard (refused by its
    digest); one in the last frame's header is not valid zstd (refused while decoding, into
    the cache file's mapped pages): either way nothing enters the cache and no temp file is
    left."""
    store = ObjectStore(tmp_path / "cache")
    records, _ = _chain(store, [40_000, 40_000, 40_000], every=1)
    blob = store.path(records[3].object)
    damaged = bytearray(blob.read_bytes())
    frames = frame_sizes(damaged[HEADER.size:])
    assert len(frames) == 4 and frames[0][0] > 10_000        # the lowest plane: raw literals
    if where == "low plane":
        damaged[HEADER.size + frames[0][0] // 2] ^= 0x55
    else:
        damaged[HEADER.size + sum(size for size, _ in frames[:-1])] ^= 0x55   # its magic
    blob.write_bytes(bytes(damaged))
    with pytest.raises(FormatError, match=rf"\[{check}\]"):
        store.shard(records[3], records.get)
    assert not store.has(records[3].sha256)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]


def _with_a_bad_bitmap(blob: bytes, damage: str) -> bytes:
    """``blob``, a residual whose plane 0 is sparse (its first two frames), with that plane's
    bitmap and values made not to match: a bit set past the plane's end (and a value for it,
    so that only the bit is wrong), or one value fewer than bits set."""
    payload = memoryview(blob)[HEADER.size:]
    frames, at = [], 0
    for size, _ in frame_sizes(payload):
        frames.append(zstd.ZstdDecompressor().decompress(payload[at:at + size]))
        at += size
    bitmap, values = bytearray(frames[0]), frames[1]
    if damage == "a bit past the plane":
        bitmap[-1] |= 0x80
        values += b"\x01"
    else:
        values = values[:-1]
    frames[:2] = [bytes(bitmap), values]
    damaged = b"".join(zstd.ZstdCompressor().compress(frame) for frame in frames)
    head = bytearray(blob[:HEADER.size])
    struct.pack_into("<Q", head, HEADER.size - 8, len(damaged))
    return bytes(head) + damaged


@pytest.mark.parametrize("damage, message", [
    ("a bit past the plane", "sparse plane 0: the bitmap sets bits past its 10001 items"),
    ("a value too few", "sparse plane 0: the bitmap does not set as many bits as there are"),
])
@pytest.mark.parametrize("gen", [2, 3])
def test_a_sparse_plane_whose_bitmap_does_not_match_its_values_is_refused(tmp_path, damage,
                                                                        message, gen):
    """A residual of the chain (its first or its last) stored with such a plane, under its
    own digest as a server would hand it out: the restore fails with a typed error, cached or
    unhashed, and leaves nothing behind."""
    store = ObjectStore(tmp_path / "cache")
    records, _ = _chain(store, [40_004] * 3)
    blob = store.path(records[gen].object).read_bytes()
    assert read_header(blob).sparse & 1 and (40_004 // 4) % 8
    oid, size = store.put_written(lambda f: f.write(_with_a_bad_bitmap(blob, damage)))
    forged = {**records, gen: dataclasses.replace(records[gen], object=oid, object_size=size)}
    pattern = rf"\[residual\] residual payload has a bad sparse plane: {message}"
    with pytest.raises(FormatError, match=pattern):
        store.shard(forged[3], forged.get)
    with pytest.raises(FormatError, match=pattern):
        with store.unhashed_shard(forged[3], forged.get):
            pass
    assert not store.has(records[3].sha256)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]


def test_a_damaged_cached_base_fails_closed_and_caches_nothing(tmp_path):
    store = ObjectStore(tmp_path / "cache")
    records, files = _chain(store, [4000, 4000, 4000])
    key = store.path(records[1].sha256)
    damaged = bytearray(key.read_bytes())
    damaged[100] ^= 1
    key.write_bytes(bytes(damaged))               # same size: only its bytes can tell
    with pytest.raises(FormatError, match=r"\[residual-digest\].*may be damaged"):
        store.shard(records[3], records.get)
    assert not store.has(records[3].sha256)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]


def test_an_unhashed_rebuild_is_exact_private_and_never_cached(tmp_path):
    """What a restore proving shards by their arrays asks for: the chain applied without the
    result's SHA-256, in a private file removed afterwards; a keyframe is its cached object."""
    store = ObjectStore(tmp_path / "cache")
    records, files = _chain(store, [40_000, 40_100, 39_900])
    before = sorted(p.name for p in store.root.iterdir())
    with store.unhashed_shard(records[3], records.get) as local:
        assert local.read_bytes() == files[-1]
        assert local.parent == store.root and local.name.startswith(".unhashed.")
        assert store.hashed(local) is None and not store.has(records[3].sha256)
    assert sorted(p.name for p in store.root.iterdir()) == before
    with store.unhashed_shard(records[1], records.get) as key:
        assert key == store.path(records[1].sha256) and key.read_bytes() == files[0]


def test_a_restore_of_a_damaged_chain_fails_by_its_digest_and_caches_nothing(giftless,
                                                                           tmp_path):
    """A residual damaged in the restore's cache (cached objects are used by their name)
    rebuilds a wrong shard: its arrays do not hash to the sealed content digest, the file's
    SHA-256 then refuses it, and nothing enters the cache under the sealed name."""
    root = tmp_path / "repo"
    manifests, client = write_run(root, giftless, tmp_path / "daemon-cache", 3, k=3)
    last = parse_manifest(manifests[3]).shards[0]
    assert last.encoding == "res"
    store = ObjectStore(tmp_path / "restore-cache", client)
    blob = store.fetch(last.object, last.object_size)
    damaged = bytearray(blob.read_bytes())
    damaged[len(damaged) // 2] ^= 0x55
    blob.write_bytes(bytes(damaged))
    src = LfsSource(FolderSource(root), "r", store, manifests=manifests.get)
    with pytest.raises(FormatError, match=r"\[digest\] file bytes do not match"):
        load_from_source(src, "r")
    assert not store.has(last.sha256)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".unhashed.")]


def test_a_residual_naming_another_base_is_refused_before_decoding(tmp_path):
    store = ObjectStore(tmp_path / "cache")
    records, _ = _chain(store, [4000, 4000, 4000])
    # gen 3's base, as another MANIFEST history would claim it: same object, another shard
    forged = {**records, 2: dataclasses.replace(records[2], sha256="ab" * 32)}
    with pytest.raises(FormatError, match=r"names another target.*\(gen 2\)"):
        store.shard(forged[3], forged.get)
    assert not store.has(records[3].sha256)


def test_a_committer_refuses_shards_whose_objects_are_not_on_the_server(giftless, tmp_path):
    """What the committer of a multi-node run asks before it commits other nodes' pointers."""
    manifests, client = write_run(tmp_path / "repo", giftless, tmp_path / "cache", 2)
    shards = list(parse_manifest(manifests[2]).shards) + list(parse_manifest(manifests[1]).shards)
    stash = LfsStash(ObjectStore(tmp_path / "committer", client))
    stash.check_on_server(shards)                   # both generations' objects are there
    gone = shards[0].object
    giftless.objects()[gone].unlink()
    with pytest.raises(FormatError, match=rf"\[lfs\].*not on the server.*{gone}"):
        stash.check_on_server(shards)


def test_the_verifier_reuses_a_digest_only_while_the_file_is_unchanged(tmp_path):
    """The store hashed the shard it rebuilt; a file changed since (same size) is not vouched
    for any more, so the verifier hashes it and finds the change."""
    store = ObjectStore(tmp_path / "cache")
    records, files = _chain(store, [4000, 4000, 4000])
    path = store.shard(records[3], records.get)
    assert store.hashed(path) == records[3].sha256 == hashlib.sha256(files[2]).hexdigest()
    assert store.hashed(store.path(records[1].sha256)) is None   # cached before: not vouched
    data = bytearray(path.read_bytes())
    data[7] ^= 1
    path.write_bytes(bytes(data))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert store.hashed(path) is None
