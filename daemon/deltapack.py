"""Sparse pushes: before a generation is committed, its sparsely changed shards are stored
as git deltas of their versions at the branch tip, in a pack of the work repository; the
commit stages them by object id and ``git push`` sends the deltas.

Without this, pushing a 1%-rows change of a 128 MiB WTXT state cost git's delta search over
every rewritten shard twice (search, then again while writing: deltas over 64 KiB are never
cached), 16-23 s. Here each shard is compared with its previous version in 512-byte blocks
(:func:`snapops.daemon.gitpack.git_delta`), and one pack holds, per shard, the old blob whole
(a delta's base must be in the same pack) and the new blob as a delta. ``git push`` reuses
those deltas (``Total 7 (delta 4), reused 4 (delta 4)``) and sends the changed bytes.

Order of writes: the pack (temp file, fsync, rename to ``pack-<sha>.pack``), its index
(atomic), then every new blob is read back through git: it must hash to its object id, else
the pack is removed again and the commit stores the files whole, as usual. The commit then
stages those files by their object ids (``update-index --index-info``, no second hashing by
``git add``). A crash at any point leaves every object readable.

Example::

    packed = repo.pack_deltas(["snapshots/run1/shards/0000.wtxt"])
    packed.paths, packed.delta_bytes
    # -> (('snapshots/run1/shards/0000.wtxt',), 1163264)
"""

from __future__ import annotations

import collections
import os
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from snapops.formats.atomic import atomic_write, atomic_write_bytes, fsync_dir, mapped
from snapops.formats.errors import GitError
from snapops.formats.integrity import git_blob_id

from .gitpack import PackWriter, git_delta, index_bytes

__all__ = ["CONVERSIONS", "MIN_SIZE", "DeltaPack", "Tracked", "converted", "tracked_blobs",
           "write_delta_pack"]

MIN_SIZE = 1 << 20      # smaller blobs: git's own delta search is quick enough
LITERAL_SHARE = 0.25    # a delta whose literal bytes pass this share of the blob: not worth it
WORKERS = 2             # shards compared at once (numpy and hashlib release the GIL)
HELD_MAX = 64 << 20     # bytes of deltas held in memory before they are written as a pack
# attributes under which `git add` would store other bytes than the file's
CONVERSIONS = ("filter", "text", "eol", "ident", "working-tree-encoding")
INCOMING = "snapops-incoming.pack"   # git lists only *.idx with a *.pack: never seen by git


@dataclass(frozen=True)
class Tracked:
    """A regular file as the branch tip has it."""

    path: str
    oid: str      # hex object id of its blob


@dataclass(frozen=True)
class DeltaPack:
    """What :func:`write_delta_pack` stored."""

    paths: tuple[str, ...]     # shards now stored as deltas
    oids: tuple[str, ...]      # their blobs' object ids (read back through git)
    delta_bytes: int           # their deltas, before zlib
    blob_bytes: int            # the same shards whole


def tracked_blobs(ls_tree_z: bytes, paths: Iterable[str]) -> list[Tracked]:
    """The regular files among ``paths`` in ``git ls-tree -r -z`` output."""
    wanted = set(paths)
    out = []
    for record in ls_tree_z.split(b"\0"):
        meta, _, path = record.partition(b"\t")
        parts = meta.decode("ascii", "replace").split()
        name = path.decode("utf-8", "surrogateescape")
        if len(parts) == 3 and parts[0] == "100644" and parts[1] == "blob" and name in wanted:
            out.append(Tracked(name, parts[2]))
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
    old: str              # object ids
    new: str
    base: BinaryIO        # the old blob, in an unlinked temp file
    delta: bytes
    size: int


