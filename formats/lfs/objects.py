"""The local LFS object cache: files named by the SHA-256 of their bytes, and shard restore.

One folder holds stored objects (keyframes, residuals) and reconstructed shard files alike,
each under the SHA-256 of its content (a keyframe is its own shard: same bytes, same name).
A shard is restored by fetching its keyframe, or its residual and (recursively) its base, from
the LFS server when not cached; every file enters the cache only after its digest was checked,
a cached shard handed out as it is was first hashed (a damaged or planted one is removed and
fetched again), and a restored shard is checked against the digest its sealed MANIFEST record
names. A restore that proves shards by their arrays' sealed content digest asks for
:meth:`ObjectStore.unhashed_shard` instead: the chain's result without its SHA-256, in a private
file that never enters the cache.

Example::

    store = ObjectStore(Path("state/lfs"), LfsClient(url, token))
    path = store.shard(record, older=lambda gen: manifest_of(gen).shard(record.path))
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from snapops.formats._alloc import ask_huge_pages
from snapops.formats.atomic import (
    atomic_write,
    atomic_write_digest,
    fsync_dir,
)
from snapops.formats.errors import FormatError, LfsError
from snapops.formats.integrity import file_sha256
from snapops.formats.generation.manifest import ShardRecord
from snapops.formats.generation.residual import (
    HEADER,
    Planes,
    ResidualHeader,
    apply_planes,
    decompress_planes,
    planes_room,
    read_header,
)
from snapops.formats.limits import DEFAULT_LIMITS, check_declared
from snapops.formats.workers import HelperPool

from .client import DOWNLOAD_TEMP, LfsClient

IN_FLIGHT = 2           # residuals decoded at once, each into its own reused buffer
SPARE_BUFFERS = 8       # shard-sized buffers kept between shards (two rebuilt at once)
MAX_CHAIN = 64          # residuals applied in a row at most, whatever a MANIFEST claims
_HEX64 = re.compile(r"[0-9a-f]{64}")
_UNHASHED = re.compile(r"\.unhashed\.[0-9]+\.[0-9]+")      # see ObjectStore.unhashed_shard
STALE_DOWNLOAD = 3600.0  # seconds unwritten: a download temp a killed process left behind


class _OverCap(Exception):
    """A writer given to :meth:`ObjectStore.put_written` went past its ``max_size``."""


class _Capped:
    """A writer's file that stops the writer (``_OverCap``) once a write ends past ``cap``
    bytes; everything else is the file's."""

    def __init__(self, f: BinaryIO, cap: int) -> None:
        self._f, self._cap = f, cap

    def write(self, data) -> int:
        written = self._f.write(data)
        if self._f.tell() > self._cap:
            raise _OverCap
        return written

    def __getattr__(self, name: str):
        return getattr(self._f, name)


