"""The seal of a generation, for a MANIFEST of every shard format: any changed byte of the
MANIFEST, of any shard or of the ledger line fails verification; so do an untrusted key, a wrong
HMAC key, and an older MANIFEST replayed after a newer one."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from snapops.formats.errors import FormatError
from snapops.formats.generation import parse_manifest
from snapops.formats.generation.source import FolderSource
from snapops.formats.generation.verify import (
    GenerationOptions, check_ledger_seal, verify_generation,
)
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
from snapops.formats.keys import coerce_trusted, generate_keys, load_hmac_key

TS = "2026-01-02T03:04:05Z"
FORMATS = ["wtxt", "fold", "aero", "pycauset", "finf"]
MANIFEST = Path("snapshots/run1/MANIFEST")
LEDGER = Path("ledger/run1.ledger")


def state(gen: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"a": rng.standard_normal((32, 8)).astype(np.float32),
            "b": np.arange(40, dtype=np.int64) * gen,
            "c": rng.standard_normal(16).astype(np.float16)}


@dataclasses.dataclass
class Sealed:
    root: Path                   # generations 1 and 2 written, the ledger sealing 2
    older: Path                  # the same folder as it was after generation 1
    second: bytes                # generation 2's MANIFEST
    options: GenerationOptions   # keys loaded once, everything required, 2 follows 1

    def verify(self, root: Path | None = None, **changes):
        return verify_generation(FolderSource(root or self.root), "run1",
                                 dataclasses.replace(self.options, **changes))


@pytest.fixture(scope="module", params=FORMATS)
def sealed(request, tmp_path_factory) -> Sealed:
    keys = tmp_path_factory.mktemp("keys")
    generate_keys(keys)
    root = tmp_path_factory.mktemp(f"gen-{request.param}")
    spec = GenerationSpec(run="run1", format=request.param, shard_max=512, build="b1",
                          sign_key=keys / "signing.key", hmac_key=load_hmac_key(keys / "hmac.key"))
    first = write_generation(root, spec, 1, TS, state(1))
    seal_in_ledger(root, "run1", first)
    older = tmp_path_factory.mktemp(f"older-{request.param}") / "repo"
    shutil.copytree(root, older)
    second = write_generation(root, spec, 2, TS, state(2), first.data)
    seal_in_ledger(root, "run1", second)
    options = GenerationOptions(trusted_keys=coerce_trusted([keys / "signing.pub"]),
                                hmac_key=load_hmac_key(keys / "hmac.key"),
                                require_signature=True, require_hmac=True,
                                expect_prev=first.data)
    result = Sealed(root, older, second.data, options)
    assert result.verify().ok, result.verify().failure
    assert result.verify(older, expect_prev=None).ok
    return result


def each_flip(path: Path, positions):
    """Yield once per position with that byte of ``path`` changed; the file is restored."""
    data = path.read_bytes()
    try:
        for at in positions:
            changed = bytearray(data)
            changed[at] ^= 0x01 if changed[at] not in (0x0a, 0x0b) else 0x20
            path.write_bytes(bytes(changed))
            yield at
    finally:
        path.write_bytes(data)


def test_any_byte_of_the_manifest(sealed):
    path = sealed.root / MANIFEST
    for at in each_flip(path, range(path.stat().st_size)):
        report = sealed.verify()
        assert not report.ok, f"byte {at} of the MANIFEST changed and it still verified"


def test_any_byte_of_any_shard(sealed):
    shards = sorted(p for p in (sealed.root / "snapshots/run1/shards").iterdir())
    assert len(shards) > 1
    for shard in shards:
        size = shard.stat().st_size
        for at in each_flip(shard, sorted({0, size - 1, *range(0, size, max(1, size // 24))})):
            report = sealed.verify()
            assert not report.ok and report.failure.check == "digest", (shard.name, at)


def test_any_byte_of_the_ledger_line(sealed):
    """Every byte through the verifier's ledger check, and a few through the whole verify."""
    path = sealed.root / LEDGER
    data = path.read_bytes()
    manifest_bytes = (sealed.root / MANIFEST).read_bytes()
    manifest = parse_manifest(manifest_bytes)
    last = data.rindex(b"\n", 0, len(data) - 1) + 1
    for at in each_flip(path, range(last, len(data))):
        with pytest.raises(FormatError, match=r"\[(grammar|chain|merkle|ledger|gap|truncated)\]"):
            check_ledger_seal(FolderSource(sealed.root), "run1", manifest, manifest_bytes)
    for at in each_flip(path, range(last, len(data), 37)):
        report = sealed.verify()
        assert not report.ok and report.failure.path == LEDGER.as_posix(), at