def _prepare(tracked: Tracked, worktree: Path, scratch: Path,
             cat_blob: Callable[[str, BinaryIO], None],
             has_object: Callable[[str], bool]) -> _Prepared | None:
    """The delta of a large work-tree file that changed sparsely since ``tracked``; else None."""
    try:  # the daemon's own file; a link, a folder or a FIFO put there is not read
        fd = os.open(worktree / tracked.path,
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    target_file = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        target_file.close()
        return None
    with target_file, mapped(target_file) as target:
        if len(target) < MIN_SIZE:
            return None
        new = git_blob_id(target)
        if new == tracked.oid or has_object(new):
            return None  # unchanged, or stored already (a retried commit): nothing to gain
        base_file = tempfile.TemporaryFile(dir=scratch)
        try:
            cat_blob(tracked.oid, base_file)
            with mapped(base_file) as base:
                delta = git_delta(base, target, int(len(target) * LITERAL_SHARE))
        except BaseException:
            base_file.close()
            raise
        if delta is None:
            base_file.close()
            return None
        return _Prepared(tracked.path, tracked.oid, new, base_file, delta, len(target))


def write_delta_pack(git_dir: Path, worktree: Path, tracked: list[Tracked], *,
                     cat_blob: Callable[[str, BinaryIO], None],
                     has_object: Callable[[str], bool], level: int = 0) -> DeltaPack | None:
    """Pack the work-tree files of ``tracked`` that changed sparsely as deltas of their
    tracked versions (see the module's docstring); None when none qualifies. One pack per
    :data:`HELD_MAX` bytes of deltas, so memory stays bounded whatever the state's size.
    ``cat_blob(oid, file)`` writes a blob to a file through git, ``has_object(oid)`` says
    whether git has it (then git reads that copy, not ours: it is not packed again);
    ``level``: the zlib level of the whole blobs. Raises GitError or OSError; a pack git
    does not read back exactly is removed (earlier ones were read back and stay)."""
    pack_dir = git_dir / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    done: list[_Prepared] = []
    batch: list[_Prepared] = []
    seen: set[str] = set()
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="snapops-delta") as pool:
        try:
            for p in _in_order(pool, lambda t: _prepare(t, worktree, git_dir, cat_blob,
                                                        has_object), tracked):
                if p is None:
                    continue
                if {p.old, p.new} & seen:  # a pack holds each object once
                    p.base.close()
                    continue
                seen |= {p.old, p.new}
                batch.append(p)
                if sum(len(q.delta) for q in batch) >= HELD_MAX:
                    _pack_batch(git_dir, batch, level, pool, cat_blob)
                    done += batch
                    batch = []
            if batch:
                _pack_batch(git_dir, batch, level, pool, cat_blob)
                done += batch
        finally:
            for p in batch:
                p.base.close()
    if not done:
        return None
    return DeltaPack(tuple(p.path for p in done), tuple(p.new for p in done),
                     sum(len(p.delta) for p in done), sum(p.size for p in done))


def _in_order(pool: ThreadPoolExecutor, work: Callable, items: list) -> Iterator:
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
                future.result().base.close()


def _pack_batch(git_dir: Path, batch: list[_Prepared], level: int,
                pool: ThreadPoolExecutor, cat_blob: Callable[[str, BinaryIO], None]) -> None:
    """Write one pack of ``batch`` and read its new blobs back through git."""
    pack_dir = git_dir / "objects" / "pack"
    try:
        name = _install(pack_dir, batch, level)
    finally:
        for p in batch:
            p.base.close()
    checks = list(pool.map(lambda p: _reads_back(p, git_dir, cat_blob), batch))
    wrong = [p.path for p, ok in zip(batch, checks) if not ok]
    if wrong:
        for suffix in (".idx", ".pack"):
            (pack_dir / f"{name}{suffix}").unlink(missing_ok=True)
        raise GitError(f"{git_dir}: delta pack {name} removed again: git read other bytes "
                       f"back for {', '.join(wrong)} (the files are stored whole instead)")


def _install(pack_dir: Path, prepared: list[_Prepared], level: int) -> str:
    """Write the pack and its index; returns ``pack-<sha>``."""
    incoming = pack_dir / INCOMING
    with atomic_write(incoming) as out:
        pack = PackWriter(out.write, 2 * len(prepared), level=level)
        for p in prepared:
            with mapped(p.base) as base:
                pack.add_blob(p.old, base)
            pack.add_delta(p.new, p.old, p.delta)
        pack_sha = pack.finish()
    name = f"pack-{pack_sha.hex()}"
    os.replace(incoming, pack_dir / f"{name}.pack")
    fsync_dir(pack_dir)
    atomic_write_bytes(pack_dir / f"{name}.idx", index_bytes(pack.entries, pack_sha))
    return name


def _reads_back(p: _Prepared, scratch: Path, cat_blob: Callable[[str, BinaryIO], None]
                ) -> bool:
    """Git reads the new blob (from the pack: it is stored nowhere else) as bytes whose SHA-1
    is its object id."""
    with tempfile.TemporaryFile(dir=scratch) as out:
        cat_blob(p.new, out)
        with mapped(out) as data:
            return len(data) == p.size and git_blob_id(data) == p.new