class _Spares:
    """Shard-sized byte buffers kept for the next shard to rebuild: fresh memory costs a page
    fault and a zeroed page per 4 KiB, about as much as the XOR done in it. At most
    ``SPARE_BUFFERS`` are kept."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        with self._lock:
            fits = [i for i, a in enumerate(self._free) if len(a) >= n]
            if fits:
                return self._free.pop(min(fits, key=lambda i: len(self._free[i])))
        return np.empty(n, np.uint8)

    def give(self, *buffers: np.ndarray) -> None:
        with self._lock:
            self._free.extend(buffers)
            self._free.sort(key=len)
            del self._free[:-SPARE_BUFFERS]


def _decoded(blobs: list[Path], heads: list[ResidualHeader], buffers: list[np.ndarray],
             path: str) -> Iterator[tuple[ResidualHeader, Planes] | None]:
    """Each residual's header and decompressed planes (sparse ones kept as their bitmap and
    values), in order, decoded ``len(buffers)`` at a time on a thread pool, each into one of
    ``buffers`` (each at least :func:`planes_room` of every residual): yielded planes are
    valid until the next ones are asked for. The first item is None, yielded as soon as the
    first decodes are under way (the caller reads its base meanwhile)."""
    def decode(blob: Path, head: ResidualHeader, out: np.ndarray) -> Planes:
        with open(blob, "rb") as f:
            f.seek(HEADER.size)
            return decompress_planes(f, head, out, path)

    todo = deque(zip(blobs, heads))
    pending: deque = deque()
    with HelperPool(len(buffers)) as pool:
        def submit(out: np.ndarray) -> None:
            if todo:
                blob, head = todo.popleft()
                pending.append((head, out, pool.submit(decode, blob, head, out)))

        for out in buffers:
            submit(out)
        yield None
        while pending:
            head, out, planes = pending.popleft()
            yield head, planes.result()
            submit(out)


class ObjectStore:
    """A folder of LFS objects and rebuilt shards, each named by its SHA-256. ``durable``:
    files are fsync'd before they are renamed into place; a restore's private cache, removed
    when the restore ends, passes False (nothing there has to outlive a crash: every file is
    checked against its digest when it is used, and a crash loses the folder anyway)."""

    def __init__(self, root: str | os.PathLike, client: LfsClient | None = None, *,
                 durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable
        self.root.mkdir(parents=True, exist_ok=True)
        self.client = client
        self.fetched = 0        # objects downloaded by this store
        self._hashed: dict[str, tuple[int, int, int, str]] = {}   # path -> stat, SHA-256
        self._spares = _Spares()
        self._discarded: set[str] = set()     # cached files whose bytes were not their name
        self._sweep_stale_downloads()

    def _sweep_stale_downloads(self) -> None:
        """Remove the temp files of downloads a killed process left (a live one's is written
        to at least once a minute: see the client's low-speed limit), and its unhashed
        rebuilt shards (a live restore loses nothing: its arrays map the file's pages)."""
        cutoff = time.time() - STALE_DOWNLOAD
        with os.scandir(self.root) as entries:
            for entry in entries:
                if (DOWNLOAD_TEMP.fullmatch(entry.name) or _UNHASHED.fullmatch(entry.name)) and \
                        entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    def path(self, sha: str) -> Path:
        if not _HEX64.fullmatch(sha or ""):
            raise FormatError("not a SHA-256 object id", check="lfs", expected="64 hex digits",
                              got=str(sha)[:80])
        return self.root / sha

    def hashed(self, path: Path) -> str | None:
        """The SHA-256 this store computed for ``path`` when it wrote or downloaded it, if the
        file is still the same (inode, size, modification time); else None."""
        known = self._hashed.get(str(path))
        try:
            st = os.stat(path)
        except OSError:
            return None
        if known is None or known[:3] != (st.st_ino, st.st_size, st.st_mtime_ns):
            return None
        return known[3]

    def _remember(self, path: Path, sha: str) -> None:
        st = os.stat(path)
        self._hashed[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns, sha)

    def has(self, sha: str, size: int | None = None) -> bool:
        p = self.path(sha)
        return p.is_file() and (size is None or p.stat().st_size == size)

    def put_file(self, src: Path, sha256: str | None = None) -> tuple[str, int]:
        """Add a copy of ``src`` (a hard link when possible); its (sha256, size). A caller
        that has just written ``src`` and hashed its bytes passes the digest."""
        sha = sha256 or file_sha256(src)
        target = self.path(sha)
        if not target.exists():
            tmp = target.with_name(f".{sha}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copyfile(src, tmp)
            os.replace(tmp, target)
        return sha, target.stat().st_size

    def put_written(self, write: Callable[[BinaryIO], object],
                    max_size: int | None = None, *,
                    durable: bool | None = None) -> tuple[str, int] | None:
        """Add the file ``write(f)`` produces (``f`` is seekable: a writer may patch a header
        last); its (sha256, size), or None, and nothing added, when it would come out larger
        than ``max_size`` (the writer is stopped by its first write past it, so a residual
        that does not pay is not computed to its end). Written, fsync'd (unless ``durable``
        is False; None: as the store is) and hashed under a private name, then renamed to
        its digest."""
        durable = self.durable if durable is None else durable
        incoming = self.root / f".incoming.{os.getpid()}.{threading.get_ident()}"
        try:
            try:
                with atomic_write_digest(incoming, seekable=True, durable=durable) as f:
                    write(f if max_size is None else _Capped(f, max_size))
            except _OverCap:
                return None
            sha = f.hexdigest()
            os.replace(incoming, self.path(sha))
        finally:
            incoming.unlink(missing_ok=True)
        if durable:
            fsync_dir(self.root)
        return sha, f.size

    def _trusted(self, sha: str, size: int) -> bool:
        """``has(sha, size)`` and the file's bytes are that digest: vouched for by this store,
        else hashed now (once). A file whose bytes are not its name (damaged, or planted in a
        shared cache) is removed, so that it is fetched or rebuilt again."""
        if not self.has(sha, size):
            return False
        path = self.path(sha)
        if self.hashed(path) == sha:
            return True
        if file_sha256(path) == sha:
            self._remember(path, sha)
            return True
        path.unlink(missing_ok=True)
        self._discarded.add(sha)
        return False

    def fetch(self, oid: str, size: int) -> Path:
        """Object ``oid`` from the cache, or downloaded (checked by size and SHA-256)."""
        if self.has(oid, size):
            return self.path(oid)
        if self.client is None:
            state = "damaged in the cache (removed)" if oid in self._discarded else "not cached"
            raise LfsError(f"LFS object {oid} is {state} and no LFS server is configured")
        self.client.download(oid, size, self.path(oid),   # checked: its SHA-256 is the oid
                             durable=self.durable)
        self._remember(self.path(oid), oid)
        self.fetched += 1
        return self.path(oid)

    def prefetch(self, objects: list[tuple[str, int]]) -> None:
        """Download the objects of ``(oid, size)`` not yet cached, several at a time (a
        restore asks for a whole generation's chains at once)."""
        missing = [o for o in dict.fromkeys(objects) if not self.has(*o)]
        if not missing or self.client is None:
            return
        try:
            self.client.download_many(missing, self.path,   # each checked against its oid
                                      durable=self.durable)
        finally:
            for oid, size in missing:
                if self.has(oid, size):
                    self._remember(self.path(oid), oid)
                    self.fetched += 1

    def shard(self, record: ShardRecord, older: Callable[[int], ShardRecord | None],
              path: str | None = None) -> Path:
        """The reconstructed file of ``record`` (cached under its sealed SHA-256); ``older(gen)``
        is the same path's record in generation ``gen``'s MANIFEST (the base of a residual)."""
        return self._shard(record, older, path or record.path)

    def chain(self, record: ShardRecord, older: Callable[[int], ShardRecord | None],
              path: str) -> tuple[ShardRecord, list[ShardRecord]]:
        """What rebuilding ``record`` starts from (a shard already cached, or a keyframe) and
        the residuals to apply to it, oldest first; FormatError on a malformed chain."""
        residuals: list[ShardRecord] = []       # newest first while walking back
        current = record
        while not self.has(current.sha256, current.size):
            if current.object is None or current.object_size is None:
                raise FormatError("an LFS-store shard without its stored object", path=path,
                                  check="lfs", expected="object=<oid> object_size=<n>", got="-")
            # before any byte is downloaded: the bases come from older MANIFESTs, read unsealed
            check_declared(f"LFS object of gen {current.gen}", current.object_size,
                           DEFAULT_LIMITS, path)
            if current.encoding == "key":
                if current.object != current.sha256 or current.object_size != current.size:
                    raise FormatError("a keyframe's object must be the shard itself", path=path,
                                      check="lfs", expected=f"object={current.sha256}",
                                      got=f"object={current.object}")
                break
            if current.encoding != "res" or current.base is None:
                raise FormatError("unknown LFS encoding", path=path, check="lfs",
                                  expected="key, or res with a base", got=str(current.encoding))
            if len(residuals) >= MAX_CHAIN or current.base >= current.gen:
                raise FormatError("residual chain too long or not going back in time",
                                  path=path, check="lfs",
                                  expected=f"at most {MAX_CHAIN} residuals, base < gen",
                                  got=f"base {current.base} of gen {current.gen}")
            residuals.append(current)
            base = older(current.base)
            if base is None:
                raise FormatError(f"the base of a residual (gen {current.base}) is not in the "
                                  "history", path=path, check="lfs",
                                  expected=f"gen {current.base}'s MANIFEST", got="nothing")
            current = base
        return current, residuals[::-1]

    def objects_of(self, start: ShardRecord, residuals: list[ShardRecord]
                   ) -> list[tuple[str, int]]:
        """The stored objects a :meth:`chain` needs (its start only when not cached)."""
        needed = residuals if self.has(start.sha256, start.size) else [start, *residuals]
        return [(r.object, r.object_size) for r in needed]

    @contextlib.contextmanager
    def unhashed_shard(self, record: ShardRecord, older: Callable[[int], ShardRecord | None],
                       path: str | None = None) -> Iterator[Path]:
        """:meth:`shard` for a caller that proves the shard another way (a restore, by its
        arrays' sealed content digest, or else by hashing it): a chain's result is rebuilt
        without its SHA-256 into a private file, removed on leaving, that never enters the
        cache (its name there would vouch for bytes nobody hashed); a shard without residuals
        comes as :meth:`shard` gives it."""
        path = path or record.path
        plan = self._plan(record, older, path)
        if isinstance(plan, Path):
            yield plan
            return
        own = self.root / f".unhashed.{os.getpid()}.{threading.get_ident()}"
        own.unlink(missing_ok=True)       # a killed restore's, with the same thread id
        try:
            with open(own, "xb+") as out:
                self._fill(out, *plan, path)
            yield own
        finally:
            own.unlink(missing_ok=True)

    def _shard(self, record: ShardRecord, older, path: str) -> Path:
        plan = self._plan(record, older, path)
        if isinstance(plan, Path):
            return plan
        self._rebuild(plan, record, path)
        self._remember(self.path(record.sha256), record.sha256)
        return self.path(record.sha256)

    def _plan(self, record: ShardRecord, older, path: str
              ) -> Path | tuple[Path, list[Path], list[ResidualHeader]]:
        """The cached file of ``record`` when no residual is to be applied, else what
        rebuilding it takes: its start, the residuals' objects and their checked headers."""
        start, residuals = self.chain(record, older, path)
        # a file handed out as it is cached must be what it is named: a damaged or planted one
        # goes, and is fetched or rebuilt (a chain's result is checked whole, by _rebuild)
        if not residuals and self.has(start.sha256, start.size) and \
                not self._trusted(start.sha256, start.size):
            start, residuals = self.chain(record, older, path)
        if self.has(start.sha256, start.size):
            first = self.path(start.sha256)
        else:
            first = self.fetch(start.object, start.object_size)
        if not residuals:
            return first
        blobs = [self.fetch(r.object, r.object_size) for r in residuals]
        return first, blobs, self._check_links(start, residuals, blobs, path)

    def _rebuild(self, plan: tuple[Path, list[Path], list[ResidualHeader]],
                 record: ShardRecord, path: str) -> None:
        """Rebuild into the cache file, put in place only once its SHA-256 is the sealed
        one."""
        digest = ""

        def check(_tmp: Path) -> None:
            if digest != record.sha256:
                raise FormatError(
                    "residual chain does not reproduce its target: a cached object may be "
                    f"damaged (remove the cache {self.root} and restore again)", path=path,
                    check="residual-digest", expected=f"sha256={record.sha256}",
                    got=f"sha256={digest}")

        with atomic_write(self.path(record.sha256), before_replace=check,
                          durable=self.durable) as out:
            digest = self._fill(out, *plan, path, sha256=True)

    def _fill(self, out: BinaryIO, first: Path, blobs: list[Path], heads: list[ResidualHeader],
              path: str, *, sha256: bool = False) -> str:
        """Apply the chain straight into the pages of ``out`` (a shared map of the file: no
        second copy of the shard through ``write``); the result's SHA-256 when asked."""
        longest = max([first.stat().st_size] + [h.target_length for h in heads])
        check_declared("residual target", longest, DEFAULT_LIMITS, path)
        room = max((planes_room(h) for h in heads), default=0)
        spares = [self._spares.take(room) for _ in range(IN_FLIGHT)]
        try:
            os.ftruncate(out.fileno(), longest)
            pages = mmap.mmap(out.fileno(), longest) if longest else None   # none of 0 bytes
            if pages is not None:     # 2 MiB folios: a bf16 restore 9-11% less CPU
                ask_huge_pages(pages)
            try:
                data = np.empty(0, np.uint8) if pages is None else np.frombuffer(pages, np.uint8)
                result = self._apply(first, blobs, heads, [data, *spares], path)
                length = len(result)
                digest = hashlib.sha256(result).hexdigest() if sha256 else ""
                del data, result
            finally:
                # after a failure the traceback may still hold views: the map then goes with
                # them, and the error that matters is the one raised
                with contextlib.suppress(BufferError):
                    if pages is not None:
                        pages.close()
        finally:
            self._spares.give(*spares)
        os.ftruncate(out.fileno(), length)
        return digest

    @staticmethod
    def _check_links(base: ShardRecord, residuals: list[ShardRecord], blobs: list[Path],
                     path: str) -> list[ResidualHeader]:
        """Each residual's header names the shard before it as its base and its own record's
        shard as its target (by SHA-256 and length): the chain is consistent before any byte
        is decoded. The headers, in chain order."""
        heads = []
        for record, blob in zip(residuals, blobs):
            with open(blob, "rb") as f:
                head = read_header(f.read(HEADER.size), path, total=blob.stat().st_size)
            if (head.base_sha256, head.base_length) != (base.sha256, base.size):
                raise FormatError("residual applied to the wrong base", path=path,
                                  check="residual-base", expected=f"base sha256={base.sha256}",
                                  got=f"sha256={head.base_sha256} (gen {record.gen})")
            if (head.target_sha256, head.target_length) != (record.sha256, record.size):
                raise FormatError("residual names another target than the MANIFEST", path=path,
                                  check="lfs", expected=f"sha256={record.sha256}",
                                  got=f"sha256={head.target_sha256} (gen {record.gen})")
            heads.append(head)
            base = record
        return heads

    @staticmethod
    def _apply(start: Path, blobs: list[Path], heads: list[ResidualHeader],
               buffers: list[np.ndarray], path: str) -> np.ndarray:
        """The start shard's bytes with every residual applied in order, in ``buffers[0]``
        (``buffers``: ``IN_FLIGHT + 1`` arrays, the first as long as the longest shard of the
        chain, the others :func:`planes_room` of its largest residual). XOR is associative,
        so no intermediate shard is built and only the final result is checked (by
        :meth:`_rebuild`). Each residual's dense planes are unshuffled and XORed into the
        shard in one pass of a C kernel, its sparse planes XORed in straight from their
        bitmaps (:func:`apply_planes`: a sparse change's residual touches only the items it
        changes and the planes it stores dense); the next residuals are decompressed on
        other cores meanwhile, each into one of the other buffers. (Combining a run of
        residuals in their plane layout first and unshuffling once needed one more
        shard-sized buffer, whose fresh pages cost more than the passes it saved: bf16 312 ->
        353 MB/s, f32 406 -> 430, medians of 16 and 12.)"""
        data, decoding = buffers[0], buffers[1:]
        length = start.stat().st_size
        with contextlib.closing(_decoded(blobs, heads, decoding, path)) as decoded:
            next(decoded)                   # the residuals are being decoded: read the base
            # lengths differ by a few header bytes from generation to generation: one buffer
            # as long as the longest, grown in place, costs less than a copy per step
            with open(start, "rb") as f:
                if f.readinto(memoryview(data)[:length]) != length:
                    raise FormatError("cached shard changed while read", path=path,
                                      check="lfs", expected=f"{length} bytes", got="fewer")
            for head, planes in decoded:
                if head.target_length > length:
                    data[length:head.target_length] = 0
                length = head.target_length
                apply_planes(data[:length], head, planes, path)
        return data[:length]
