"""Restore and resume end to end: torch state_dicts (f32, bf16, f16, int64, dotted names) go
through a real daemon to a real bare remote for every generation format, and come back from
the URL (``git daemon`` on 127.0.0.1 and ``file://``) with ``snapops restore`` and
``snapops.torch.load_state_dict``: equal tensors, equal dtypes. A tampered newest generation is
skipped by ``--latest-verified`` with its reason; hostile names fail with one line."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import snapops
import snapops.torch
from snapops.cli import main
from snapops.formats.errors import ConfigError
from snapops.remote import open_repository
from snapops.restore import RestoreFailed

from ..daemon.daemon_env import DaemonEnv
from ..daemon.gitserve import GitDaemon, git, init_bare

FORMATS = ("wtxt", "aero", "fold", "pycauset", "finf")
RUN = "t"


def torch_state(gen: int) -> dict[str, torch.Tensor]:
    """A small model state: every dtype a training state holds, torch's dotted names."""
    g = torch.Generator().manual_seed(gen)
    return {
        "blocks.0.attn.in_proj_weight": torch.randn(24, 8, generator=g),
        "blocks.0.attn.in_proj_bias": torch.randn(24, generator=g).to(torch.bfloat16),
        "emb.weight": torch.randn(40, 8, generator=g).to(torch.bfloat16),
        "lnf.weight": torch.ones(8, dtype=torch.float16) + gen,
        "head.bias": torch.randn(5, generator=g).to(torch.float64),
        "mask.keep": torch.arange(6) % 2 == 0,
        "step": torch.tensor(100 * gen, dtype=torch.int64),
        "mx.w": torch.randint(0, 256, (4, 8), generator=g, dtype=torch.uint8)
                     .view(torch.float8_e4m3fn),
        "mx.scale": torch.arange(gen, gen + 4, dtype=torch.uint8).view(torch.float8_e8m0fnu),
        "fft.coef": torch.randn(3, generator=g, dtype=torch.complex64),
    }


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        bits = (lambda t: t.view(torch.uint8)) if tensor.dtype.itemsize == 1 else (lambda t: t)
        assert got[name].shape == tensor.shape and torch.equal(bits(got[name]), bits(tensor)), \
            name


@pytest.fixture(scope="module")
def remotes(tmp_path_factory):
    """One daemon per format, all at once, each pushing generations 1 and 2 to its own bare
    remote under a folder a ``git daemon`` serves. Yields (GitDaemon, base folder)."""
    root = tmp_path_factory.mktemp("restore")
    base = root / "served"
    base.mkdir()
    envs = []
    for fmt in FORMATS:
        bare = init_bare(base / f"{fmt}.git")
        env = DaemonEnv(root / fmt, {"origin": str(bare)}, fmt=fmt)
        (root / fmt).mkdir(exist_ok=True)
        envs.append(env)
    try:
        for env in envs:
            env.start()
        for env in envs:
            with env.client(policy="block") as client:
                for gen in (1, 2):
                    client.request(torch_state(gen), gen)
        for env in envs:
            env.wait(lambda env=env: env.all_pushed() and len(env.state().gens) == 2,
                     what="generations 1 and 2 pushed")
    finally:
        for env in envs:
            env.terminate()
    served = GitDaemon(base)
    served.start()
    try:
        yield served, base
    finally:
        served.stop()


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_restores_bit_exact_from_the_remote(remotes, fmt, tmp_path):
    served, base = remotes
    url = served.url(f"{fmt}.git") if fmt in ("wtxt", "fold") else f"file://{base}/{fmt}.git"
    for suffix in (".pt", ".safetensors"):
        out = tmp_path / f"gen1{suffix}"
        assert main(["restore", url, "--run", RUN, "--gen", "1", "-o", str(out)]) == 0
        assert_same(snapops.torch.to_state_dict(snapops.load(out)), torch_state(1))
    newest = snapops.torch.load_state_dict(url, RUN)           # default branch: generation 2
    assert_same(newest, torch_state(2))
    by_rev = snapops.load_generation(url, RUN, rev=f"{RUN}/gen-000001")
    assert by_rev.meta["gen"] == 1 and by_rev.meta["format"] == fmt
    assert_same(snapops.torch.to_state_dict(by_rev), torch_state(1))


