"""A generation source whose LFS-store shards read as their reconstructed files.

Wraps any :class:`~snapops.formats.generation.source.Source` (a folder, a commit's tree): the
MANIFEST, ledger and companions are read from it as they are; a shard of an ``store=lfs``
generation is its pointer file there, checked against the sealed MANIFEST record (object id
and size), then restored through the :class:`~snapops.formats.lfs.objects.ObjectStore`
(keyframe, or base plus at most ``keyframe_every - 1`` residuals) and handed out as the
cached file, whose SHA-256 the verifier checks as for any shard. So ``verify_generation`` and
``load_from_source`` on an ``LfsSource`` verify and load exact content; on the plain source
they verify the pointers only (nothing fetched).

Example::

    src = LfsSource(GitTreeSource(git, "run1/gen-000012", scratch), "run1", store,
                    manifests=tag_manifests(git, "run1"))
    snap = load_from_source(src, "run1")
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Callable, Iterator

from snapops.formats.errors import FormatError, GitError, LfsError
from snapops.formats.generation.manifest import (
    MAX_BYTES,
    Manifest,
    ShardRecord,
    gen_text,
    parse_manifest,
)
from snapops.formats.generation.source import Entry, Source
from snapops.formats.generation.verify import manifest_path, run_folder

from .objects import ObjectStore
from .pointer import MAX_POINTER, parse_pointer

BASE_WINDOW = 8     # older MANIFESTs read at once (keyframe_every 8: a chain reaches 7 back)


def tag_manifests(git, run: str) -> Callable[[int], bytes | None]:
    """Older MANIFESTs of ``run`` by gen, read from the tags ``<run>/gen-<gen6>`` of the
    repository behind ``git`` (a :class:`~snapops.hooks.gitio.Git`); None for a gen without
    one (or whose MANIFEST is larger than ``MAX_BYTES``). A residual's chain goes back one gen
    at a time: asked for gen g, one ``cat-file --batch`` reads g and the ``BASE_WINDOW - 1``
    gens before it that are not held yet (gen 30's four bases: one git process of 4 ms
    instead of four of 3-4 ms each), never more than ``MAX_BYTES`` in all."""
    held: dict[int, bytes] = {}
    lock = threading.Lock()           # shards are verified on worker threads

    def spec(gen: int) -> str:
        return f"refs/tags/{run}/gen-{gen_text(gen)}^{{commit}}:{manifest_path(run)}"

    def read(gen: int) -> bytes | None:
        with lock:
            if gen not in held:
                wanted = [g for g in range(gen, gen - BASE_WINDOW, -1)
                          if g >= 0 and g not in held]
                try:
                    found = git.small_blobs([spec(g) for g in wanted], MAX_BYTES)
                except GitError:     # the caller reports the missing base
                    return None
                held.update((g, found[spec(g)]) for g in wanted if found.get(spec(g)))
            return held.get(gen)
    return read


def check_pointer(data: bytes, path: str, record: ShardRecord) -> None:
    """The pointer in the tree names exactly the object the sealed MANIFEST record names."""
    pointer = parse_pointer(data, path)
    if (pointer.oid, pointer.size) != (record.object, record.object_size):
        raise FormatError("LFS pointer differs from the MANIFEST's stored object", path=path,
                          check="lfs-pointer",
                          expected=f"oid {record.object} size {record.object_size}",
                          got=f"oid {pointer.oid} size {pointer.size}")


class LfsSource:
    resolves_lfs = True
    # a shard rebuilt from residuals decodes them on two helpers of its own: two shards at
    # once keep both cores busy (three: 375 against 395 MB/s, medians of 16 alternating
    # 128 MiB restores)
    shards_at_once = 2

    def __init__(self, inner: Source, run: str, store: ObjectStore, *,
                 manifests: Callable[[int], bytes | None] = lambda gen: None) -> None:
        self.inner, self.run, self.store, self.manifests = inner, run, store, manifests
        self.label = f"{inner.label} (LFS objects resolved)"
        self._manifest: Manifest | None = None
        self._older: dict[int, Manifest | None] = {}
        self._prefetched = False
        self._prefetch_lock = threading.Lock()

    def _records(self) -> dict[str, ShardRecord]:
        if self._manifest is None:
            self._manifest = parse_manifest(self.inner.read(manifest_path(self.run), MAX_BYTES),
                                            manifest_path(self.run))
        if self._manifest.header.store != "lfs":
            return {}
        folder = run_folder(self.run)
        return {f"{folder}/{s.path}": s for s in self._manifest.shards}

    def entries(self, folder: str) -> dict[str, Entry]:
        found = self.inner.entries(folder)
        records = self._records()
        return {p: Entry(p, e.kind, records[p].size, None) if p in records else e
                for p, e in found.items()}

    def read(self, path: str, limit: int) -> bytes:
        if path not in self._records():
            return self.inner.read(path, limit)
        with self.file(path) as local:
            if local.stat().st_size > limit:
                raise FormatError("file larger than allowed here", path=path, check="limit",
                                  expected=f"at most {limit} bytes",
                                  got=f"{local.stat().st_size} bytes")
            return local.read_bytes()

    def hashed(self, local: Path) -> str | None:
        """The SHA-256 the object store computed for a shard file it handed out, when the
        file is unchanged since, or the one the inner source computed for a file it copied
        (the verifier then does not hash it again)."""
        inner = getattr(self.inner, "hashed", None)
        return self.store.hashed(local) or (inner(local) if inner is not None else None)

    def read_pointer(self, path: str) -> bytes:
        """The pointer file itself, as the tree holds it."""
        return self.inner.read(path, MAX_POINTER)

    @contextlib.contextmanager
    def file(self, path: str, *, digest: bool = True) -> Iterator[Path]:
        record = self._records().get(path)
        if record is None:
            with self.inner.file(path, digest=digest) as local:
                yield local
            return
        check_pointer(self.read_pointer(path), path, record)
        with self._prefetch_lock:     # shards are checked two at a time: one prefetch
            if not self._prefetched:
                self._prefetched = True
                self._prefetch()
        rel = path.removeprefix(run_folder(self.run) + "/")

        def older(gen: int) -> ShardRecord | None:
            return self._older_record(gen, rel)

        if digest:
            yield self.store.shard(record, older, path)
            return
        with self.store.unhashed_shard(record, older, path) as local:
            yield local

    def _prefetch(self) -> None:
        """Download every object the generation's shards need (their keyframes and residual
        chains, as far as the cache lacks them) in one go, several at a time. Best effort:
        whatever fails here is fetched, and reported, shard by shard."""
        wanted: list[tuple[str, int]] = []
        try:
            for path, record in self._records().items():
                rel = path.removeprefix(run_folder(self.run) + "/")
                start, residuals = self.store.chain(
                    record, lambda gen, rel=rel: self._older_record(gen, rel), path)
                wanted += self.store.objects_of(start, residuals)
            self.store.prefetch(wanted)
        except (FormatError, LfsError):
            return

    def _older_record(self, gen: int, rel: str) -> ShardRecord | None:
        if gen not in self._older:
            data = self.manifests(gen)
            self._older[gen] = parse_manifest(data, f"{manifest_path(self.run)} of gen {gen}") \
                if data else None
        older = self._older[gen]
        return older.shard(rel) if older is not None else None
