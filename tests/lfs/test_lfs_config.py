"""LFS-store configuration: keys, endpoint discovery, refusals, the committed files."""

from __future__ import annotations

import dataclasses

import pytest
from snapops.config.loader import load_config
from snapops.config.schema import RemoteConfig
from snapops.daemon.lfsstore import lfs_endpoint, lfs_token, write_lfs_files
from snapops.formats.errors import ConfigError, FormatError
from snapops.formats.generation.manifest import (
    Header,
    Manifest,
    ShardRecord,
    check_structure,
)

H = "a" * 64


def test_defaults_keep_the_git_store():
    repo = load_config(env={}).repo
    assert (repo.store, repo.lfs_url, repo.lfs_token_file, repo.keyframe_every) == \
        ("git", "", "", 8)


def test_endpoint_discovery_and_refusals(tmp_path):
    cfg = load_config(env={}, overrides={"repo.store": "lfs", "repo.remotes": (
        RemoteConfig("origin", "https://git.example/org/weights"),)})
    assert lfs_endpoint(cfg) == "https://git.example/org/weights.git/info/lfs"
    local = dataclasses.replace(cfg, repo=dataclasses.replace(cfg.repo, remotes=()))
    with pytest.raises(ConfigError, match="lfs_url"):
        lfs_endpoint(local)
    with pytest.raises(ConfigError, match="snapshot.delta"):
        load_config(env={}, overrides={"repo.store": "lfs", "snapshot.delta": True})
    with pytest.raises(ConfigError, match="repo.store"):
        load_config(env={}, overrides={"repo.store": "s3"})
    with pytest.raises(ConfigError, match="keyframe_every"):
        load_config(env={}, overrides={"repo.keyframe_every": 0})


def test_token_file_is_one_line_and_never_in_committed_files(tmp_path):
    (tmp_path / "tok").write_text("secret-token\n")
    cfg = load_config(env={}, overrides={"repo.store": "lfs", "repo.lfs_token_file": "tok",
                                         "repo.lfs_url": "https://lfs.example/o/r.git/info/lfs"})
    cfg = dataclasses.replace(cfg, base_dir=str(tmp_path))
    assert lfs_token(cfg) == "secret-token"
    assert write_lfs_files(tmp_path, cfg) == [".gitattributes", ".lfsconfig"]
    assert "filter=lfs diff=lfs merge=lfs -text" in (tmp_path / ".gitattributes").read_text()
    assert (tmp_path / ".lfsconfig").read_text() == \
        "[lfs]\n\turl = https://lfs.example/o/r.git/info/lfs\n"
    (tmp_path / "tok").write_text("two words\n")
    with pytest.raises(ConfigError, match="one line"):
        lfs_token(cfg)
    leaky = dataclasses.replace(cfg, repo=dataclasses.replace(
        cfg.repo, lfs_url="https://user:pw@lfs.example/o/r.git/info/lfs"))
    (tmp_path / ".lfsconfig").unlink()
    assert write_lfs_files(tmp_path, leaky) == [".gitattributes"]
    assert not (tmp_path / ".lfsconfig").exists()


@pytest.mark.parametrize("store,fields,ok", [
    ("git", dict(), True),
    ("git", dict(object=H, object_size=1, encoding="key"), False),
    ("lfs", dict(object="b" * 64, object_size=1, encoding="key"), False),   # key is the shard
    ("lfs", dict(object=H, object_size=10, encoding="key"), True),
    ("lfs", dict(object="b" * 64, object_size=3, encoding="res"), False),  # no base
    ("lfs", dict(object="b" * 64, object_size=3, encoding="res", base=1), True),
    ("lfs", dict(), False),
])
def test_manifest_structure_ties_lfs_fields_to_the_store(store, fields, ok):
    m = Manifest(Header("r", 2, "2026-01-02T03:04:05Z", "b", "aero", store))
    m.shards.append(ShardRecord("shards/0000.aero", "aero", 10, H, 2, H, **fields))
    if ok:
        check_structure(m)
    else:
        with pytest.raises(FormatError, match="structure|LFS|keyframe"):
            check_structure(m)
