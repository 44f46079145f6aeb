"""Reading a generation back from a snapshot repository work tree: verify and load."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from snapops.formats.errors import FormatError
from snapops.formats.integrity import file_sha256
from snapops.formats.model import Snapshot
from snapops.formats.registry import detect
from snapops.formats.report import Report

from .generation import manifest_digest, parse_manifest
from .ledger import Ledger


def _plain_copy(path: Path, identity, tmp: str) -> Path:
    if not path.name.endswith(".age"):
        return path
    if identity is None:
        raise FormatError("age-encrypted shard: an identity is needed", path=str(path),
                          check="keys")
    from snapops.formats.armor import decrypt_file

    plain = Path(tmp) / path.name.removesuffix(".age")
    decrypt_file(path, plain, identity)
    wsum = Path(f"{path}.wsum")
    if wsum.exists():
        decrypt_file(wsum, Path(f"{plain}.wsum"), identity)
    return plain


def verify_generation(root: str | os.PathLike, run: str, *, hmac_key=None, trusted_keys=None,
                      identity=None) -> Report:
    """Every shard verifies and matches the MANIFEST; the ledger chain holds and its last
    line seals this MANIFEST."""
    root = Path(root)
    folder = root / "snapshots" / run
    report = Report(path=str(folder), format="generation")
    try:
        text = (folder / "MANIFEST").read_bytes()
        manifest = parse_manifest(text, str(folder / "MANIFEST"))
        with tempfile.TemporaryDirectory(prefix="snapops-gen-") as tmp:
            for shard in manifest.shards:
                _check_shard(folder, shard, hmac_key, trusted_keys, identity, tmp, report)
        ledger = Ledger(root / "ledger" / f"{run}.ledger", root=root)
        result = ledger.verify(check_files=False)
        if not result.ok:
            return report.fail(result.failure)
        last = ledger.last()
        if last is None or last.entry.sha256_all != manifest_digest(text) \
                or last.entry.gen_text != manifest.gen:
            return report.fail(FormatError("the ledger's last line does not seal this MANIFEST",
                                            path=str(root / "ledger" / f"{run}.ledger"),
                                            check="ledger", expected=manifest_digest(text),
                                            got=last.entry.sha256_all if last else "no line"))
    except FormatError as exc:
        return report.fail(exc)
    except OSError as exc:
        return report.fail(FormatError(str(exc), check="io"))
    report.details = {"gen": manifest.gen, "shards": len(manifest.shards),
                      "merkle_this": last.entry.merkle_this}
    return report


def _check_shard(folder: Path, shard, hmac_key, trusted_keys, identity, tmp, report) -> None:
    path = _plain_copy(folder / shard.path, identity, tmp)
    fmt = detect(path)
    keys = {"hmac_key": hmac_key if fmt.capabilities.can_hmac else None,
            "trusted_keys": tuple(trusted_keys or ()) if fmt.capabilities.can_sign else ()}
    result = fmt.verify(path, **keys)
    if not result.ok:
        raise result.failure
    report.arrays += result.arrays
    report.raw_bytes += result.raw_bytes
    seal = result.details.get("sha256_all")
    if seal is not None:        # the format seals itself: the MANIFEST records its root
        got = (seal, result.details["merkle_this"])
        if got != (shard.digest, shard.merkle_this):
            raise FormatError("shard does not match the MANIFEST", path=str(path),
                              check="manifest", expected=f"{shard.digest} {shard.merkle_this}",
                              got=f"{got[0]} {got[1]}")
    elif file_sha256(path) != shard.digest:
        raise FormatError("shard bytes do not match the MANIFEST digest", path=str(path),
                          check="manifest", expected=shard.digest)


def load_generation(root: str | os.PathLike, run: str, *, identity=None) -> Snapshot:
    """Reassemble the arrays of the generation in the work tree (split arrays joined)."""
    folder = Path(root) / "snapshots" / run
    text = (folder / "MANIFEST").read_bytes()
    manifest = parse_manifest(text)
    pieces: dict[str, dict[str, np.ndarray]] = {}
    with tempfile.TemporaryDirectory(prefix="snapops-gen-") as tmp:
        for shard in manifest.shards:
            path = _plain_copy(folder / shard.path, identity, tmp)
            pieces[shard.path] = dict(detect(path).load(path).arrays)
    arrays: dict[str, np.ndarray] = {}
    split_paths = {p for _, _, parts in manifest.splits.values() for p, _, _ in parts}
    for path, loaded in pieces.items():
        if path not in split_paths:
            arrays.update(loaded)
    for name, (dtype, shape, parts) in manifest.splits.items():
        arrays[name] = np.concatenate([pieces[p][name] for p, _, _ in parts]).reshape(shape)
    return Snapshot(arrays, {"gen": int(manifest.gen), "ts": manifest.ts, "run": manifest.run})