def test_untrusted_key_and_wrong_hmac_key(sealed, tmp_path):
    generate_keys(tmp_path / "other")
    other = sealed.verify(trusted_keys=coerce_trusted([tmp_path / "other" / "signing.pub"]))
    assert other.failure.check == "signature" and "not trusted" in str(other.failure)
    wrong = sealed.verify(hmac_key=load_hmac_key(tmp_path / "other" / "hmac.key"))
    assert wrong.failure.check == "hmac" and "does not match" in str(wrong.failure)
    missing = sealed.verify(hmac_key=None)
    assert missing.failure.check == "hmac" and "no HMAC key" in str(missing.failure)


def test_replayed_older_manifest(sealed, tmp_path):
    """Generation 1, complete and validly sealed, put back after generation 2: its ledger
    either (a shorter ledger, which the hooks' append-only rule refuses) or generation 2's."""
    replay = sealed.verify(sealed.older, expect_prev=sealed.second)
    assert replay.failure.check == "chain" and "rollback, replay" in str(replay.failure)
    copy = tmp_path / "copy"
    shutil.copytree(sealed.older, copy)
    shutil.copy(sealed.root / LEDGER, copy / LEDGER)
    report = sealed.verify(copy, expect_prev=sealed.second)
    assert report.failure.check == "chain"
    unchained = sealed.verify(copy, expect_prev=None)  # even without the history at hand
    assert unchained.failure.check == "ledger" and "does not seal" in str(unchained.failure)


@pytest.mark.parametrize("where", ["snapshots", "snapshots/run1", "snapshots/run1/shards"])
def test_the_writer_never_writes_through_a_symlink_in_the_run_folder(tmp_path, where):
    """A work tree checked out from a remote may hold a symlink where the run folder goes;
    writing a generation there would put shards and the MANIFEST outside the repository."""
    from snapops.formats.errors import DataError

    root, outside = tmp_path / "repo", tmp_path / "outside"
    outside.mkdir()
    link = root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(DataError, match=r"a symlink (in the run folder|where snapops writes "
                                        r"snapshots/run1); refusing to write"):
        write_generation(root, GenerationSpec(run="run1"), 1, "2026-01-02T03:04:05Z",
                         {"w": np.arange(6, dtype=np.float32)})
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("where", ["ledger", "ledger/run1.ledger"])
def test_the_ledger_line_is_never_appended_through_a_symlink(tmp_path, where):
    """The same for the ledger: a `ledger` folder (or ledger file) checked out as a symlink
    made sealing append the generation's line to a file outside the repository."""
    from snapops.formats.errors import DataError

    root, outside = tmp_path / "repo", tmp_path / "outside"
    outside.mkdir()
    link = root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if where == "ledger":
        link.symlink_to(outside, target_is_directory=True)
    else:
        link.symlink_to(outside / "run1.ledger")
    written = write_generation(root, GenerationSpec(run="run1"), 1, "2026-01-02T03:04:05Z",
                               {"w": np.arange(6, dtype=np.float32)})
    with pytest.raises(DataError, match=rf"repo/{where}: a symlink where snapops writes "
                                        r"ledger/run1\.ledger; refusing to write or delete"):
        seal_in_ledger(root, "run1", written)
    assert list(outside.iterdir()) == []
