"""Write one generation into a repository folder: shard files, companions, a sealed MANIFEST v2.

Deterministic given the arrays, the spec, the keys and the previous MANIFEST, so a crashed
writer simply runs again. Shards whose arrays did not change are not rewritten (their records
are carried over); every file is written atomically; the MANIFEST is written last, so a folder
whose MANIFEST names a file always has that file. Committing (and the ledger line) is the
caller's business.

Plan, then sink: :func:`write_part` writes the shards of some ranks' pieces and returns what it
wrote (:class:`PartWritten`: shard and file records, and per rank and array a
:class:`RankPiece` with its parts and partial statistics); :func:`write_parts` first checks
that all pieces tile their global arrays (:func:`~snapops.formats.generation.plan.check_layout`),
then builds the array records (statistics combined from the partials) and seals the MANIFEST.
A single writer's state is the degenerate case (rank ``None``, whole arrays, ``world=1``); a
daemon assembling a multi-node generation passes the parts other nodes wrote as ``received``.

>>> written = write_generation(Path("repo"), GenerationSpec(run="run1", format="aero"), 1,
...                            "2026-01-02T03:04:05Z", {"w": np.ones((4, 4), np.float32)})
>>> written.manifest.header.gen, written.paths[-1]
(1, 'snapshots/run1/MANIFEST')
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.contract import WriteResult
from snapops.formats.dtypes import DTYPES, dtype_name, unsigned_for
from snapops.formats.errors import DataError, FormatError
from snapops.formats.integrity import file_sha256
from snapops.formats.iosafe import refuse_symlinked
from snapops.formats.model import Snapshot
from snapops.formats.registry import handler
from snapops.formats.workers import HelperPool, run_all

from .manifest import (
    ArrayRecord, FileRecord, Header, Manifest, Part, Prev, ShardRecord, gen_text, parse_manifest,
    valid_run,
)
from .plan import (
    LayoutError, RankBox, Shard, check_layout, content_digest, piece_array, plan_shards,
)
from .seal import seal_manifest
from .stats import Partial, combine, finish, partial_stats
from .verify import AGE_SUFFIX

log = logging.getLogger("snapops.generation")

EXTENSIONS = {"wtxt": ".wtxt", "fold": ".fold", "aero": ".aero", "pycauset": ".pycauset",
              "finf": ".finf"}
@dataclass(frozen=True)
class GenerationSpec:
    """How a run's generations are written (the daemon builds this from its config)."""

    run: str
    format: str = "wtxt"
    shard_max: int = 32 << 20
    streaming_threshold: int = 1 << 30
    delta: bool = False
    build: str = "unknown"
    wtxt: dict = field(default_factory=dict)   # schema, host, cuda, row_blocking, rows_per_chunk
    sign_key: object = None
    hmac_key: bytes | None = None
    recipients: tuple[str, ...] = ()
    store: str = "git"                         # git | lfs (shard bytes in a Git LFS store)
    lfs: object = None                         # store=lfs: the LfsStash that uploads shards


@dataclass(frozen=True)
class Written:
    manifest: Manifest
    data: bytes                # the MANIFEST's exact bytes
    paths: list[str]           # repo-relative paths that changed (to stage), MANIFEST last
    dense: list[str]           # rewritten WTXT shards where most chunks changed


@dataclass(frozen=True)
class RankPiece:
    """Rank ``rank``'s box of global array ``name`` as written: where its parts live and the
    partial statistics of its elements."""

    name: str
    rank: int | None
    dtype: str                     # logical dtype
    stored: str | None             # stored dtype when it differs
    shape: tuple[int, ...]         # the global shape
    parts: tuple[Part, ...]        # boxes in global coordinates
    partial: Partial | None


@dataclass
class PartWritten:
    """What :func:`write_part` wrote for some ranks (or what another node's part says)."""

    ranks: tuple[int | None, ...]
    shards: list[ShardRecord] = field(default_factory=list)
    files: list[FileRecord] = field(default_factory=list)
    pieces: list[RankPiece] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)    # run-relative paths rewritten
    dense: list[str] = field(default_factory=list)    # run-relative: most chunks changed


