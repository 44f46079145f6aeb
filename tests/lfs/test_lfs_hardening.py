"""The LFS store against an attacker and a demanding user, continued (see
test_client_hostile.py): a download never writes through a planted symlink, a server's error
text stays one short line, a malformed answer to the committer's check is a typed error, and
pruning one run never deletes an object another run of the same store shares."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from snapops.formats.errors import LfsError, LimitError
from snapops.formats.generation.manifest import ShardRecord
from snapops.formats.generation.write import (
    GenerationSpec,
    seal_in_ledger,
    write_generation,
)
from snapops.formats.lfs.client import LfsClient
from snapops.formats.lfs.objects import ObjectStore
from snapops.formats.lfs.stash import LfsStash

from snapops.cli import main

from ..daemon.gitserve import git
from .test_client_hostile import DATA, OID, SIZE, TOKEN, Server, batch_answer


@pytest.fixture
def lfs():
    """A hostile LFS server on 127.0.0.1 (its ``answer`` set by each test)."""
    server = Server()
    yield server
    server.close()


def serving_the_object(lfs) -> None:
    action = {"href": f"{lfs.url}/objects/{OID}"}

    def answer(handler):
        if handler.path.endswith("/objects/batch"):
            batch_answer({"objects": [{"oid": OID, "actions": {"download": action}}]})(handler)
        else:
            handler.reply(200, DATA)
    lfs.answer = answer


def test_a_download_never_writes_through_a_planted_symlink(lfs, tmp_path):
    """Whoever can write into a shared --lfs-cache plants a symlink where a download's temp
    file would be (it used to be named by pid and thread): the file it points to outside the
    cache stays as it was, and the object arrives in the cache."""
    serving_the_object(lfs)
    victim = tmp_path / "precious"
    victim.write_bytes(b"not yours")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(victim, cache / f".{OID}.{os.getpid()}.{threading.get_ident()}.part")
    LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN).download(OID, SIZE, cache / OID)
    assert victim.read_bytes() == b"not yours"
    assert (cache / OID).read_bytes() == DATA and not (cache / OID).is_symlink()


def test_a_server_error_text_is_one_short_line(lfs, tmp_path):
    """The code and message an LFS server sends for an object go into the error: never a
    second (forged) log line, a terminal escape, or a code of any length."""
    lfs.answer = batch_answer({"objects": [{"oid": OID, "error": {
        "code": "9" * 5000, "message": "gone\n2026-01-01 INFO restore ok\x1b[2J"}}]})
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    with pytest.raises(LfsError, match=r"server error 9{40}: gone 2026-01-01 INFO restore ok"
                                       r" \[2J$") as raised:
        client.download(OID, SIZE, tmp_path / OID)
    assert len(str(raised.value)) < 200


def trickle(handler, body: bytes, pause: float = 0.05) -> None:
    """Headers at once, then the body a byte at a time: never a silence the socket timeout
    would end."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Content-Type", "application/vnd.git-lfs+json")
    handler.end_headers()
    try:
        for i in range(len(body)):
            handler.wfile.write(body[i:i + 1])
            handler.wfile.flush()
            time.sleep(pause)
    except (BrokenPipeError, ConnectionResetError):   # the client gave up: what is tested
        pass


@pytest.mark.parametrize("slow", ["object", "batch answer"])
def test_a_server_trickling_bytes_is_given_up(lfs, tmp_path, slow):
    """A byte every 50 ms keeps every read within the socket timeout; the download (or the
    batch answer) is ended once a span brings fewer bytes than the low-speed limit."""
    action = {"href": f"{lfs.url}/objects/{OID}"}
    answer = json.dumps({"objects": [{"oid": OID, "actions": {"download": action}}]}).encode()

    def serve(handler):
        if handler.path.endswith("/objects/batch"):
            trickle(handler, answer) if slow == "batch answer" else \
                batch_answer(json.loads(answer))(handler)
        else:
            trickle(handler, DATA)
    lfs.answer = serve
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN, low_speed=(1000, 0.3))
    where = rf"LFS object {OID}" if slow == "object" else r"LFS POST http://127\.0\.0\.1:\d+/"
    with pytest.raises(LfsError, match=rf"{where}.*: the server sent \d+ bytes in 0 s \(at "
                                       r"least 1000 expected\): too slow, given up"):
        client.download(OID, SIZE, tmp_path / OID)
    assert list(tmp_path.iterdir()) == []
    if slow == "object":   # a byte per 50 ms is fast enough for a limit of 1 byte per 0.3 s
        LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN, low_speed=(1, 0.3)).download(
            OID, SIZE, tmp_path / OID)
        assert (tmp_path / OID).read_bytes() == DATA


