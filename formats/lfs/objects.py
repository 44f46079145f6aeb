"""The local LFS object cache: files named by the SHA-256 of their bytes, and shard restore.

One folder holds stored objects (keyframes, residuals) and reconstructed shard files alike,
each under the SHA-256 of its content (a keyframe is its own shard: same bytes, same name).
A shard is restored by fetching its keyframe, or its residual and (recursively) its base, from
the LFS server when not cached; every file enters the cache only after its digest was checked,
and a restored shard is checked against the digest its sealed MANIFEST record names.

Example::

    store = ObjectStore(Path("state/lfs"), LfsClient(url, token))
    path = store.shard(record, older=lambda gen: manifest_of(gen).shard(record.path))
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Callable

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.errors import FormatError, LfsError
from snapops.formats.generation.manifest import ShardRecord
from snapops.formats.generation.residual import decode_residual, read_header

from .client import LfsClient

MAX_CHAIN = 64          # residuals applied in a row at most, whatever a MANIFEST claims
_HEX64 = re.compile(r"[0-9a-f]{64}")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            h.update(block)
    return h.hexdigest()


class ObjectStore:
    def __init__(self, root: str | os.PathLike, client: LfsClient | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.client = client
        self.fetched = 0        # objects downloaded by this store

    def path(self, sha: str) -> Path:
        if not _HEX64.fullmatch(sha or ""):
            raise FormatError("not a SHA-256 object id", check="lfs", expected="64 hex digits",
                              got=str(sha)[:80])
        return self.root / sha

    def has(self, sha: str, size: int | None = None) -> bool:
        p = self.path(sha)
        return p.is_file() and (size is None or p.stat().st_size == size)

    def put_file(self, src: Path) -> tuple[str, int]:
        """Add a copy of ``src`` (a hard link when possible); its (sha256, size)."""
        sha = file_sha256(src)
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

    def put_bytes(self, data: bytes) -> tuple[str, int]:
        sha = hashlib.sha256(data).hexdigest()
        if not self.path(sha).exists():
            atomic_write_bytes(self.path(sha), data)
        return sha, len(data)

    def fetch(self, oid: str, size: int) -> Path:
        """Object ``oid`` from the cache, or downloaded (checked by size and SHA-256)."""
        if self.has(oid, size):
            return self.path(oid)
        if self.client is None:
            raise LfsError(f"LFS object {oid} is not cached and no LFS server is configured")
        self.client.download(oid, size, self.path(oid))
        self.fetched += 1
        return self.path(oid)

    def shard(self, record: ShardRecord, older: Callable[[int], ShardRecord | None],
              path: str | None = None) -> Path:
        """The reconstructed file of ``record`` (cached under its sealed SHA-256); ``older(gen)``
        is the same path's record in generation ``gen``'s MANIFEST (the base of a residual)."""
        return self._shard(record, older, path or record.path, 0)

    def _shard(self, record: ShardRecord, older, path: str, depth: int) -> Path:
        if self.has(record.sha256, record.size):
            return self.path(record.sha256)
        if record.object is None or record.object_size is None:
            raise FormatError("an LFS-store shard without its stored object", path=path,
                              check="lfs", expected="object=<oid> object_size=<n>", got="-")
        if record.encoding == "key":
            if record.object != record.sha256 or record.object_size != record.size:
                raise FormatError("a keyframe's object must be the shard itself", path=path,
                                  check="lfs", expected=f"object={record.sha256}",
                                  got=f"object={record.object}")
            return self.fetch(record.object, record.object_size)
        if record.encoding != "res" or record.base is None:
            raise FormatError("unknown LFS encoding", path=path, check="lfs",
                              expected="key, or res with a base", got=str(record.encoding))
        if depth >= MAX_CHAIN or record.base >= record.gen:
            raise FormatError("residual chain too long or not going back in time", path=path,
                              check="lfs", expected=f"at most {MAX_CHAIN} residuals, base < gen",
                              got=f"base {record.base} of gen {record.gen}")
        base_record = older(record.base)
        if base_record is None:
            raise FormatError(f"the base of a residual (gen {record.base}) is not in the history",
                              path=path, check="lfs", expected=f"gen {record.base}'s MANIFEST",
                              got="nothing")
        base_file = self._shard(base_record, older, path, depth + 1)
        blob = self.fetch(record.object, record.object_size).read_bytes()
        head = read_header(blob, path)
        if head.target_sha256 != record.sha256 or head.target_length != record.size:
            raise FormatError("residual names another target than the MANIFEST", path=path,
                              check="lfs", expected=f"sha256={record.sha256}",
                              got=f"sha256={head.target_sha256}")
        data = decode_residual(base_file.read_bytes(), blob, path=path)
        atomic_write_bytes(self.path(record.sha256), data)
        return self.path(record.sha256)
