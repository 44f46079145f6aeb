"""Shards stored by the daemon: before a generation is committed, its large shards go into a
pack of the work repository that the daemon writes itself (sparsely changed ones as git
deltas of their versions at the branch tip, the others whole); the commit stages them by
object id and ``git push`` sends what the pack holds.

Why not ``git add``: it hashes every byte with git's collision-detecting SHA-1 (~250 MB/s
here) and writes a loose object per shard, which ``pack-objects`` inflates and deflates again
on every push; a 64 MiB WTXT generation cost 0.8 s to stage. Here the object ids are hashed
with hashlib's SHA-1 (~1.6 GB/s) on both cores, and the pack is written once, at the
repository's zlib level, for the push to reuse. And why deltas: pushing a 1%-rows change of a
128 MiB WTXT state cost git's delta search over every rewritten shard twice (search, then
again while writing: deltas over 64 KiB are never cached), 16-23 s. Here each sparsely changed
shard is compared with its previous version in 512-byte blocks
(:func:`snapops.daemon.gitpack.git_delta`), and one pack holds the old blob whole (a delta's
base must be in the same pack) and the new blob as a delta; ``git push`` reuses those deltas
(``Total 7 (delta 4), reused 4 (delta 4)``) and sends the changed bytes.

Order of writes: the pack (temp file, fsync, rename to ``pack-<sha>.pack``), its index
(atomic), then git reads the pack back: every blob stored as a delta must come out of
``git cat-file`` with its SHA-1 equal to its object id, and every whole blob must be listed
with its size (its bytes went through zlib unchanged: the file was hashed, then copied into
the pack, and its lstat key is the same before and after the copy). Anything else removes
the pack again, and the commit stores the files through ``git add``, as usual. A crash at
any point leaves every object readable.

Example::

    packed = repo.pack_shards(["snapshots/run1/shards/0000.wtxt"])
    packed.paths, packed.deltas, packed.delta_bytes
    # -> (('snapshots/run1/shards/0000.wtxt',), 1, 1163264)
"""

from __future__ import annotations

import collections
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from snapops.formats.atomic import atomic_write, atomic_write_bytes, fsync_dir, mapped
from snapops.formats.errors import GitError
from snapops.formats.integrity import git_blob_id
from snapops.formats.workers import HelperPool

from .gitpack import PackWriter, git_delta, index_bytes
from .safeio import StatKey, open_regular, stat_key

__all__ = ["CONVERSIONS", "MIN_SIZE", "Candidate", "ShardPack", "converted", "tip_blobs",
           "write_shard_pack"]

MIN_SIZE = 1 << 20      # smaller files: git add is quick enough
LITERAL_SHARE = 0.25    # a delta whose literal bytes pass this share of the blob: not worth it
WORKERS = 2             # shards hashed and compared at once (numpy and hashlib release the GIL)
HELD_MAX = 64 << 20     # bytes of deltas held in memory before they are written as a pack
# attributes under which `git add` would store other bytes than the file's
CONVERSIONS = ("filter", "text", "eol", "ident", "working-tree-encoding")
INCOMING = "snapops-incoming.pack"   # git lists only *.idx with a *.pack: never seen by git


@dataclass(frozen=True)
class Candidate:
    """A work-tree file to store: its path, its blob at the branch tip (None: not there),
    and whether most of it changed (no delta is tried then)."""

    path: str
    tip: str | None
    dense: bool = False


@dataclass(frozen=True)
class ShardPack:
    """What :func:`write_shard_pack` stored."""

    paths: tuple[str, ...]     # files now stored in the daemon's packs
    oids: tuple[str, ...]      # their blobs' object ids
    deltas: int                # how many of them as deltas (the others whole)
    delta_bytes: int           # those deltas, before zlib
    blob_bytes: int            # every one of them whole


def tip_blobs(ls_tree_z: bytes, paths: Iterable[str]) -> dict[str, str]:
    """Path -> blob id of the regular files among ``paths`` in ``git ls-tree -r -z`` output."""
    wanted = set(paths)
    out = {}
    for record in ls_tree_z.split(b"\0"):
        meta, _, path = record.partition(b"\t")
        parts = meta.decode("ascii", "replace").split()
        name = path.decode("utf-8", "surrogateescape")
        if len(parts) == 3 and parts[0] == "100644" and parts[1] == "blob" and name in wanted:
            out[name] = parts[2]
    return out


