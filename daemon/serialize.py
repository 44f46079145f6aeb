"""The serialize and seal stages: one spooled generation -> shard files, MANIFEST, ledger line.

Deterministic given the spool file, the config and the last committed MANIFEST, so after a
crash the daemon simply runs it again. Files are written atomically; nothing is committed here.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snapops.config.loader import resolve
from snapops.config.schema import Config
from snapops.formats.errors import DataError, FormatError
from snapops.formats.integrity import ZERO_HASH, merkle_link
from snapops.formats.keys import keyid, load_hmac_key, load_signing_key
from snapops.formats.model import Snapshot
from snapops.formats.registry import handler

from .generation import (
    EXTENSIONS, Manifest, ShardEntry, content_digest, manifest_digest, parse_manifest,
    plan_shards, shard_arrays,
)
from .ledger import Ledger, LedgerEntry

log = logging.getLogger("snapops.serialize")


@dataclass(frozen=True)
class Sealing:
    hmac_key: bytes | None
    sign_key: object | None
    keyid: str | None
    recipients: tuple[str, ...]

    @classmethod
    def from_config(cls, config: Config) -> "Sealing":
        seal = config.seal
        hmac_key = load_hmac_key(resolve(config, seal.hmac_key)) if seal.hmac_key else None
        sign_key = load_signing_key(resolve(config, seal.sign_key)) if seal.sign_key else None
        return cls(hmac_key, sign_key, keyid(sign_key) if sign_key else None,
                   tuple(seal.age_recipients))


@dataclass(frozen=True)
class Written:
    gen: int
    manifest: Manifest
    paths: list[str]           # repo-relative paths to stage (changed, added or removed)
    merkle_this: str
    dense: list[str]           # rewritten shards where most chunks changed (no git delta)


def run_dir(config: Config) -> str:
    return f"snapshots/{config.snapshot.run}"


def ledger_path(config: Config) -> str:
    return f"ledger/{config.snapshot.run}.ledger"


def serialize_generation(repo_root: Path, gen: int, arrays: dict[str, np.ndarray], ts: str,
                         config: Config, sealing: Sealing, previous: bytes | None) -> Written:
    """Write generation ``gen`` into the work tree at ``repo_root``; ``previous`` is the last
    committed MANIFEST (from HEAD), which decides reuse and per-path merkle links."""
    snap = config.snapshot
    base = parse_manifest(previous) if previous else None
    old = base.by_path() if base else {}
    gen_text = f"{gen:06d}"
    shards, splits = plan_shards(arrays, snap.shard_max, EXTENSIONS[snap.format])
    manifest = Manifest(snap.run, gen_text, ts, snap.build, snap.format)
    folder = repo_root / run_dir(config)
    changed: list[str] = []
    dense: list[str] = []
    for rel_plain, pieces in shards:
        rel = rel_plain + (".age" if sealing.recipients else "")
        data = shard_arrays(arrays, pieces)
        content = content_digest(data)
        prior = old.get(rel)
        if prior is not None and prior.content == content and (folder / rel).exists():
            manifest.shards.append(prior)
            continue
        entry, share = _write_shard(folder / rel, data, gen, ts, config, sealing, prior, content)
        entry.path = rel
        if share > 0.5:
            dense.append(f"{run_dir(config)}/{rel}")
        manifest.shards.append(entry)
        changed.extend(f"{run_dir(config)}/{p}" for p in _with_companions(rel))
    for name, parts in splits.items():
        array = arrays[name]
        manifest.splits[name] = (array.dtype.str, array.shape,
                                 [(p + (".age" if sealing.recipients else ""), a, b)
                                  for p, a, b in parts])
    current = {s.path for s in manifest.shards}
    for stale in sorted(set(old) - current):
        for rel in _with_companions(stale):
            (folder / rel).unlink(missing_ok=True)
            changed.append(f"{run_dir(config)}/{rel}")
    text = manifest.render()
    from snapops.formats.atomic import atomic_write_bytes

    atomic_write_bytes(folder / "MANIFEST", text)
    changed.append(f"{run_dir(config)}/MANIFEST")
    merkle_this = _append_ledger(repo_root, config, sealing, gen_text, ts, text)
    changed.append(ledger_path(config))
    return Written(gen, manifest, changed, merkle_this, dense)


def _write_shard(path: Path, data: dict[str, np.ndarray], gen: int, ts: str, config: Config,
                 sealing: Sealing, prior: ShardEntry | None,
                 content: str) -> tuple[ShardEntry, float]:
    """Write one shard; returns its MANIFEST entry and the share of chunks that changed."""
    snap = config.snapshot
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path.with_name(path.name.removesuffix(".age")) if sealing.recipients else path
    share = 1.0
    if snap.format == "wtxt":
        digest, merkle, share = _write_wtxt(target, data, gen, ts, config, sealing, prior)
    else:
        handler(snap.format).save(Snapshot(data), target)
        digest, merkle = _file_sha256(target), "-"
    if sealing.recipients:
        _armor(target, path, sealing.recipients)
    entry = ShardEntry(path.name, f"{gen:06d}", digest, merkle, content, tuple(sorted(data)))
    return entry, share


def _write_wtxt(target: Path, data, gen: int, ts: str, config: Config, sealing: Sealing,
                prior: ShardEntry | None) -> tuple[str, str, float]:
    """Write a WTXT shard; with ``snapshot.delta`` also ``<shard>delta`` from the old file."""
    snap = config.snapshot
    fresh = target.with_name(f".{target.name}.new")
    streaming = sum(a.nbytes for a in data.values()) > snap.streaming_threshold
    result = handler("wtxt").save(
        Snapshot(data), fresh, gen=gen, ts=ts, build=snap.build, schema=snap.schema,
        host=snap.host, cuda=snap.cuda, row_blocking=snap.row_blocking,
        rows_per_chunk=snap.rows_per_chunk or None, hmac_key=sealing.hmac_key,
        sign_key=sealing.sign_key, map_names=True, streaming=streaming,
        merkle_prev=prior.merkle_this if prior and prior.merkle_this != "-" else None)
    share = changed_share(target, fresh) if target.exists() else 1.0
    delta = target.with_name(target.name + "delta")
    delta.unlink(missing_ok=True)
    if snap.delta and not sealing.recipients and not streaming and target.exists():
        from snapops.formats.wtxt.delta import DeltaMismatch, make_delta

        try:
            make_delta(target, fresh, delta, hmac_key=sealing.hmac_key)
        except DeltaMismatch as exc:  # layout changed: the full shard is all there is
            log.info("no delta for %s: %s", target.name, exc)
    os.replace(fresh, target)
    fresh_wsum, wsum = Path(f"{fresh}.wsum"), Path(f"{target}.wsum")
    if streaming:
        os.replace(fresh_wsum, wsum)
    else:
        wsum.unlink(missing_ok=True)
    return result.sha256_all, result.merkle_this, share


def changed_share(old: Path, new: Path) -> float:
    """Share of chunks whose SHA-256 differs (1.0 when the layouts differ)."""
    from snapops.formats.wtxt.delta import chunk_sha_pairs

    try:
        pairs = chunk_sha_pairs(old, new)
    except (DataError, FormatError):
        return 1.0
    if not pairs:
        return 0.0
    return sum(a != b for a, b in pairs) / len(pairs)


def _with_companions(rel: str) -> list[str]:
    """A shard path and the files that travel with it (WSUM, DELTA v2)."""
    plain = rel.removesuffix(".age")
    return [rel, rel + ".wsum"] + ([plain + "delta"] if plain.endswith(".wtxt") else [])


def _armor(plain: Path, armored: Path, recipients: tuple[str, ...]) -> None:
    from snapops.formats.armor import encrypt_file

    try:
        encrypt_file(plain, armored, list(recipients))
    finally:
        plain.unlink(missing_ok=True)
        wsum = Path(str(plain) + ".wsum")
        if wsum.exists():
            encrypt_file(wsum, Path(str(armored) + ".wsum"), list(recipients))
            wsum.unlink()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _append_ledger(repo_root: Path, config: Config, sealing: Sealing, gen_text: str, ts: str,
                   manifest: bytes) -> str:
    """Append this generation's line unless a crash left it there already."""
    ledger = Ledger(repo_root / ledger_path(config), root=repo_root)
    (repo_root / "ledger").mkdir(exist_ok=True)
    digest = manifest_digest(manifest)
    last = ledger.last() if ledger.path.exists() else None
    if last is not None and last.entry.gen_text == gen_text:
        if last.entry.sha256_all != digest:
            raise DataError(f"ledger already has gen {gen_text} with another MANIFEST")
        return last.entry.merkle_this
    prev = last.entry.merkle_this if last else ZERO_HASH
    merkle = merkle_link(prev, digest, ts, gen_text, config.snapshot.build)
    ledger.append(LedgerEntry(int(gen_text), ts, digest, prev, merkle,
                              f"{run_dir(config)}/MANIFEST", "manifest", sealing.keyid,
                              config.snapshot.build, gen_text))
    return merkle
