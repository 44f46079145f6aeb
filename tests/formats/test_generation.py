"""Sealed generations end to end: write, verify (every rule), load (exact dtypes and names)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from snapops import save
from snapops.formats.errors import FormatError
from snapops.formats.generation import parse_manifest, seal_manifest
from snapops.formats.generation import source as generation_source
from snapops.formats.gitcmd import invocations
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.source import FolderSource, GitTreeSource, safe_relpath
from snapops.formats.generation.verify import GenerationOptions, verify_generation
from snapops.formats.integrity import file_sha256
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
from snapops.formats.keys import generate_keys, load_hmac_key
from snapops.hooks.gitio import Git

TS = "2026-01-02T03:04:05Z"
FORMATS = ["wtxt", "fold", "aero", "pycauset", "finf"]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    generate_keys(folder)
    return folder


def state(gen: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "blocks.0.attn.in_proj_weight": rng.standard_normal((48, 16)).astype(np.float32),
        "emb.weight": rng.standard_normal((40, 8)).astype(ml_dtypes.bfloat16),
        "lnf.bias": rng.standard_normal(8).astype(np.float16),
        "mask": np.array([True, False, True]),
        "step": np.array(gen, np.int64),
    }


def spec(keys: Path, fmt: str = "wtxt", **extra) -> GenerationSpec:
    return GenerationSpec(run="run1", format=fmt, shard_max=1024, build="b1",
                          sign_key=keys / "signing.key", hmac_key=load_hmac_key(keys / "hmac.key"),
                          **extra)


def opts(keys: Path, **extra) -> GenerationOptions:
    return GenerationOptions(trusted_keys=[keys], hmac_key=keys / "hmac.key",
                             require_signature=True, require_hmac=True, **extra)


def commit_gen(repo: Path, sp: GenerationSpec, gen: int, arrays, previous=None):
    written = write_generation(repo, sp, gen, TS, arrays, previous)
    seal_in_ledger(repo, sp.run, written)
    return written


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_format_exact_dtypes_and_names(tmp_path, keys, fmt):
    arrays = state()
    written = commit_gen(tmp_path, spec(keys, fmt), 1, arrays)
    report = verify_generation(FolderSource(tmp_path), "run1", opts(keys, expect_prev=None))
    assert report.ok, report.failure
    assert report.details["gen"] == 1 and report.arrays > 0
    snap = load_from_source(FolderSource(tmp_path), "run1", options=opts(keys))
    assert sorted(snap.arrays) == sorted(arrays)
    for name, array in arrays.items():
        assert snap[name].dtype == array.dtype, name
        assert snap[name].shape == array.shape and snap[name].tobytes() == array.tobytes(), name
    records = {a.name: a for a in written.manifest.arrays}
    emb = records["emb.weight"]
    assert emb.dtype == "bf16" and emb.stored == ("u16" if fmt in ("wtxt", "finf") else None)
    assert len(records["blocks.0.attn.in_proj_weight"].parts) == 3  # 3 KiB over 1 KiB shards
    assert snap.meta["gen"] == 1 and snap.meta["keyid"] == written.manifest.header.keyid



class _CountingSource(FolderSource):
    """A folder whose shard files are handed out slowly, counting how many at once."""

    def __init__(self, root, shards_at_once):
        super().__init__(root)
        self.shards_at_once, self.open, self.most = shards_at_once, 0, 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def file(self, path, **kw):
        with self._lock:
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            time.sleep(0.02)
            with super().file(path, **kw) as local:
                yield local
        finally:
            with self._lock:
                self.open -= 1


@pytest.mark.parametrize("at_once", [1, 2])
def test_a_source_that_rebuilds_shards_bounds_how_many_are_checked_at_once(tmp_path, keys,
                                                                            at_once):
    """An LFS source rebuilds each shard on decoding helpers of its own and asks for two at
    a time (``shards_at_once``); the verifier's own limit (3) applies to the others."""
    commit_gen(tmp_path, spec(keys, "aero"), 1, state())
    source = _CountingSource(tmp_path, at_once)
    snap = load_from_source(source, "run1", options=opts(keys, workers=3))
    assert snap["step"].tolist() == 1
    assert source.most == at_once