def converted(check_attr_z: bytes) -> set[str]:
    """The paths that ``git check-attr -z`` output (of :data:`CONVERSIONS`) gives a
    conversion: staged by ``git add`` only, never by their bytes' id."""
    fields = check_attr_z.split(b"\0")
    return {path.decode("utf-8", "surrogateescape")
            for path, _attr, value in zip(fields[0::3], fields[1::3], fields[2::3])
            if value not in (b"unspecified", b"unset")}


@dataclass
class _Prepared:
    path: str
    new: str                    # object id of the file's bytes
    size: int
    key: StatKey                # the file's stat key when it was hashed
    old: str | None = None      # a delta's base (the tip's blob) ...
    base: BinaryIO | None = None   # ... in an unlinked temp file
    delta: bytes | None = None

    def close(self) -> None:
        if self.base is not None:
            self.base.close()


def _open_regular(path: Path) -> BinaryIO | None:
    """The daemon's own file, opened; a link, a folder or a FIFO put there is never read."""
    try:
        return os.fdopen(open_regular(path), "rb")
    except OSError:
        return None


def _prepare(candidate: Candidate, worktree: Path, scratch: Path,
             cat_blob: Callable[[str, BinaryIO], None],
             has_object: Callable[[str], bool]) -> _Prepared | None:
    """The large work-tree file of ``candidate`` hashed, with its delta when it changed
    sparsely since the tip; None when there is nothing to store (small, not a regular file,
    unchanged, or a blob git has already)."""
    target_file = _open_regular(worktree / candidate.path)
    if target_file is None:
        return None
    with target_file, mapped(target_file) as target:
        if len(target) < MIN_SIZE:
            return None
        new = git_blob_id(target)
        if new == candidate.tip or has_object(new):
            return None  # git reads its own copy: nothing to check, nothing to gain
        key = stat_key(os.fstat(target_file.fileno()))
        prepared = _Prepared(candidate.path, new, len(target), key)
        if candidate.tip is None or candidate.dense:
            return prepared
        base_file = tempfile.TemporaryFile(dir=scratch)
        try:
            cat_blob(candidate.tip, base_file)
            with mapped(base_file) as base:
                delta = git_delta(base, target, int(len(target) * LITERAL_SHARE))
        except BaseException:
            base_file.close()
            raise
        if delta is None:
            base_file.close()
            return prepared
        prepared.old, prepared.base, prepared.delta = candidate.tip, base_file, delta
        return prepared


def write_shard_pack(git_dir: Path, worktree: Path, candidates: list[Candidate], *,
                     cat_blob: Callable[[str, BinaryIO], None],
                     has_object: Callable[[str], bool],
                     blob_sizes: Callable[[list[str]], dict[str, int | None]],
                     level: int = 0) -> ShardPack | None:
    """Store the large work-tree files of ``candidates`` in packs of ``git_dir`` (see the
    module's docstring); None when none qualifies. One pack per :data:`HELD_MAX` bytes of
    deltas (the last one also holds the whole blobs), so memory stays bounded whatever the
    state's size. ``cat_blob(oid, file)`` writes a blob to a file through git,
    ``has_object(oid)`` says whether git has it, ``blob_sizes(oids)`` gives git's size of each
    blob (None: git does not list it as a blob); ``level``: the zlib level of whole blobs.
    Raises GitError or OSError; a pack git does not read back exactly is removed (earlier
    ones were read back and stay)."""
    pack_dir = git_dir / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    done: list[_Prepared] = []
    batch: list[_Prepared] = []
    seen: set[str] = set()
    with HelperPool(WORKERS) as pool:
        try:
            for p in _in_order(pool, lambda c: _prepare(c, worktree, git_dir, cat_blob,
                                                        has_object), candidates):
                if p is None:
                    continue
                if {p.old, p.new} & seen:  # a pack holds each object once
                    p.close()
                    continue
                seen |= {p.old, p.new} - {None}
                batch.append(p)
                if sum(len(q.delta or b"") for q in batch) >= HELD_MAX:
                    deltas = [q for q in batch if q.delta is not None]
                    batch = [q for q in batch if q.delta is None]
                    _pack_batch(git_dir, worktree, deltas, level, pool, cat_blob, blob_sizes)
                    done += deltas
            if batch:
                _pack_batch(git_dir, worktree, batch, level, pool, cat_blob, blob_sizes)
                done += batch
        finally:
            for p in batch:
                p.close()
    if not done:
        return None
    deltas = [p for p in done if p.delta is not None]
    return ShardPack(tuple(p.path for p in done), tuple(p.new for p in done), len(deltas),
                     sum(len(p.delta) for p in deltas), sum(p.size for p in done))