def whole(arrays: dict[str, np.ndarray]) -> dict[str, Shard]:
    """A single writer's arrays as pieces that cover their whole arrays."""
    return {n: Shard(a, global_shape=a.shape, offsets=(0,) * a.ndim) for n, a in arrays.items()}


def write_generation(root: Path, spec: GenerationSpec, gen: int, ts: str,
                     arrays: dict[str, np.ndarray], previous: bytes | None = None) -> Written:
    """Write generation ``gen`` of ``spec.run`` under ``root``; ``previous`` is the last
    committed MANIFEST (reuse, per-path chains and ``prev``)."""
    return write_parts(root, spec, gen, ts, {None: whole(arrays)}, previous)


def write_parts(root: Path, spec: GenerationSpec, gen: int, ts: str,
                ranks: dict[int | None, dict[str, Shard]], previous: bytes | None = None, *,
                world: int = 1, received: tuple[PartWritten, ...] = ()) -> Written:
    """Write generation ``gen`` from the pieces of ``ranks`` ({rank: {name: Shard}}) and the
    parts other nodes wrote (``received``, their files already in the run folder). LayoutError,
    with nothing written, when the pieces do not tile their global arrays.

    >>> top = np.arange(8.0).reshape(2, 4)
    >>> written = write_parts(Path("repo"), GenerationSpec(run="run1"), 1, "2026-01-02T03:04:05Z",
    ...     {0: {"w": Shard(top, global_shape=(4, 4), offsets=(0, 0))},
    ...      1: {"w": Shard(top + 8, global_shape=(4, 4), offsets=(2, 0))}}, world=2)
    >>> [(p.box, p.rank) for p in written.manifest.arrays[0].parts]
    [(((0, 2), (0, 4)), 0), (((2, 4), (0, 4)), 1)]
    """
    check_spec(spec)
    base = parse_manifest(previous, "previous MANIFEST") if previous else None
    check_layout(layout_boxes(ranks) + [RankBox(p.name, p.rank, p.dtype, p.shape, part.box)
                                        for r in received for p in r.pieces for part in p.parts])
    folder = root / "snapshots" / spec.run
    refuse_symlinks(root, folder)
    parts = sorted([write_part(folder, spec, gen, ts, ranks, base), *received],
                   key=lambda r: [_rank_key(x) for x in r.ranks])
    manifest = Manifest(Header(spec.run, gen, ts, spec.build, spec.format, spec.store, world),
                        Prev(base.header.gen, _digest(previous)) if base else Prev())
    for part in parts:
        manifest.shards.extend(part.shards)
        manifest.files.extend(part.files)
    manifest.arrays = array_records([piece for part in parts for piece in part.pieces])
    run = f"snapshots/{spec.run}"
    changed = [f"{run}/{p}" for part in parts for p in part.paths]
    changed += _remove_stale(folder, spec.run, base, manifest)
    sealed = seal_manifest(manifest, spec.sign_key, spec.hmac_key)
    text = sealed.render()
    atomic_write_bytes(folder / "MANIFEST", text)
    return Written(sealed, text, changed + [f"{run}/MANIFEST"],
                   [f"{run}/{p}" for part in parts for p in part.dense])


def refuse_symlinks(root: Path, folder: Path) -> None:
    """No symlink between ``root`` and the run ``folder``, nor inside it: a tree that put one
    there (a work tree checked out from a remote) would make the writer write outside."""
    refuse_symlinked(root, folder.relative_to(root).as_posix())
    found = [p for p in folder.rglob("*") if p.is_symlink()] if folder.is_dir() else []
    if found:
        raise DataError(f"{found[0]}: a symlink in the run folder; refusing to write through "
                        "it (expected plain folders and files, as snapops writes them)")