@pytest.mark.parametrize("fmt", ["wtxt", "aero"])
def test_parts_decoded_side_by_side_land_in_their_arrays(tmp_path, keys, fmt):
    """Each verify worker decodes the shard it has just checked, several at a time: arrays
    cut into many parts over many shards come back whole and exact, whichever worker placed
    which part first, with one worker as with four."""
    rng = np.random.default_rng(11)
    arrays = {f"layer.{k}.weight": rng.standard_normal((64, 24)).astype(np.float32)
              for k in range(6)}
    arrays["tok.bf16"] = rng.standard_normal((192, 8)).astype(ml_dtypes.bfloat16)
    written = commit_gen(tmp_path, spec(keys, fmt), 1, arrays)
    assert len(written.manifest.shards) >= 20
    assert all(len(a.parts) >= 3 for a in written.manifest.arrays)
    for workers in (1, 4):
        for _ in range(3):
            snap = load_from_source(FolderSource(tmp_path), "run1",
                                    options=opts(keys, workers=workers))
            for name, array in arrays.items():
                assert snap[name].dtype == array.dtype, name
                assert snap[name].tobytes() == array.tobytes(), name


def test_a_shard_that_fails_to_decode_ends_the_load_with_its_error(tmp_path, keys,
                                                                     monkeypatch):
    """A decoding failure on one of the workers (the generation itself verifies) is the
    error raised once the verification is done; no shard is decoded after it, and nothing
    half-loaded comes back."""
    import snapops.formats.generation.load as load_module

    rng = np.random.default_rng(5)
    arrays = {f"w{k}": rng.standard_normal((64, 16)).astype(np.float32) for k in range(8)}
    written = commit_gen(tmp_path, spec(keys, "aero"), 1, arrays)
    assert len(written.manifest.shards) >= 16
    real, calls = load_module._load_shard, []

    def failing_third(local, fmt, verify):
        calls.append(local)
        if len(calls) == 3:
            raise FormatError("injected decoding failure", path=str(local))
        return real(local, fmt, verify)

    monkeypatch.setattr(load_module, "_load_shard", failing_third)
    with pytest.raises(FormatError, match="injected decoding failure") as failed:
        load_from_source(FolderSource(tmp_path), "run1", options=opts(keys, workers=1))
    assert len(calls) == 3       # one worker: the shards after the failure were not decoded
    # named by its path in the tree, as every other finding about a generation is
    shard = Path(calls[2]).relative_to(tmp_path).as_posix()
    assert failed.value.path == shard and str(failed.value).startswith(f"{shard}:")

def test_deterministic_and_unchanged_shards_are_reused(tmp_path, keys):
    a, b = tmp_path / "a", tmp_path / "b"
    first = commit_gen(a, spec(keys), 1, state(1))
    assert commit_gen(b, spec(keys), 1, state(1)).data == first.data
    second = commit_gen(a, spec(keys), 2, state(2), first.data)
    gens = {s.path: s.gen for s in second.manifest.shards}
    assert set(gens.values()) == {1, 2}  # only the shard holding `step` was rewritten
    assert second.manifest.prev.sha256 == hashlib.sha256(first.data).hexdigest()
    assert all(p.startswith("snapshots/run1/") for p in second.paths)
    assert verify_generation(FolderSource(a), "run1", opts(keys, expect_prev=first.data)).ok


def test_age_shards_checked_by_digest_without_identity(tmp_path, keys):
    recipient = (keys / "age.pub").read_text().strip()
    commit_gen(tmp_path, spec(keys, "aero", recipients=(recipient,)), 1, state())
    plain = verify_generation(FolderSource(tmp_path), "run1", opts(keys))
    assert plain.ok and any("encrypted; checked by its digest only" in n for n in plain.notes)
    full = verify_generation(FolderSource(tmp_path), "run1", opts(keys, identity=keys / "age.key"))
    assert full.ok and not any("digest only" in n for n in full.notes)
    snap = load_from_source(FolderSource(tmp_path), "run1",
                            options=opts(keys, identity=keys / "age.key"))
    assert snap["emb.weight"].dtype == ml_dtypes.bfloat16


