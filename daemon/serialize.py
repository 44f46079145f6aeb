"""The serialize and seal stage: one spooled generation -> a sealed generation in the work tree
(MANIFEST v2 and its shards, written by :mod:`snapops.formats.generation.write`) and its ledger
line. Deterministic given the spool, the config, the keys and the last committed MANIFEST, so
after a crash the daemon simply runs it again. Nothing is committed here.

A multi-rank generation is serialized from the pieces of every rank ({rank: {name: Shard}});
on a committer node, the parts other nodes wrote are already in the run folder (``received``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from snapops.config.loader import resolve
from snapops.config.schema import Config
from snapops.formats.generation.plan import Shard
from snapops.formats.generation.write import (
    GenerationSpec,
    PartWritten,
    seal_in_ledger,
    write_parts,
)
from snapops.formats.keys import keyid, load_hmac_key, load_signing_key


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
class Serialized:
    gen: int
    paths: list[str]           # repo-relative paths to stage (changed, added or removed)
    merkle_this: str           # the generation's ledger line
    dense: list[str]           # rewritten shards where most chunks changed (no git delta)


def run_dir(config: Config) -> str:
    return f"snapshots/{config.snapshot.run}"


def ledger_path(config: Config) -> str:
    return f"ledger/{config.snapshot.run}.ledger"


def generation_spec(config: Config, sealing: Sealing, lfs=None) -> GenerationSpec:
    """``lfs``: the LfsStash of a ``store = "lfs"`` run (see :mod:`.lfsstore`)."""
    snap = config.snapshot
    return GenerationSpec(
        run=snap.run, format=snap.format, shard_max=snap.shard_max,
        streaming_threshold=snap.streaming_threshold, delta=snap.delta, build=snap.build,
        wtxt={"schema": snap.schema, "host": snap.host, "cuda": snap.cuda,
              "row_blocking": snap.row_blocking, "rows_per_chunk": snap.rows_per_chunk or None},
        sign_key=sealing.sign_key, hmac_key=sealing.hmac_key, recipients=sealing.recipients,
        store="lfs" if lfs is not None else "git", lfs=lfs)


def serialize_generation(repo_root: Path, gen: int, ranks: dict[int | None, dict[str, Shard]],
                         ts: str, config: Config, sealing: Sealing, previous: bytes | None, *,
                         received: tuple[PartWritten, ...] = (), lfs=None) -> Serialized:
    """Write generation ``gen`` into the work tree at ``repo_root`` and append its ledger line;
    ``previous`` is the last committed MANIFEST (from HEAD)."""
    written = write_parts(repo_root, generation_spec(config, sealing, lfs), gen, ts, ranks,
                          previous, world=config.cluster.world_size, received=received)
    merkle_this = seal_in_ledger(repo_root, config.snapshot.run, written)
    return Serialized(gen, written.paths + [ledger_path(config)], merkle_this, written.dense)