def test_restore_cli_prints_one_summary_line(remotes, tmp_path, capsys):
    served, _ = remotes
    out = tmp_path / "gen2.pt"
    assert main(["restore", served.url("aero.git"), "--run", RUN, "--gen", "2", "-o",
                 str(out)]) == 0
    line, = capsys.readouterr().out.splitlines()
    assert line.startswith("restored run t gen 2 (verified;") and "MB/s" in line, line
    assert_same(torch.load(out, weights_only=True), torch_state(2))


def test_a_url_gets_one_shallow_commit_and_nothing_is_left_behind(remotes, tmp_path,
                                                                   monkeypatch):
    served, _ = remotes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with open_repository(served.url("wtxt.git")) as repo:
        assert repo.generations(RUN) == [2, 1]
        with repo.tree(RUN, gen=1) as (source, where):
            assert "tag t/gen-000001" in where
            assert source.entries("snapshots/t")
            fetched = git("rev-list", "--all", "--count", cwd=repo.git.cwd)
            assert fetched == "1", "a shallow fetch of one commit, not the history"
            assert (Path(repo.git.cwd) / "shallow").is_file()
    assert list(tmp_path.iterdir()) == []


def test_a_file_url_of_a_repository_on_this_machine_is_read_in_place(remotes, tmp_path,
                                                                    monkeypatch):
    """Spelled as git reads it (percent-encoded, ``localhost``), a ``file://`` URL naming a
    bare repository, a clone's top folder or its ``.git`` is read where it lies, as its path
    is: nothing is fetched, the restore is the same (committed objects, never the work
    tree's files); the URL is still the remote's (for LFS endpoint discovery). A folder
    inside a repository is not one: git's transport answers for it, as before."""
    _, base = remotes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spaced = tmp_path / "a remote"
    shutil.copytree(base / "aero.git", spaced)
    clone = tmp_path / "a clone"
    git("clone", "-q", str(spaced), str(clone))
    for shard in (clone / "snapshots" / RUN / "shards").iterdir():
        shard.write_bytes(b"edited in the work tree, not committed")
    for url, where in ((f"file://{spaced}", spaced),
                       (f"file://localhost{str(spaced).replace(' ', '%20')}/", spaced),
                       (f"file://{clone}", clone), (f"file://{clone}/.git", clone / ".git")):
        with open_repository(url) as repo:
            assert repo.url is None and Path(repo.git.cwd) == where, url
            assert repo.remote_url() == url and repo.generations(RUN) == [2, 1]
            private = [p for p in tmp_path.iterdir() if p.name.startswith("snapops-restore-")]
            assert [list(p.iterdir()) for p in private] == [[]], "no repository to fetch into"
        assert_same(snapops.torch.load_state_dict(url, RUN, gen=1), torch_state(1))
    for inside in (spaced / "refs", clone / "snapshots"):
        with pytest.raises(ConfigError, match=r"cannot list the tags of run t"):
            with open_repository(f"file://{inside}") as repo:
                repo.generations(RUN)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a clone", "a remote"]