def test_streaming_wsum_and_delta_companions(tmp_path, keys):
    sp = spec(keys, streaming_threshold=500, delta=True)
    first = commit_gen(tmp_path, sp, 1, state(1))
    roles = {f.role for f in first.manifest.files}
    assert roles == {"wsum"}
    folder = tmp_path / "snapshots/run1"
    wsum = next(f for f in first.manifest.files if f.role == "wsum")
    os.unlink(folder / wsum.path)
    report = verify_generation(FolderSource(tmp_path), "run1", opts(keys))
    assert not report.ok and report.failure.check == "fileset"
    assert "missing" in str(report.failure)


def _gen_with(tmp_path, keys, fmt="wtxt"):
    commit_gen(tmp_path, spec(keys, fmt), 1, state())
    return tmp_path / "snapshots/run1"


@pytest.mark.parametrize("attack,check,message", [
    (lambda f: (f / "shards/evil.wtxt").write_bytes(b"WTXT 1\n"), "fileset", "does not list"),
    (lambda f: os.unlink(f / "shards/0000.wtxt"), "fileset", "missing"),
    (lambda f: (os.unlink(f / "shards/0000.wtxt"), os.symlink("0001.wtxt", f / "shards/0000.wtxt")),
     "fileset", "symlink"),
    (lambda f: (f / "shards/0000.wtxt").write_bytes(
        (f / "shards/0000.wtxt").read_bytes().replace(b"build=b1", b"build=b2")), "digest",
     "do not match"),
    (lambda f: (f / "MANIFEST").write_bytes(
        (f / "MANIFEST").read_bytes().replace(b"norm=", b"norm=1", 1)),
     "canonical|grammar|signature",
     ""),
])
def test_tampering_is_refused(tmp_path, keys, attack, check, message):
    folder = _gen_with(tmp_path, keys)
    attack(folder)
    report = verify_generation(FolderSource(tmp_path), "run1", opts(keys))
    assert not report.ok
    assert report.failure.check in check.split("|"), report.failure
    assert message in str(report.failure)


def test_a_fold_file_under_a_wtxt_name_is_refused_even_with_a_matching_manifest(tmp_path, keys):
    """The attacker also edits the MANIFEST's digest: the seal catches it; and a MANIFEST
    sealed with that digest (a key leak) still fails on the format check."""
    folder = _gen_with(tmp_path, keys)
    target = folder / "shards/0000.wtxt"
    save(state(), tmp_path / "x.fold")
    shutil.copy(tmp_path / "x.fold", target)
    m = parse_manifest((folder / "MANIFEST").read_bytes())
    m.shards[0] = dataclasses.replace(m.shards[0], size=target.stat().st_size,
                                      sha256=file_sha256(target))
    (folder / "MANIFEST").write_bytes(m.render())
    report = verify_generation(FolderSource(tmp_path), "run1", opts(keys, ledger=False))
    assert report.failure.check == "signature"
    (folder / "MANIFEST").write_bytes(seal_manifest(m, keys / "signing.key",
                                                    load_hmac_key(keys / "hmac.key")).render())
    report = verify_generation(FolderSource(tmp_path), "run1", opts(keys, ledger=False))
    assert report.failure.check == "format" and "not its declared format" in str(report.failure)


def test_rollback_and_forged_ledger_line(tmp_path, keys):
    first = commit_gen(tmp_path, spec(keys), 1, state(1))
    old = {p: (tmp_path / p).read_bytes() for p in first.paths}
    second = commit_gen(tmp_path, spec(keys), 2, state(2), first.data)
    for path, data in old.items():  # put generation 1 back over generation 2
        (tmp_path / path).write_bytes(data)
    report = verify_generation(FolderSource(tmp_path), "run1", opts(keys, expect_prev=second.data))
    assert report.failure.check in ("ledger", "chain")
    report = verify_generation(FolderSource(tmp_path), "run1",
                               opts(keys, expect_prev=second.data, ledger=False))
    assert report.failure.check == "chain" and "rollback" in str(report.failure)


