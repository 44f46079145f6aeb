"""The write side of the LFS store: a freshly written shard becomes a stored object (a keyframe
or a residual against the same path's previous shard), uploaded, and a pointer file in its place.

Called by the generation writer for each rewritten shard, before the MANIFEST is sealed and
long before anything is committed, so no pointer is ever committed whose object is not on the
server. The full shard enters the local object cache (the base of the next residual). A
residual is stored when the previous shard is cached, the chain since the last keyframe is
shorter than ``keyframe_every - 1`` residuals, and it is clearly smaller (at most
``RESIDUAL_MAX_SHARE`` of the shard); otherwise a keyframe. The chain length of each cached
shard is kept beside it (``<sha256>.depth``); a shard without one starts a new keyframe. After each commit the cache is trimmed to the shards
of the committed generation.

Example::

    stash = LfsStash(ObjectStore(Path("state/lfs"), client), keyframe_every=8)
    record = stash.store(folder, record, prior, itemsize=4)   # the pointer is now in the tree
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.generation.manifest import Manifest, ShardRecord
from snapops.formats.generation.residual import encode_residual

from .client import LfsObject
from .objects import ObjectStore
from .pointer import render_pointer

RESIDUAL_MAX_SHARE = 0.9


@dataclass
class LfsStash:
    objects: ObjectStore
    keyframe_every: int = 8

    def depth(self, sha: str) -> int | None:
        """Residuals since the last keyframe for a cached shard; None when unknown."""
        try:
            text = (self.objects.root / f"{sha}.depth").read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def _set_depth(self, sha: str, depth: int) -> None:
        atomic_write_bytes(self.objects.root / f"{sha}.depth", f"{depth}\n".encode())

    def trim(self, manifest: Manifest) -> int:
        """Forget every cached file but the shards of ``manifest`` (the last committed
        generation: the bases of the next residuals); how many files went."""
        keep = {s.sha256 for s in manifest.shards}
        keep |= {f"{sha}.depth" for sha in keep}
        gone = 0
        for path in self.objects.root.iterdir():
            if path.name not in keep and path.is_file():
                path.unlink(missing_ok=True)
                gone += 1
        return gone

    def store(self, folder: Path, record: ShardRecord, prior: ShardRecord | None,
              itemsize: int) -> ShardRecord:
        """Store the shard at ``folder/record.path``, upload its object, leave its pointer."""
        full = folder / record.path
        sha, size = self.objects.put_file(full)
        encoding, base, oid, osize, depth = "key", None, sha, size, 0
        base_depth = self.depth(prior.sha256) if prior is not None else None
        if (prior is not None and base_depth is not None
                and base_depth + 1 <= self.keyframe_every - 1
                and self.objects.has(prior.sha256, prior.size) and not record.plain_sha256):
            blob = encode_residual(self.objects.path(prior.sha256).read_bytes(),
                                   full.read_bytes(), itemsize=itemsize)
            if len(blob) <= RESIDUAL_MAX_SHARE * size:
                oid, osize = self.objects.put_bytes(blob)
                encoding, base, depth = "res", prior.gen, base_depth + 1
        self._set_depth(sha, depth)
        client = self.objects.client
        if client is not None:
            client.upload([LfsObject(oid, osize, self.objects.path(oid))])
        atomic_write_bytes(full, render_pointer(oid, osize))
        return dataclasses.replace(record, object=oid, object_size=osize, encoding=encoding,
                                   base=base)