def check_spec(spec: GenerationSpec) -> None:
    if not valid_run(spec.run):
        raise DataError(f"run name {spec.run!r} is not usable in paths and tags")
    if spec.format not in EXTENSIONS:
        raise DataError(f"format {spec.format!r}: expected one of {', '.join(EXTENSIONS)}")
    if spec.store not in ("git", "lfs") or (spec.store == "lfs") != (spec.lfs is not None):
        raise DataError(f"store {spec.store!r}: expected git, or lfs with an LFS stash")


def layout_boxes(ranks: dict[int | None, dict[str, Shard]]) -> list[RankBox]:
    return [RankBox(name, rank, dtype_name(piece.local.dtype), piece.global_shape, piece.box)
            for rank, pieces in ranks.items() for name, piece in pieces.items()]


def rank_prefix(rank: int | None) -> str:
    """Where a rank's shards live in the run folder: ``shards/`` for a single writer."""
    return "shards/" if rank is None else f"shards/r{rank:04d}/"


SHARDS_IN_FLIGHT = 2


def write_part(folder: Path, spec: GenerationSpec, gen: int, ts: str,
               ranks: dict[int | None, dict[str, Shard]], base: Manifest | None) -> PartWritten:
    """Write (or reuse from ``base``) the shards of every rank's pieces into ``folder``; ranks
    are written in parallel (the codecs release the GIL), their records merged in rank order."""
    order = sorted(ranks, key=_rank_key)
    workers = min(len(order), os.cpu_count() or 1)

    def one(rank: int | None) -> PartWritten:
        return _write_rank(folder, spec, gen, ts, rank, ranks[rank], base,
                           in_flight=SHARDS_IN_FLIGHT if workers == 1 else 1)

    done = run_all(one, order, workers)
    out = PartWritten(tuple(order))
    for part in done:
        for name in ("shards", "files", "pieces", "paths", "dense"):
            getattr(out, name).extend(getattr(part, name))
    return out


def _write_rank(folder: Path, spec: GenerationSpec, gen: int, ts: str, rank: int | None,
                pieces: dict[str, Shard], base: Manifest | None, *,
                in_flight: int = 1) -> PartWritten:
    """The shards of one rank and its pieces (boxes in global coordinates, partial stats).
    ``in_flight`` shards are written at once (one's fsync waits for the disk while the next
    is encoded; the LFS store uploads one at a time); the statistics are computed beside
    them. Records come out in plan order whatever the order of completion."""
    out = PartWritten((rank,))
    arrays = {n: piece.local for n, piece in pieces.items()}
    caps = handler(spec.format).capabilities
    suffix = AGE_SUFFIX if spec.recipients else ""
    where: dict[str, list[Part]] = {}

    def write_one(plan):
        data = {p.name: piece_array(arrays, p) for p in plan.pieces}
        path = plan.path + suffix
        record, files, share = _shard(folder, path, data, gen, ts, spec, base)
        if spec.lfs is not None and record.gen == gen:
            record = spec.lfs.store(folder, record, base.shard(path) if base else None,
                                    _itemsize(data))
        return path, record, files, share

    plans = plan_shards(arrays, spec.shard_max, EXTENSIONS[spec.format], rank_prefix(rank))
    with HelperPool(in_flight if spec.lfs is None else 1) as pool:
        written = [pool.submit(write_one, plan) for plan in plans]
        stats = {name: pool.submit(partial_stats, array) for name, array in arrays.items()}
        done = [job.result() for job in written]
    for plan, (path, record, files, share) in zip(plans, done):
        out.shards.append(record)
        out.files.extend(files)
        if record.gen == gen:
            out.paths += [path, *(f.path for f in files)]
            if share > 0.5:
                out.dense.append(path)
        for p in plan.pieces:
            offsets = pieces[p.name].offsets
            box = tuple((lo + o, hi + o) for (lo, hi), o in zip(p.box, offsets))
            where.setdefault(p.name, []).append(Part(path, p.name, box, rank))
    for name in sorted(arrays, key=_name_key):
        logical = dtype_name(arrays[name].dtype)
        if logical not in DTYPES:
            raise DataError(f"array {name!r}: dtype {logical} cannot be part of a generation "
                            f"(supported: {', '.join(DTYPES)})")
        stored = None if caps.stores(logical) else unsigned_for(arrays[name].dtype)
        out.pieces.append(RankPiece(name, rank, logical, stored, pieces[name].global_shape,
                                    tuple(where[name]), stats[name].result()))
    return out