def test_untrusted_key_and_unsigned_generation(tmp_path, keys):
    other = tmp_path / "other"
    generate_keys(other)
    _gen_with(tmp_path, keys)
    report = verify_generation(FolderSource(tmp_path), "run1", opts(other))
    assert report.failure.check == "signature" and "not trusted" in str(report.failure)
    unsigned = tmp_path / "u"
    commit_gen(unsigned, GenerationSpec(run="run1", format="aero"), 1, state())
    report = verify_generation(FolderSource(unsigned), "run1", opts(keys))
    assert report.failure.check == "signature" and "not signed" in str(report.failure)
    assert verify_generation(FolderSource(unsigned), "run1").ok


def test_version_1_manifest_fails_closed(tmp_path):
    folder = tmp_path / "snapshots/run1"
    folder.mkdir(parents=True)
    (folder / "MANIFEST").write_bytes(b"SNAPOPS-MANIFEST 1\nrun=run1 gen=000001\nend\n")
    report = verify_generation(FolderSource(tmp_path), "run1")
    assert report.failure.check == "version" and "no seal" in str(report.failure)


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a//b", "a/./b", ".git/hooks/x",
                                  "a/.GIT/x", "a\\b", "", "a/../../b"])
def test_unsafe_paths_refused(path):
    with pytest.raises(FormatError, match="unsafe path"):
        safe_relpath(path)


def in_git(repo, keys, fmt) -> None:
    """Generation 1 of ``fmt`` written into ``repo`` and committed there (a new repository)."""
    commit_gen(repo, spec(keys, fmt), 1, state())
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "gen 1"]):
        subprocess.run(["git", *args], cwd=repo, check=True)


def test_git_tree_source_matches_the_folder(tmp_path, keys):
    repo = tmp_path / "repo"
    in_git(repo, keys, "aero")
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    source = GitTreeSource(Git(repo), "HEAD", scratch)
    report = verify_generation(source, "run1", opts(keys))
    assert report.ok, report.failure
    assert list(scratch.rglob("*.aero")) == []  # materialised blobs are removed again
    opened: list[str] = []

    class CountingGit(Git):
        def open_blob(self, oid):
            opened.append(oid)
            return super().open_blob(oid)

        def small_blobs(self, specs, limit):
            opened.extend(specs)
            return super().small_blobs(specs, limit)

    counted = GitTreeSource(CountingGit(repo), "HEAD", scratch)
    manifest = counted.read("snapshots/run1/MANIFEST", 1 << 20)
    # read with the folder's other small files (these shards too), in one git process
    assert counted.read("snapshots/run1/MANIFEST", 1 << 20) == manifest
    assert len(opened) == len(set(opened)) == len(counted.entries("snapshots/run1"))
    with pytest.raises(FormatError, match="at most 10 bytes"):    # a kept read keeps limits
        counted.read("snapshots/run1/MANIFEST", 10)
    assert load_from_source(counted, "run1", options=opts(keys)).meta["gen"] == 1
    assert opened.count(opened[0]) == 1     # the MANIFEST came out of git once in all
    small = GitTreeSource(Git(repo), "HEAD", scratch, max_blob=100)
    report = verify_generation(small, "run1", opts(keys))
    assert report.failure.check == "limit" and "snapops.maxBlobSize" in str(report.failure)