def test_a_restore_whose_fetch_would_run_the_disk_low_fails_in_one_line(remotes, tmp_path,
                                                                       monkeypatch, capsys):
    """The fetch of a generation that would leave less free than the restore allows (set
    here just above what is free: any generation is too much) is stopped; the CLI says so in
    one line, writes nothing, and leaves no temporary repository."""
    import snapops.remote as remote

    served, _ = remotes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(remote, "fetch_floor", lambda folder: (
        str(folder), shutil.disk_usage(folder).free + (1 << 30)))
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "gen1.safetensors"
    assert main(["restore", served.url("wtxt.git"), "--run", RUN, "--gen", "1", "-o",
                 str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot fetch tag t/gen-000001" in err and \
        "MiB left free on the disk holding" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not out.exists()


def tampered_remote(base: Path, work: Path) -> str:
    """A copy of the AERO remote with a generation 3 on top: generation 2's MANIFEST, one
    shard byte rewritten, tagged ``t/gen-000003``."""
    remote = work / "tampered.git"
    git("clone", "-q", "--mirror", str(base / "aero.git"), str(remote))
    clone = work / "clone"
    git("clone", "-q", str(remote), str(clone))
    shard = sorted((clone / "snapshots" / RUN / "shards").iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    for args in (("add", "-A"), ("-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm",
                                 "gen 3"),
                 ("-c", "user.name=x", "-c", "user.email=x@x", "tag", "-a", "-m", "gen 3",
                  f"{RUN}/gen-000003"), ("push", "-q", "--follow-tags", "origin", "HEAD")):
        git(*args, cwd=clone)
    return f"file://{remote}"


def test_latest_verified_skips_a_tampered_newest_generation_and_says_why(remotes, tmp_path,
                                                                         capsys):
    _, base = remotes
    url = tampered_remote(base, tmp_path)
    with pytest.raises(RestoreFailed, match=r"\[digest\]"):
        snapops.load_generation(url, RUN, gen=3)
    snap, skipped = snapops.latest_verified(url, RUN)
    assert snap.meta["gen"] == 2 and [gen for gen, _ in skipped] == [3]
    assert "[digest]" in skipped[0][1] and "shards/" in skipped[0][1]
    out = tmp_path / "latest.safetensors"
    assert main(["restore", url, "--run", RUN, "--latest-verified", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipped gen 3:" in err and "[digest]" in err
    assert_same(snapops.torch.to_state_dict(snapops.load(out)), torch_state(2))


@pytest.mark.parametrize("args, says", [
    (["--run", "../x"], "not a run name"),
    (["--run", RUN, "--rev=-x"], "not an option"),
    (["--run", RUN, "--rev=--upload-pack=touch /tmp/pwned"], "not an option"),
    (["--run", RUN, "--rev", "main:refs/heads/x"], "a ref name"),
    (["--run", RUN, "--gen", "9"], "t/gen-000009"),
    (["--run", RUN, "-o", "/nonexistent/x.bin"], "unrecognised file type"),
])
def test_hostile_names_fail_with_one_line_and_write_nothing(remotes, tmp_path, args, says,
                                                            capsys):
    served, _ = remotes
    out = tmp_path / "x.pt"
    assert main(["restore", served.url("wtxt.git"), "-o", str(out), *args]) == 2
    line, = capsys.readouterr().err.splitlines()
    assert says in line and "Traceback" not in line
    assert not out.exists()


@pytest.mark.parametrize("flag, value, says", [
    ("--trusted-key", "nonexist/", "nonexist: public key: cannot read"),
    ("--hmac-key", "missing.key", "missing.key: HMAC key: cannot read"),
])
def test_an_unusable_key_file_is_a_usage_error_before_any_fetch(tmp_path, capsys, flag, value,
                                                                 says):
    out = tmp_path / "x.pt"
    assert main(["restore", "file:///nowhere.git", "-o", str(out), "--run", RUN,
                 flag, str(tmp_path / value)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()

def test_a_negative_generation_is_a_usage_error(tmp_path, capsys):
    out = tmp_path / "x.pt"
    with pytest.raises(SystemExit, match="^2$"):
        main(["restore", "file:///nowhere.git", "-o", str(out), "--run", RUN, "--gen", "-1"])
    assert "argument --gen: expected a generation number" in capsys.readouterr().err
    assert not out.exists()


def test_errors_name_the_url_without_its_secret(tmp_path):
    bare = init_bare(tmp_path / "empty.git")
    with pytest.raises(ConfigError, match=r"http://\*\*\*@") as err:
        snapops.load_generation("http://user:s3cret@127.0.0.1:1/x.git?token=abc", RUN)
    assert "s3cret" not in str(err.value) and "abc" not in str(err.value)
    assert "http://***@127.0.0.1:1/x.git?token=***" in str(err.value)
    with pytest.raises(RestoreFailed, match="no generation tag of run t"):
        snapops.latest_verified(bare, RUN)
    marker = tmp_path / "pwned"
    for hostile, says in ((f"ext::sh -c touch% {marker}", "not a repository"),
                          ("fd::17", "not a repository"),
                          ("foo://host/x.git", "unsupported URL scheme 'foo'"),
                          ("--upload-pack=touch x", "expected a repository path or a URL")):
        with pytest.raises(ConfigError, match=says):
            snapops.load_generation(hostile, RUN)
    assert not marker.exists()
