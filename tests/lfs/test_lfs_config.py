"""LFS-store configuration: keys, endpoint discovery, refusals, the committed files."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from snapops.config.loader import load_config
from snapops.config.schema import RemoteConfig
from snapops.daemon.lfsstore import lfs_endpoint, lfs_token, write_lfs_files
from snapops.formats.errors import ConfigError, FormatError
from snapops.formats.lfs.access import FROM_TREE, token_for, url_host
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


def test_a_planted_lfsconfig_is_replaced_not_read_or_written_through(tmp_path):
    """The daemon's work repository holds what the remote's tree holds: its .lfsconfig may
    be a symlink to a huge file or a FIFO. It is replaced by the daemon's own, and the file
    it pointed to is neither read whole nor written."""
    repo = tmp_path / "repo"
    repo.mkdir()
    huge, fifo = tmp_path / "huge", tmp_path / "fifo"
    with open(huge, "wb") as f:
        f.truncate(8 << 30)
    os.mkfifo(fifo)
    child = textwrap.dedent("""
        import dataclasses, pathlib, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # the file is 8 GiB
        from snapops.config.loader import load_config
        from snapops.daemon.lfsstore import write_lfs_files
        cfg = load_config(env={}, overrides={"repo.store": "lfs", "repo.lfs_url":
                                              "https://lfs.example/o/r.git/info/lfs"})
        repo = pathlib.Path(sys.argv[1])
        print(write_lfs_files(repo, dataclasses.replace(cfg, base_dir=str(repo))))
        """)
    for target in (huge, fifo):
        (repo / ".lfsconfig").unlink(missing_ok=True)
        (repo / ".lfsconfig").symlink_to(target)
        proc = subprocess.run([sys.executable, "-c", child, str(repo)], capture_output=True,
                              text=True, timeout=60)
        assert proc.stdout == "['.gitattributes', '.lfsconfig']\n", proc.stderr[-500:]
        assert not (repo / ".lfsconfig").is_symlink()
        assert (repo / ".lfsconfig").read_text() == \
            "[lfs]\n\turl = https://lfs.example/o/r.git/info/lfs\n"
    assert huge.stat().st_size == 8 << 30 and stat.S_ISFIFO(fifo.stat().st_mode)


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


@pytest.mark.parametrize("url,host", [
    ("https://Git.Example:8443/o/r.git", "git.example"), ("git://127.0.0.1/r.git", "127.0.0.1"),
    ("ssh://me@git.example/r", "git.example"), ("me@git.example:o/r.git", "git.example"),
    ("git.example:o/r.git", "git.example"), ("/srv/git/r.git", None), ("file:///srv/r", None),
    ("../r.git", None), ("", None), (None, None),
])
def test_url_host_of_remotes_and_endpoints(url, host):
    assert url_host(url) == host


def test_the_token_goes_to_a_tree_endpoint_only_on_the_remotes_host():
    endpoint = "https://lfs.example/o/r.git/info/lfs"
    named, derived = "--lfs-url", "derived from https://lfs.example/o/r"
    for origin in (named, derived):           # the user named it, or it is the remote's own
        assert token_for("tok", endpoint, origin, "git://elsewhere/r.git") == "tok"
    for remote in ("https://LFS.example/o/r", "/srv/git/r.git", None):
        assert token_for("tok", endpoint, FROM_TREE, remote) == "tok"
    assert token_for(None, endpoint, FROM_TREE, "https://elsewhere/r") is None
    with pytest.raises(ConfigError, match=r"lfs\.example/o/r\.git/info/lfs', not on the remote's "
                                          r"host elsewhere: .*expected --lfs-url") as raised:
        token_for("tok-secret", endpoint, FROM_TREE, "https://elsewhere/o/r")
    assert "tok-secret" not in str(raised.value)
    with pytest.raises(ConfigError, match=r"https://\*\*\*@evil\.example"):
        token_for("tok", "https://user:pw@evil.example/lfs", FROM_TREE, "me@git.example:r")