def test_small_files_come_out_of_git_with_their_listing(tmp_path, keys, monkeypatch):
    """Listing a folder reads its files of at most PREREAD_FILE bytes in one cat-file
    (never more than PREREAD_MAX in all); reads and copies of them need no other git call,
    a copy's digest is the file's, and a larger file is copied out as before."""
    repo = tmp_path / "repo"
    in_git(repo, keys, "aero")
    folder = repo / "snapshots/run1"
    sizes = {f"snapshots/run1/{p.relative_to(folder)}": p.stat().st_size
             for p in folder.rglob("*") if p.is_file()}
    largest = max(sizes, key=sizes.get)
    monkeypatch.setattr(generation_source, "PREREAD_FILE", sizes[largest] - 1)
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    source = GitTreeSource(Git(repo), "HEAD", scratch)
    before = invocations()
    source.entries("snapshots/run1")
    assert invocations() - before == 2                      # ls-tree, one cat-file --batch
    for path in sorted(sizes, key=lambda p: p == largest):   # the largest last
        with source.file(path) as local:
            assert local.read_bytes() == (repo / path).read_bytes()
            if path != largest:
                assert source.hashed(local) == hashlib.sha256(local.read_bytes()).hexdigest()
                assert invocations() - before == 2              # no git call for it
    assert invocations() - before > 2                       # the largest was copied out
    monkeypatch.setattr(generation_source, "PREREAD_MAX", 10)   # nothing fits the budget
    tight = GitTreeSource(Git(repo), "HEAD", scratch)
    before = invocations()
    manifest = tight.read("snapshots/run1/MANIFEST", 1 << 20)
    assert manifest == (folder / "MANIFEST").read_bytes() and invocations() - before == 3


@pytest.mark.parametrize("fmt", ["wtxt", "aero"])
def test_a_kept_git_source_frees_each_shard_once_it_is_loaded(tmp_path, keys, fmt,
                                                              monkeypatch):
    """A restore's source keeps each shard it copied out of git (verified, then decoded from
    the same copy) and removes it once decoded: nothing is left in scratch, every shard came
    out of git once, and the arrays (AERO's map their file) stay valid. (These shards are
    small: read as large ones are, not with their folder's listing.)"""
    monkeypatch.setattr(generation_source, "PREREAD_FILE", 0)
    repo = tmp_path / "repo"
    in_git(repo, keys, fmt)
    copied: list[str] = []

    class CountingGit(Git):
        def blob_to(self, oid, out, **kw):
            copied.append(oid)
            return super().blob_to(oid, out, **kw)

    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    source = GitTreeSource(CountingGit(repo), "HEAD", scratch, keep=True)
    snap = load_from_source(source, "run1", options=opts(keys))
    assert [p for p in scratch.rglob("*") if p.is_file()] == []
    shards = parse_manifest((repo / "snapshots/run1/MANIFEST").read_bytes()).shards
    assert sorted(copied) == sorted(set(copied)) and len(copied) >= len(shards)
    for name, array in state().items():
        assert snap[name].dtype == array.dtype and snap[name].tobytes() == array.tobytes()


@pytest.mark.parametrize("fmt", ["wtxt", "aero"])
def test_a_shard_that_is_garbage_fails_by_its_digest_not_by_its_decoder(tmp_path, keys, fmt):
    """Shards are decoded while the generation is still being verified, and proven by what
    they decode to; a shard no decoder can read is judged by its file digest, and the
    failure is the verifier's (its digest), as without the proof by content."""
    folder = _gen_with(tmp_path, keys, fmt)
    shard = sorted((folder / "shards").iterdir())[0]
    size = shard.stat().st_size
    shard.write_bytes(b"\xff" * size)          # same size: the file-set check passes
    with pytest.raises(FormatError) as raised:
        load_from_source(FolderSource(tmp_path), "run1", options=opts(keys))
    assert raised.value.check == "digest", raised.value
    assert str(raised.value) == str(verify_generation(FolderSource(tmp_path), "run1",
                                                      opts(keys)).failure)


def test_nothing_is_loaded_when_a_check_after_the_shards_fails(tmp_path, keys):
    """Every shard verifies and is decoded, then the ledger check fails: no arrays."""
    commit_gen(tmp_path, spec(keys), 1, state())
    ledger = next((tmp_path / "ledger").iterdir())
    ledger.write_bytes(ledger.read_bytes().replace(b"build=b1", b"build=b2", 1))
    assert not verify_generation(FolderSource(tmp_path), "run1", opts(keys)).ok
    with pytest.raises(FormatError) as raised:
        load_from_source(FolderSource(tmp_path), "run1", options=opts(keys))
    assert raised.value.check == verify_generation(FolderSource(tmp_path), "run1",
                                                   opts(keys)).failure.check