def _in_order(pool: HelperPool, work: Callable, items: list) -> Iterator:
    """``work(item)`` for each item, in order, with at most one result per worker waiting."""
    pending: collections.deque = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(work, item))
            if len(pending) > WORKERS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # an error: what was already prepared is let go
            future.cancel()
            if not future.cancelled() and future.exception() is None and future.result():
                future.result().close()


def _pack_batch(git_dir: Path, worktree: Path, batch: list[_Prepared], level: int,
                pool: HelperPool, cat_blob: Callable[[str, BinaryIO], None],
                blob_sizes: Callable[[list[str]], dict[str, int | None]]) -> None:
    """Write one pack of ``batch`` and let git read it back."""
    pack_dir = git_dir / "objects" / "pack"
    try:
        name = _install(pack_dir, worktree, batch, level)
    finally:
        for p in batch:
            p.close()
    deltas = [p for p in batch if p.delta is not None]
    checks = list(pool.map(lambda p: _reads_back(p, git_dir, cat_blob), deltas))
    wrong = [p.path for p, ok in zip(deltas, checks) if not ok]
    whole = [p for p in batch if p.delta is None]
    sizes = blob_sizes([p.new for p in whole]) if whole else {}
    wrong += [p.path for p in whole if sizes.get(p.new) != p.size]
    if wrong:
        for suffix in (".idx", ".pack"):
            (pack_dir / f"{name}{suffix}").unlink(missing_ok=True)
        raise GitError(f"{git_dir}: pack {name} removed again: git read other bytes back "
                       f"for {', '.join(wrong)} (the files are stored through git add)")


def _install(pack_dir: Path, worktree: Path, prepared: list[_Prepared], level: int) -> str:
    """Write the pack and its index; returns ``pack-<sha>``."""
    incoming = pack_dir / INCOMING
    count = sum(2 if p.delta is not None else 1 for p in prepared)
    with atomic_write(incoming) as out:
        pack = PackWriter(out.write, count, level=level)
        for p in prepared:
            if p.delta is None:
                _add_whole(pack, worktree, p)
                continue
            with mapped(p.base) as base:
                pack.add_blob(p.old, base)
            pack.add_delta(p.new, p.old, p.delta)
        pack_sha = pack.finish()
    name = f"pack-{pack_sha.hex()}"
    os.replace(incoming, pack_dir / f"{name}.pack")
    fsync_dir(pack_dir)
    atomic_write_bytes(pack_dir / f"{name}.idx", index_bytes(pack.entries, pack_sha))
    return name


def _add_whole(pack: PackWriter, worktree: Path, p: _Prepared) -> None:
    """The file whole, as hashed: its lstat key must not move from hashing to the end of
    the copy (the daemon wrote it and nothing else writes there; anything else is refused)."""
    file = _open_regular(worktree / p.path)
    if file is None:
        raise GitError(f"{worktree / p.path}: no longer a regular file while packing")
    with file, mapped(file) as data:
        if stat_key(os.fstat(file.fileno())) != p.key:
            raise GitError(f"{worktree / p.path}: changed after it was hashed")
        pack.add_blob(p.new, data)
        if stat_key(os.fstat(file.fileno())) != p.key:
            raise GitError(f"{worktree / p.path}: changed while it was packed")


def _reads_back(p: _Prepared, scratch: Path, cat_blob: Callable[[str, BinaryIO], None]
                ) -> bool:
    """Git reads the new blob (from the pack: it is stored nowhere else) as bytes whose SHA-1
    is its object id."""
    with tempfile.TemporaryFile(dir=scratch) as out:
        cat_blob(p.new, out)
        with mapped(out) as data:
            return len(data) == p.size and git_blob_id(data) == p.new
