"""The WAL and spool of a multi-rank run, without a daemon: parts fold into generations, foreign
ranks and worlds are refused, each rank has its own lock, last gen and unfinished parts, spool
files carry boxes, and the cluster config is checked as a whole."""

from __future__ import annotations

import numpy as np
import pytest

from snapops import Shard
from snapops.config import load_config
from snapops.daemon.client import Snapshotter, resolve_rank
from snapops.daemon.lifecycle import DROPPED, REQ, SPOOLED
from snapops.daemon.ranks import Cluster, pieces
from snapops.daemon.spool import Spool, spool_files, spool_name, write_spool
from snapops.daemon.wal import Wal, format_record, replay
from snapops.daemon.writers import WriterBusy, retire_unfinished
from snapops.formats.errors import ConfigError, DataError, FormatError

SCOPE = {"writers": frozenset("012"), "expect": frozenset("012"), "world": 3}


def append(path, writer: str, event: str, gen: int, **fields) -> None:
    wal = Wal(path, writer=writer)
    wal.append(event, gen, **fields)
    wal.close()


def test_a_generation_follows_its_parts(tmp_path):
    path = tmp_path / "wal.log"
    for rank in "201":
        append(path, rank, REQ, 5, world=3)
    append(path, "2", SPOOLED, 5, file=spool_name(5, 2))
    append(path, "0", SPOOLED, 5, file=spool_name(5, 0))
    state, _ = replay(path, **SCOPE)
    assert state.gens[5].state == REQ and state.gens[5].missing(state.expect) == ["1"]
    append(path, "1", SPOOLED, 5, file=spool_name(5, 1))
    append(path, "1", REQ, 6, world=3)
    append(path, "1", DROPPED, 6, reason="coalesced", by=7)   # one part lost: gen lost
    state, _ = replay(path, **SCOPE)
    assert state.gens[5].state == SPOOLED and state.gens[5].missing(state.expect) == []
    assert state.gens[6].state == DROPPED and state.gens[6].fields["part"] == "1"
    assert state.last_gen("1") == 6 and state.last_gen("0") == 5


def test_foreign_ranks_worlds_and_repeated_parts_are_refused(tmp_path):
    path = tmp_path / "wal.log"
    append(path, "7", REQ, 1, world=3)               # not a writer of this spool
    append(path, "0", REQ, 2, world=4)               # another world size: bad_record
    append(path, "0", REQ, 3, world=3)
    append(path, "0", REQ, 3, world=3)               # the same part twice
    append(path, "daemon", SPOOLED, 3, part=5, file=spool_name(3, 5))   # rank not served
    state, _ = replay(path, **SCOPE)
    assert sorted(state.gens) == [2, 3]              # gen 1 (a foreign writer) never entered
    assert "world=4 but this spool serves a world of 3" in state.gens[2].problem
    whys = [why for _, why in state.rejected]
    assert any("writer 7 may not write" in w for w in whys)
    assert any("REQ is not allowed in state REQ" in w for w in whys)
    assert any("rank 5 is not served here" in w for w in whys)


def test_each_rank_has_its_lock_and_retires_only_its_own_parts(tmp_path):
    snaps = [Snapshotter(tmp_path, rank=r, world_size=3) for r in range(3)]
    try:
        with pytest.raises(WriterBusy, match="live writer 1"):
            Snapshotter(tmp_path, rank=1, world_size=3)
        for snap in snaps:
            snap.request({"w": Shard(np.full((2, 4), snap.rank, np.float32),
                                     global_shape=(6, 4), offsets=(2 * snap.rank, 0))}, 4)
            snap.flush()
    finally:
        for snap in snaps:
            snap.close()
    assert sorted(p.name for _, p in spool_files(tmp_path)) == \
        [spool_name(4, r) for r in range(3)]
    append(tmp_path / "wal.log", "2", REQ, 9, world=3)   # rank 2 dies before spooling gen 9
    state, _ = replay(tmp_path / "wal.log", **SCOPE)
    wal = Wal(tmp_path / "wal.log", writer="daemon")
    assert retire_unfinished(wal, state, tmp_path, "1") == {}
    assert retire_unfinished(wal, state, tmp_path, "2") == {9: "abandoned"}
    wal.close()
    state, _ = replay(tmp_path / "wal.log", **SCOPE)
    assert state.gens[9].state == DROPPED and state.gens[9].fields["part"] == "2"
    with Snapshotter(tmp_path, rank=2, world_size=3) as again:
        assert again.last_gen == 9
    with Spool(tmp_path / spool_name(4, 1)) as spool:
        assert spool.meta == {"ts": spool.meta["ts"], "rank": 1, "world": 3}
        piece = pieces(spool, spool.arrays())["w"]
        assert piece.box == ((2, 4), (0, 4)) and piece.global_shape == (6, 4)
        del piece