def test_download_temps_a_killed_restore_left_are_swept_live_ones_kept(tmp_path):
    """A kept --lfs-cache: a temp (a download, an unhashed rebuilt shard) untouched for over
    an hour is a killed process's; a fresh one may be another restore's work in progress;
    other files are never touched."""
    cache = tmp_path / "cache"
    cache.mkdir()
    old, live = cache / f".{OID}.{'a' * 16}.part", cache / f".{OID}.{'b' * 16}.part"
    other = cache / f".{OID}.{os.getpid()}.tmp"
    rebuilt_old, rebuilt_live = cache / ".unhashed.17.4242", cache / ".unhashed.18.4242"
    for path in (old, live, other, rebuilt_old, rebuilt_live):
        path.write_bytes(b"partial")
    for path in (old, other, rebuilt_old):
        os.utime(path, (time.time() - 7200,) * 2)
    ObjectStore(cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [live.name, other.name, rebuilt_live.name])


def test_a_malformed_answer_to_the_committers_check_is_a_typed_error(lfs, tmp_path):
    lfs.answer = batch_answer({"objects": [{"oid": OID, "actions": ["upload"]}]})
    stash = LfsStash(ObjectStore(tmp_path / "cache",
                                 LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)))
    shard = ShardRecord("shards/0000.aero", "aero", SIZE, OID, 1, "-", object=OID,
                        object_size=SIZE, encoding="key")
    with pytest.raises(LfsError, match=rf"LFS object {OID}: 'actions' is not an object"):
        stash.check_on_server([shard])


def test_pruning_one_run_keeps_the_objects_another_run_shares(tmp_path, capsys):
    """Two runs of one repository (one LFS store) that start from the same weights store
    that first shard as one object: pruning run a's first generation leaves it for run b,
    and still deletes what only run a used."""
    repo, storage = tmp_path / "repo", tmp_path / "storage"   # storage: <oid> files
    git("init", "-q", "-b", "main", str(repo))
    git("config", "user.email", "t@t", cwd=repo)
    git("config", "user.name", "t", cwd=repo)
    rng = np.random.default_rng(5)
    start, later = (rng.standard_normal(1024).astype(np.float32) for _ in range(2))
    objects = {}
    for run, states in (("a", [start, later, later * 2]), ("b", [start])):
        spec = GenerationSpec(run=run, format="aero", store="lfs",
                              lfs=LfsStash(ObjectStore(storage), keyframe_every=1))
        previous = None
        for gen, weights in enumerate(states, start=1):
            written = write_generation(repo, spec, gen, f"2026-01-02T03:04:{gen:02d}Z",
                                       {"w": weights}, previous)
            seal_in_ledger(repo, run, written)
            previous = written.data
            objects[run, gen] = written.manifest.shards[0].object
            git("add", "-A", cwd=repo)
            git("commit", "-qm", f"{run} gen {gen}", cwd=repo)
            git("tag", f"{run}/gen-{gen:06d}", cwd=repo)
    assert objects["a", 1] == objects["b", 1]
    assert main(["lfs", "prune", str(repo), "--run", "a", "--keep-last", "1",
                 "--local-storage", str(storage), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pruned"] == [1, 2] and summary["objects_deleted"] == 1
    assert (storage / objects["b", 1]).is_file()             # run b's only generation
    assert not (storage / objects["a", 2]).exists()
    assert (storage / objects["a", 3]).is_file()


def test_a_planted_cache_file_is_replaced_not_handed_out(lfs, tmp_path):
    """A file of the right name and size but other bytes in a kept --lfs-cache (planted, or
    damaged): the shard handed out is the server's, checked, not that file."""
    serving_the_object(lfs)
    store = ObjectStore(tmp_path / "cache", LfsClient(f"{lfs.url}/r.git/info/lfs", TOKEN))
    (store.root / OID).write_bytes(b"X" * SIZE)
    keyframe = ShardRecord("shards/0000.aero", "aero", SIZE, OID, 1, "-", object=OID,
                           object_size=SIZE, encoding="key")
    assert store.shard(keyframe, lambda gen: None).read_bytes() == DATA
    assert store.fetched == 1 and store.hashed(store.path(OID)) == OID


def test_a_base_declaring_a_huge_object_is_refused_before_any_download(lfs, tmp_path):
    """An older MANIFEST (read from its tag, unsealed) names a residual's base object of 100
    PB: a hostile server would stream that much into the cache; nothing is asked for."""
    serving_the_object(lfs)
    store = ObjectStore(tmp_path / "cache", LfsClient(f"{lfs.url}/r.git/info/lfs", TOKEN))
    huge = 10**17
    target = ShardRecord("shards/0000.aero", "aero", 100, "c" * 64, 5, "-", object="d" * 64,
                         object_size=50, encoding="res", base=3)
    base = ShardRecord("shards/0000.aero", "aero", huge, "b" * 64, 3, "-", object="b" * 64,
                       object_size=huge, encoding="key")
    with pytest.raises(LimitError, match=rf"\[limit\] array LFS object of gen 3: expected at "
                                         rf"most {64 << 30} bytes declared, got {huge} bytes"):
        store.shard(target, {3: base}.get)
    assert lfs.seen == [] and list(store.root.iterdir()) == []