def _itemsize(data: dict[str, np.ndarray]) -> int:
    """The width of the numbers that fill most of a shard (its residual's byte planes)."""
    by_size: dict[int, int] = {}
    for a in data.values():
        by_size[a.dtype.itemsize] = by_size.get(a.dtype.itemsize, 0) + a.nbytes
    size = max(by_size, key=by_size.get, default=1)
    return size if size in (1, 2, 4, 8) else 1


def array_records(pieces: list[RankPiece]) -> list[ArrayRecord]:
    """One record per global array: the parts of every rank, statistics combined in rank
    order. Call it on pieces that passed :func:`check_layout`."""
    by_name: dict[str, list[RankPiece]] = {}
    for piece in pieces:
        by_name.setdefault(piece.name, []).append(piece)
    records = []
    for name in sorted(by_name, key=_name_key):
        items = sorted(by_name[name], key=lambda p: _rank_key(p.rank))
        first = items[0]
        if len({p.stored for p in items}) != 1:
            raise LayoutError(f"array {name}: ranks store it as different dtypes")
        partial = combine(p.partial for p in items)
        records.append(ArrayRecord(name, first.dtype, first.shape, first.stored,
                                   None if partial is None else finish(partial),
                                   tuple(part for p in items for part in p.parts)))
    return records


def _rank_key(rank: int | None) -> int:
    return -1 if rank is None else rank