@pytest.mark.parametrize("entry, message", [
    ({"global_shape": [6, 4]}, "global_shape and offsets together"),
    ({"global_shape": [6, 4], "offsets": [5, 0]}, "does not fit in global_shape"),
    ({"global_shape": [6], "offsets": [0]}, "a list of 2 sizes"),
    ({"global_shape": [6, 4], "offsets": [0, -1]}, "an integer in 0"),
])
def test_hostile_boxes_in_spool_headers_are_refused(tmp_path, entry, message):
    path = tmp_path / "g.spool"
    write_spool(path, 1, {"w": np.zeros((2, 4), np.float32)}, {"ts": "2026-01-02T03:04:05Z"})
    data = path.read_bytes()
    header = data.split(b"\n")[1]
    extra = ",".join(f'"{k}":{v}' for k, v in entry.items()).replace("'", '"').encode()
    forged = header.replace(b'"dtype"', extra + b',"dtype"', 1)
    path.write_bytes(data.replace(header, forged, 1))
    with pytest.raises(FormatError, match=message):
        Spool(path)


def test_rank_and_world_come_from_arguments_or_torch_distributed(tmp_path):
    assert resolve_rank(None, None) == (0, 1)   # torch.distributed not initialised here
    assert resolve_rank(3, 4) == (3, 4)
    for args, message in [((1, None), "together"), ((4, 4), "0 <= rank < world_size"),
                          ((True, 2), "rank must be an int")]:
        with pytest.raises(DataError, match=message):
            resolve_rank(*args)
    line = format_record(REQ, 1, {"w": "3", "world": 4, "pid": 9})
    assert b"w=3 world=4 pid=9" in line


@pytest.mark.parametrize("cluster, message", [
    ({"world_size": 4, "ranks": "0-1"}, "cluster.node: this daemon serves ranks"),
    ({"world_size": 4, "ranks": "3-5"}, "cluster.ranks: 3-5 is not a range within 0..3"),
    ({"world_size": 4, "ranks": "a"}, "cluster.ranks: expected ranks like"),
    ({"world_size": 4, "ranks": "\u0661-\u0662"}, "cluster.ranks: expected ranks like"),
    ({"world_size": 2, "node": "a"}, "cluster.committer: give node and committer together"),
    ({"world_size": 2, "ranks": "0", "node": "a", "committer": "a"}, "cluster.remote"),
    ({"world_size": 2, "node": "a b", "committer": "a"}, "cluster.node: expected"),
    ({"world_size": 2, "ranks": "0", "node": "a", "committer": "a", "hmac": ""},
     "seal.hmac_key: nodes authenticate their parts"),
])
def test_cluster_config_is_checked_as_a_whole(cluster, message):
    cluster = dict(cluster)
    key = {"seal.hmac_key": cluster.pop("hmac", "keys/hmac.key")}
    config = load_config(env={}, overrides={f"cluster.{k}": v for k, v in cluster.items()}
                         | key)
    with pytest.raises(ConfigError, match=message):
        Cluster.from_config(config)
    ok = Cluster.from_config(load_config(env={}, overrides={
        "cluster.world_size": 4, "cluster.ranks": "2,3", "cluster.node": "b",
        "cluster.committer": "a", "repo.remote": "origin=/x.git",
        "seal.hmac_key": "keys/hmac.key"}))
    assert ok.local == {2, 3} and not ok.committer and ok.remote.name == "origin"
    assert ok.wal_scope()["expect"] == frozenset("23")


def test_daemon_status_reads_a_multi_rank_spool(tmp_path, capsys):
    import json

    from snapops.cli import main

    path = tmp_path / "spool" / "wal.log"
    path.parent.mkdir()
    for rank in "01":
        append(path, rank, REQ, 3, world=3)
    append(path, "daemon", DROPPED, 3, reason="missing_ranks", missing="2", error="late")
    config = tmp_path / "snapops.toml"
    config.write_text("[cluster]\nworld_size = 3\n")
    assert main(["daemon", "status", "--config", str(config), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["dropped_details"][0]["missing"] == "2" and status["wal_rejected"] == 0
    config.write_text("[cluster]\nworld_size = 3\nranks = \"0-1\"\n")
    assert main(["daemon", "status", "--config", str(config)]) == 2
    assert "cluster.node" in capsys.readouterr().err
