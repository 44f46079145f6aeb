"""A restore proves each shard by the arrays it decodes: their BLAKE3 against the content
digest the sealed MANIFEST lists, instead of the shard file's SHA-256; whatever that cannot
prove is judged by the file's SHA-256, exactly as before."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

import snapops.formats.generation.verify as verify_module
from snapops.formats.errors import FormatError
from snapops.formats.generation import parse_manifest
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.plan import content_digest
from snapops.formats.generation.source import FolderSource, GitTreeSource
from snapops.formats.generation.verify import verify_generation
from snapops.formats.keys import generate_keys
from snapops.hooks.gitio import Git

from .test_generation import FORMATS, TS, commit_gen, opts, spec, state


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    generate_keys(folder)
    return folder


def mixed_state() -> dict[str, np.ndarray]:
    """Every kind of array a shard holds: split over shards (``shard_max`` 1024), bf16 and
    f16 (stored as unsigned by some formats), bool, a 0-d int64, and an empty array."""
    return {**state(), "empty": np.zeros((0, 4), np.float32)}


def big_shards(keys, fmt: str):
    return dataclasses.replace(spec(keys, fmt), shard_max=1 << 20)


def shard_digests(monkeypatch) -> list[str]:
    """The paths whose SHA-256 the verifier computes from now on."""
    hashed: list[str] = []
    real = verify_module.file_sha256

    def recording(path):
        hashed.append(str(path))
        return real(path)

    monkeypatch.setattr(verify_module, "file_sha256", recording)
    return hashed


def shard_files(repo) -> list:
    return sorted(p for p in (repo / "snapshots/run1/shards").iterdir()
                  if not p.name.endswith(".wsum"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_restores_proven_by_content_without_hashing_a_shard(
        tmp_path, keys, fmt, monkeypatch):
    arrays = mixed_state()
    commit_gen(tmp_path, spec(keys, fmt), 1, arrays)
    hashed = shard_digests(monkeypatch)
    snap = load_from_source(FolderSource(tmp_path), "run1", options=opts(keys))
    assert [p for p in hashed if not p.endswith(".wsum")] == []
    for name, array in arrays.items():
        assert snap[name].dtype == array.dtype and snap[name].shape == array.shape, name
        assert snap[name].tobytes() == array.tobytes(), name
    report = verify_generation(FolderSource(tmp_path), "run1", opts(keys))
    assert report.ok and "shards_by_content" not in report.details   # verify hashes files


def test_a_git_restore_copies_shards_out_without_hashing_them(tmp_path, keys, monkeypatch):
    import subprocess

    from snapops.formats.generation import source as generation_source

    monkeypatch.setattr(generation_source, "PREREAD_FILE", 0)   # copied as large shards are

    repo = tmp_path / "repo"
    arrays = mixed_state()
    commit_gen(repo, spec(keys, "aero"), 1, arrays)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", "gen 1"], check=True)
    asked: list[bool] = []

    class RecordingGit(Git):
        def blob_to(self, oid, out, **kw):
            asked.append(kw.get("sha256", True))
            return super().blob_to(oid, out, **kw)

    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    source = GitTreeSource(RecordingGit(repo), "HEAD", scratch, keep=True)
    snap = load_from_source(source, "run1", options=opts(keys))
    shards = parse_manifest((repo / "snapshots/run1/MANIFEST").read_bytes()).shards
    assert asked == [False] * len(shards)
    assert all(snap[n].tobytes() == a.tobytes() for n, a in arrays.items())


@pytest.mark.parametrize("fmt", ["wtxt", "aero", "fold"])
def test_a_shard_with_one_bit_flipped_in_its_numbers_fails_by_its_digest(tmp_path, keys,
                                                                         fmt):
    """The decoder reads the altered copy without complaint, its arrays do not hash to the
    sealed content digest, and the file's SHA-256 then names the failure, as verify does."""
    arrays = {"w": np.arange(4096, dtype=np.float32).reshape(256, 16)}
    commit_gen(tmp_path, big_shards(keys, fmt), 1, arrays)
    shard = shard_files(tmp_path)[0]
    data = bytearray(shard.read_bytes())
    at = {"aero": data.rfind(np.float32(4000).tobytes()), "wtxt": data.rfind(b"AAA"),
          "fold": len(data) // 2}[fmt]                 # FOLD compresses: anywhere inside
    assert at > 0
    data[at] ^= 0x02 if fmt == "wtxt" else 0x01        # 'A' -> 'C': still base64
    shard.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"\[digest\] file bytes do not match") as raised:
        load_from_source(FolderSource(tmp_path), "run1", options=opts(keys))
    assert str(raised.value) == str(verify_generation(FolderSource(tmp_path), "run1",
                                                      opts(keys)).failure)


def test_a_content_digest_the_loader_cannot_reproduce_falls_back_to_the_file_digest(
        tmp_path, keys, monkeypatch):
    """Big-endian arrays: the writer's content digest covers their big-endian bytes, the
    shard holds little-endian ones. The sealed file is then proven by its SHA-256, and the
    values come back exact."""
    arrays = {"w": np.arange(600, dtype=">f4").reshape(30, 20)}
    written = commit_gen(tmp_path, big_shards(keys, "aero"), 1, arrays)
    (record,) = written.manifest.shards
    assert record.content == content_digest(arrays)
    hashed = shard_digests(monkeypatch)
    snap = load_from_source(FolderSource(tmp_path), "run1", options=opts(keys))
    assert [p for p in hashed if p.endswith(record.path)] != []
    assert snap["w"].dtype == np.dtype("<f4")
    assert np.array_equal(snap["w"], arrays["w"]) and snap["w"].shape == (30, 20)


def test_a_file_altered_outside_its_arrays_still_restores_them_and_fails_verify(tmp_path,
                                                                              keys):
    """What a restore returns is the arrays, and those are proven against the sealed
    MANIFEST; the file itself is not the sealed one, which ``verify`` (hooks, CI) reports."""
    arrays = {"w": np.arange(600, dtype=np.float32).reshape(30, 20)}
    commit_gen(tmp_path, big_shards(keys, "wtxt"), 1, arrays)
    shard = shard_files(tmp_path)[0]
    data = shard.read_bytes()
    assert data.count(TS.encode()) == 1
    shard.write_bytes(data.replace(TS.encode(), TS.replace(":05Z", ":06Z").encode()))
    restore = opts(keys, deep=False)                   # what `snapops restore` checks
    snap = load_from_source(FolderSource(tmp_path), "run1", options=restore)
    assert snap["w"].tobytes() == arrays["w"].tobytes()
    failure = verify_generation(FolderSource(tmp_path), "run1", opts(keys)).failure
    assert failure.check == "digest" and failure.path.endswith(shard.name)
    assert hashlib.sha256(shard.read_bytes()).hexdigest() in str(failure)


@pytest.mark.parametrize("hook", ["by_content", "on_shard", "memo"])
def test_the_loaders_own_hooks_are_not_restore_options(hook):
    from snapops.formats.errors import DataError
    from snapops.restore import generation_options

    with pytest.raises(DataError, match=f"unknown option '{hook}'; allowed: deep, "):
        generation_options(**{hook: lambda *a: True})
    assert generation_options(deep=True).by_content is None