def _name_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def _digest(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _shard(folder: Path, path: str, data: dict[str, np.ndarray], gen: int, ts: str,
           spec: GenerationSpec, base: Manifest | None):
    """Reuse the previous record of ``path`` when its arrays are unchanged; else write it."""
    content = content_digest(data)
    prior = base.shard(path) if base else None
    if prior is not None and prior.content == content and (folder / path).is_file():
        files = [f for f in base.files if f.of == path]
        if all((folder / f.path).is_file() for f in files):
            return prior, files, 0.0
    return _write_shard(folder, path, data, gen, ts, spec, prior, content)


def _write_shard(folder: Path, path: str, data, gen: int, ts: str, spec: GenerationSpec,
                 prior: ShardRecord | None, content: str):
    target = folder / path.removesuffix(AGE_SUFFIX)
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = target.with_name(f".{target.name}.new")
    nbytes = sum(a.nbytes for a in data.values())
    text = handler(spec.format).capabilities.streams_text  # WTXT: WSUM, DELTA, chunk shares
    streaming = text and nbytes > spec.streaming_threshold
    written = _save(fresh, data, gen, ts, spec, prior, streaming)
    share = changed_share(target, fresh) if text and target.exists() else 1.0
    companions = _companions(target, fresh, spec, streaming)
    os.replace(fresh, target)
    record = ShardRecord(path, spec.format, written.size, written.sha256, gen, content,
                         written.merkle_this)
    if spec.recipients:
        record, companions = _armor(target, record, companions, spec.recipients)
    files = [FileRecord(_rel(folder, p), role, path, p.stat().st_size, file_sha256(p))
             for role, p in companions]
    return record, files, share


def _save(fresh: Path, data, gen: int, ts: str, spec: GenerationSpec, prior,
          streaming: bool) -> WriteResult:
    """Write the shard file; WTXT shards are sealed and chain ``merkle_prev`` on their path."""
    fmt = handler(spec.format)
    options = {"gen": gen, "ts": ts, "build": spec.build}
    if fmt.capabilities.can_sign:
        merkle_prev = prior.merkle_this if prior and prior.merkle_this else None
        options.update(spec.wtxt, hmac_key=spec.hmac_key, sign_key=spec.sign_key,
                       streaming=streaming, merkle_prev=merkle_prev)
    return fmt.save(Snapshot(data), fresh, **options)


def _companions(target: Path, fresh: Path, spec: GenerationSpec,
                streaming: bool) -> list[tuple[str, Path]]:
    """WSUM (streaming) and DELTA v2 (``spec.delta``) files for a rewritten WTXT shard."""
    found = []
    wsum, delta = Path(f"{target}.wsum"), target.with_name(target.name + "delta")
    wsum.unlink(missing_ok=True)
    delta.unlink(missing_ok=True)
    if streaming:
        os.replace(f"{fresh}.wsum", wsum)
        found.append(("wsum", wsum))
    if spec.delta and not spec.recipients and not streaming and target.exists():
        from snapops.formats.wtxt.delta import DeltaMismatch, make_delta

        try:
            make_delta(target, fresh, delta, hmac_key=spec.hmac_key)
            found.append(("delta", delta))
        except DeltaMismatch as exc:  # the layout changed: the full shard is all there is
            log.info("no delta for %s: %s", target.name, exc)
    return found


def _armor(plain: Path, record: ShardRecord, companions, recipients):
    """Encrypt the shard and its WSUM with age; the record binds ciphertext and plaintext."""
    from snapops.formats.armor import encrypt_file

    armored_files = []
    for role, path in [("shard", plain), *companions]:
        armored = Path(f"{path}{AGE_SUFFIX}")
        try:
            encrypt_file(path, armored, list(recipients))
        finally:
            path.unlink(missing_ok=True)
        armored_files.append((role, armored))
    shard = armored_files[0][1]
    record = dataclasses.replace(record, size=shard.stat().st_size, sha256=file_sha256(shard),
                                 plain_size=record.size, plain_sha256=record.sha256)
    return record, armored_files[1:]


def _rel(folder: Path, path: Path) -> str:
    return path.relative_to(folder).as_posix()


def changed_share(old: Path, new: Path) -> float:
    """Share of WTXT chunks whose SHA-256 differs (1.0 when the layouts differ)."""
    from snapops.formats.wtxt.delta import chunk_sha_pairs

    try:
        pairs = chunk_sha_pairs(old, new)
    except (DataError, FormatError):
        return 1.0
    return sum(a != b for a, b in pairs) / len(pairs) if pairs else 0.0


def _remove_stale(folder: Path, run: str, base: Manifest | None, manifest: Manifest) -> list[str]:
    """Delete files of the previous generation that this one no longer lists."""
    if base is None:
        return []
    stale = sorted(set(base.paths()) - set(manifest.paths()))
    for rel in stale:
        (folder / rel).unlink(missing_ok=True)
    return [f"snapshots/{run}/{rel}" for rel in stale]


def seal_in_ledger(root: Path, run: str, written: Written) -> str:
    """Append the generation's ledger line (``format=manifest``) unless a crash left it there
    already; returns its ``merkle_this``. Another MANIFEST already sealed for this gen fails."""
    from snapops.formats.ledger import Ledger, LedgerEntry
    from snapops.formats.integrity import ZERO_HASH, merkle_link

    h = written.manifest.header
    refuse_symlinked(root, f"ledger/{run}.ledger")
    ledger = Ledger(root / "ledger" / f"{run}.ledger", root=root)
    ledger.path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(written.data).hexdigest()
    gen = gen_text(h.gen)
    last = ledger.last() if ledger.path.exists() else None
    if last is not None and last.entry.gen_text == gen:
        if last.entry.sha256_all != digest:
            raise DataError(f"the ledger already seals gen {gen} with another MANIFEST")
        return last.entry.merkle_this
    prev = last.entry.merkle_this if last else ZERO_HASH
    merkle = merkle_link(prev, digest, h.ts, gen, h.build)
    ledger.append(LedgerEntry(h.gen, h.ts, digest, prev, merkle, f"snapshots/{run}/MANIFEST",
                              "manifest", h.keyid, h.build, gen))
    return merkle
