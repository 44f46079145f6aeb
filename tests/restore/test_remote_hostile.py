"""Restoring from a remote someone else controls: a server that accepts the connection and
then says nothing, generation tags on trees and blobs, hundreds of bogus tags above the real
generations, and a SIGTERM in the middle of a fetch. Real git repositories, ``file://`` URLs
and a real TCP port on 127.0.0.1 that never answers; every failure is one typed line and the
private temporary repository is gone afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import snapops
import snapops.remote
import snapops.restore
from snapops.cli import main
from snapops.formats.errors import ConfigError
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
from snapops.restore import RestoreFailed

from ..daemon.gitserve import git, silent_server  # noqa: F401  (a fixture)

RUN = "t"
COMMIT = ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm")


def sealed_repo(path: Path, gens=(1, 2)) -> Path:
    """A work tree with generations ``gens`` of run ``t`` committed and tagged, as the daemon
    leaves them (unsigned WTXT, sealed in the ledger)."""
    git("init", "-q", "-b", "main", str(path))
    spec, previous = GenerationSpec(run=RUN, format="wtxt", build="t"), None
    for gen in gens:
        written = write_generation(path, spec, gen, "2026-01-02T03:04:05Z",
                                   {"w": np.arange(4, dtype=np.float32) + gen}, previous)
        seal_in_ledger(path, RUN, written)
        previous = written.data
        git("add", "-A", cwd=path)
        git(*COMMIT, f"gen {gen}", cwd=path)
        git("tag", f"{RUN}/gen-{gen:06d}", cwd=path)
    return path


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """The temporary folder the restore's private repository goes to (empty again after)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def list_tags(url: str) -> list[int]:
    with snapops.remote.open_repository(url) as repo:
        return repo.generations(RUN)


def fetch_gen_1(url: str) -> None:
    snapops.load_generation(url, RUN, gen=1)


@pytest.mark.parametrize("url, call", [("git://127.0.0.1:{port}/x.git", list_tags),
                                       ("http://u:s3cret@127.0.0.1:{port}/x.git", fetch_gen_1)])
def test_a_remote_that_never_answers_is_a_stall_error_not_a_hang(
        silent_server, private_tmp, monkeypatch, url, call):  # noqa: F811
    monkeypatch.setattr(snapops.remote, "STALL_SECONDS", 1.0)
    url = url.format(port=silent_server)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1.*stalled: no progress for 1 s") as err:
        call(url)
    assert time.monotonic() - start < 20
    assert "s3cret" not in str(err.value) and "\n" not in str(err.value)
    assert list(private_tmp.iterdir()) == []


def test_latest_verified_skips_generation_tags_on_a_tree_or_a_blob(tmp_path):
    repo = sealed_repo(tmp_path / "repo")
    git("tag", f"{RUN}/gen-000010", "HEAD^{tree}", cwd=repo)
    git("tag", f"{RUN}/gen-000011", f"HEAD:snapshots/{RUN}/MANIFEST", cwd=repo)
    for where in (str(repo), f"file://{repo}"):
        snap, skipped = snapops.latest_verified(where, RUN)
        assert snap.meta["gen"] == 2 and [gen for gen, _ in skipped] == [11, 10]
        assert all("name" in why and "commit" in why for _, why in skipped), skipped


def test_latest_verified_gives_up_after_the_newest_max_tried_tags(tmp_path, monkeypatch,
                                                                    capsys):
    repo = sealed_repo(tmp_path / "repo")
    for gen in range(100, 105):     # gen 1's commit under five newer tags: none verifies
        git("tag", f"{RUN}/gen-{gen:06d}", f"{RUN}/gen-000001", cwd=repo)
    monkeypatch.setattr(snapops.restore, "MAX_TRIED", 3)
    out = tmp_path / "x.safetensors"
    assert main(["restore", f"file://{repo}", "--run", RUN, "--latest-verified",
                 "-o", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith(f"snapops restore: skipped gen {gen}: ")
                                 for line, gen in zip(err, (104, 103, 102))), err
    assert "none of the newest 3 generation tags of run t verifies; 4 older ones not tried " \
           "(from gen 101 down" in err[-1]
    assert not out.exists()
    with pytest.raises(RestoreFailed, match=r"none of the newest 3 .*4 older ones not tried"):
        snapops.latest_verified(str(repo), RUN)


def test_sigterm_during_a_fetch_removes_the_private_repository(silent_server,  # noqa: F811
                                                               tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "x.pt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "snapops", "restore", f"git://127.0.0.1:{silent_server}/x.git",
         "--run", RUN, "--gen", "1", "-o", str(out)],
        env={**os.environ, "TMPDIR": str(scratch)}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not list(scratch.glob("snapops-restore-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(scratch.glob("snapops-restore-*")), "the restore never started its fetch"
        time.sleep(0.3)             # git fetch is waiting on the silent server now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert list(scratch.iterdir()) == [] and not out.exists()
