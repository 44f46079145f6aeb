"""The write side of the LFS store: a freshly written shard becomes a stored object (a keyframe
or a residual against an earlier shard of the same path), uploaded, and a pointer file in its
place.

Called by the generation writer for each rewritten shard, before the MANIFEST is sealed and
long before anything is committed, so no pointer is ever committed whose object is not on the
server. The full shard enters the local object cache (the base of later residuals).

Residuals skip back like Subversion's skip-deltas: the shards since a path's keyframe are
numbered 1, 2, 3, ...; shard ``i`` is stored as a residual against shard ``i & (i - 1)`` (its
number with the lowest set bit cleared: 1, 2 and 4 against the keyframe, 3 against 2, 5
against 4, 6 against 4, 7 against 6...). Restoring shard ``i`` applies ``popcount(i)``
residuals, so with ``keyframe_every = K`` a restore never applies more than K - 1 of them, while
a new keyframe is due only when the next number would need K (after 2**(K-1) - 1 residuals),
when the residual is not clearly smaller (at most ``RESIDUAL_MAX_SHARE`` of the shard), or when
it is not small (``LONG_CHAIN_MAX_SHARE``) and would make a chain of more than ``SHORT_CHAIN``:
a densely changing shard is restored from at most 3 residuals, a sparsely changing one from at
most K - 1 (number 15 is the first to need 4). Half
the residuals span one generation, a quarter two, and so on: a sparsely changing state costs a
few generations' changes per generation instead of a full keyframe every K. Each cached shard
keeps its *spine* beside it (``<sha256>.spine``: number, SHA-256, size and generation of the
shards later residuals of its path may use as bases); a shard without one starts a new
keyframe. After each commit the cache is trimmed to the spines of the committed generation.

Example::

    stash = LfsStash(ObjectStore(Path("state/lfs"), client), keyframe_every=8)
    record = stash.store(folder, record, prior, itemsize=4)   # the pointer is now in the tree
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from snapops.formats.atomic import atomic_write_bytes, mapped
from snapops.formats.errors import FormatError
from snapops.formats.generation.manifest import Manifest, ShardRecord
from snapops.formats.generation.residual import write_residual

from .client import LfsObject, offered_action
from .objects import ObjectStore
from .pointer import render_pointer

RESIDUAL_MAX_SHARE = 0.9
# Each residual costs a restore a pass over its whole shard (decoded, then XORed in), whatever
# its size. Past SHORT_CHAIN residuals a chain goes on only with residuals of at most
# LONG_CHAIN_MAX_SHARE of their shard (a sparse change: 1% of rows, 0.014); a dense one
# (float32 steps 0.55, bfloat16 0.075) starts a keyframe there instead: bench storage, bf16
# gen 128 (7 residuals per shard) 263 MB/s, with 3 at most about 500.
SHORT_CHAIN = 3
LONG_CHAIN_MAX_SHARE = 0.05


@dataclass(frozen=True)
class SpineEntry:
    number: int      # shards since the keyframe (0: the keyframe)
    sha256: str
    size: int
    gen: int         # the generation that wrote it (a residual's ``base``)

    def line(self) -> str:
        return f"{self.number} {self.sha256} {self.size} {self.gen}\n"


def base_numbers(number: int) -> list[int]:
    """The numbers a residual chain of shard ``number`` passes through, the shard first.

    >>> base_numbers(6), base_numbers(7), base_numbers(8)
    ([6, 4, 0], [7, 6, 4, 0], [8, 0])
    """
    out = [number]
    while number:
        number &= number - 1
        out.append(number)
    return out


@dataclass
class LfsStash:
    objects: ObjectStore
    keyframe_every: int = 8

    def spine(self, sha: str) -> list[SpineEntry] | None:
        """The spine of a cached shard (itself last); None when unknown or unreadable."""
        try:
            text = (self.objects.root / f"{sha}.spine").read_text(encoding="ascii")
            entries = [SpineEntry(int(n), h, int(size), int(gen))
                       for n, h, size, gen in (line.split() for line in text.splitlines())]
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return entries if entries and entries[-1].sha256 == sha else None

    def _set_spine(self, sha: str, entries: list[SpineEntry]) -> None:
        atomic_write_bytes(self.objects.root / f"{sha}.spine",
                           "".join(e.line() for e in entries).encode("ascii"))

    def trim(self, manifest: Manifest) -> int:
        """Forget every cached file but the shards of ``manifest`` (the last committed
        generation) and their spines: the bases of the next residuals; how many files went."""
        return self.trim_to(manifest.shards)

    def trim_to(self, shards: list[ShardRecord]) -> int:
        """Forget every cached file but ``shards`` and their spines; how many files went."""
        keep: set[str] = set()
        for shard in shards:
            spine = self.spine(shard.sha256) or []
            keep |= {e.sha256 for e in spine} | {shard.sha256, f"{shard.sha256}.spine"}
        gone = 0
        for path in self.objects.root.iterdir():
            if path.name not in keep and path.is_file():
                path.unlink(missing_ok=True)
                gone += 1
        return gone

    def _base(self, prior: ShardRecord | None, record: ShardRecord
              ) -> tuple[int, SpineEntry, list[SpineEntry]] | None:
        """(number, base, spine so far) for the next shard of ``prior``'s path, or None when
        a keyframe is due."""
        spine = self.spine(prior.sha256) if prior is not None else None
        if spine is None or record.plain_sha256:
            return None
        number = spine[-1].number + 1
        chain = base_numbers(number)
        if len(chain) - 1 > self.keyframe_every - 1:
            return None
        by_number = {e.number: e for e in spine}
        base = by_number.get(chain[1])
        if base is None or not self.objects.has(base.sha256, base.size):
            return None
        return number, base, [by_number[n] for n in reversed(chain[1:]) if n in by_number]

    def check_on_server(self, shards: list[ShardRecord]) -> None:
        """FormatError unless the LFS server holds the object of every shard (another node
        uploaded them): no pointer is committed whose object is not in the store."""
        client = self.objects.client
        objects = [(s.object, s.object_size) for s in shards if s.object is not None]
        if client is None or not objects:
            return
        for (oid, _), item in zip(objects, client.batch("upload", objects)):
            if item.get("error") or offered_action(item, "upload", oid) is not None:
                path = next(s.path for s in shards if s.object == oid)
                raise FormatError("another node's LFS object is not on the server", path=path,
                                  check="lfs", expected=f"object {oid} in the LFS store",
                                  got="missing")

    def store(self, folder: Path, record: ShardRecord, prior: ShardRecord | None,
              itemsize: int) -> ShardRecord:
        """Store the shard at ``folder/record.path``, upload its object, leave its pointer."""
        full = folder / record.path
        # the writer hashed the file as it wrote it: record.sha256 is its digest
        sha, size = self.objects.put_file(full, record.sha256)
        encoding, base_gen, oid, osize = "key", None, sha, size
        spine = [SpineEntry(0, sha, size, record.gen)]
        chosen = self._base(prior, record)
        if chosen is not None:
            number, base, kept = chosen
            # not fsync'd: a residual is only read back to be uploaded, before any pointer
            # names it, and goes at the next trim (never a base); a crash before the commit
            # serializes the generation again and writes it again (11% of a 4-rank serialize)
            share = RESIDUAL_MAX_SHARE if len(base_numbers(number)) - 1 <= SHORT_CHAIN \
                else LONG_CHAIN_MAX_SHARE
            with mapped(self.objects.path(base.sha256)) as old, mapped(full) as new:
                stored = self.objects.put_written(
                    lambda f: write_residual(old, new, f, itemsize=itemsize,
                                             base_sha256=base.sha256, target_sha256=sha),
                    max_size=int(share * size), durable=False)
            if stored is not None:
                oid, osize = stored
                encoding, base_gen = "res", base.gen
                spine = kept + [SpineEntry(number, sha, size, record.gen)]
        self._set_spine(sha, spine)
        client = self.objects.client
        if client is not None:
            client.upload([LfsObject(oid, osize, self.objects.path(oid))])
        atomic_write_bytes(full, render_pointer(oid, osize))
        return dataclasses.replace(record, object=oid, object_size=osize, encoding=encoding,
                                   base=base_gen)
