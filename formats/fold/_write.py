"""Writing FOLD: plan the chunks, encode them on worker threads, sink them in order.

``encode_chunk`` is the per-chunk pipeline of the spec (compress, CRC32C and SHA-256 of the
compressed bytes, Reed–Solomon parity of the compressed bytes); zstd, hashlib, crc32c and the
numpy parity kernel release the GIL, so two workers use both cores. ``write_fold`` follows the
peer's protocol on any seekable file: placeholder header, chunks, index, fsync, final header;
``save`` wraps it in the atomic-file helper (temp file, fsync, ``os.replace``, fsync folder).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator

import zstandard

from ..atomic import atomic_write_digest
from ..errors import DataError
from ..integrity import crc32c
from ..model import Snapshot
from ..workers import HelperPool
from . import _arrays as A
from . import _ecc
from ._layout import (
    DEFAULT_LIMITS, FLAG_NONE, FLAG_ZSTD, HEADER_LEN, ChunkEntry, Limits,
    index_bytes, pack_header,
)
from ._read import default_workers


@dataclass(frozen=True)
class Options:
    compression: str = "zstd"
    level: int = 3
    nsym: int = 0
    segment: int = A.SEGMENT
    workers: int = 0
    created_at: float = 0.0
    limits: Limits = DEFAULT_LIMITS

    @classmethod
    def build(cls, *, compression: str = "zstd", level: int = 3, ecc: str | int | None = "none",
              segment: int = A.SEGMENT, workers: int | None = None,
              created_at: float | None = None, limits: Limits | None = None) -> "Options":
        if compression not in ("zstd", "none"):
            raise DataError(f"compression must be 'zstd' or 'none', got {compression!r}")
        if isinstance(level, bool) or not isinstance(level, int) or not -(1 << 17) <= level <= 22:
            raise DataError(f"zstd level must be an integer <= 22, got {level!r}")
        limits = limits or DEFAULT_LIMITS
        if not 0 < segment <= limits.max_chunk:
            raise DataError(f"segment must be in (0, {limits.max_chunk}], got {segment}")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise DataError(f"workers must be a positive integer, got {workers!r}")
        if created_at is None:
            created_at = os.environ.get("SOURCE_DATE_EPOCH", 0)
        try:
            created_at = float(created_at)
        except (TypeError, ValueError):
            created_at = math.nan
        if not math.isfinite(created_at):
            raise DataError("created_at (or $SOURCE_DATE_EPOCH) must be a finite number of "
                            "seconds")
        return cls(compression, level, _ecc.parse_option(ecc), segment,
                   workers or default_workers(), created_at, limits)


@dataclass(frozen=True)
class Encoded:
    entry: ChunkEntry          # offset filled in by the sink
    comp: bytes | memoryview
    ecc: bytes


def encode_chunk(name: str, ctype: str, raw, opts: Options) -> Encoded:
    """Compress, checksum and protect one payload (runs on a worker thread)."""
    size = len(raw)
    if size > opts.limits.max_chunk:
        raise DataError(f"chunk {name!r}: {size} bytes exceeds MAX_CHUNK_SIZE "
                        f"({opts.limits.max_chunk})")
    if opts.compression == "zstd":
        comp = zstandard.ZstdCompressor(level=opts.level).compress(raw)
        flags = FLAG_ZSTD
    else:
        comp, flags = raw, FLAG_NONE
    if len(comp) > opts.limits.max_chunk:
        raise DataError(f"chunk {name!r}: compressed size {len(comp)} exceeds MAX_CHUNK_SIZE")
    ecc = _ecc.parity(comp, opts.nsym)
    entry = ChunkEntry(name=name, ctype=ctype, flags=flags, offset=0, comp_len=len(comp),
                       uncomp_len=size, crc32c=crc32c(comp),
                       sha256=hashlib.sha256(comp).hexdigest(),
                       ecc_algo=_ecc.algo_name(opts.nsym), ecc_len=len(ecc))
    return Encoded(entry, comp, ecc)


def iter_encoded(pieces: Iterable[tuple[str, str, object]], opts: Options) -> Iterator[Encoded]:
    """Encode ``(name, ctype, raw)`` pieces in order, at most ``2 * workers`` in flight."""
    if opts.workers <= 1:
        for name, ctype, raw in pieces:
            yield encode_chunk(name, ctype, raw, opts)
        return
    with HelperPool(opts.workers) as pool:
        window: deque = deque()
        try:
            for name, ctype, raw in pieces:
                window.append(pool.submit(encode_chunk, name, ctype, raw, opts))
                if len(window) >= 2 * opts.workers:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for future in window:
                future.cancel()


def plan(snapshot: Snapshot, opts: Options) -> tuple[list[tuple[str, str, object]], dict]:
    """Every chunk to write, in file order, and the metadata (without the hashes)."""
    pieces, table = A.plan_arrays(snapshot, opts.segment)
    metadata = {"snapops": {"layout": A.LAYOUT, "arrays": table,
                            "meta": A.meta_json(snapshot.meta)}}
    return [(name, A.NDAR, raw) for name, raw in pieces], metadata


class Flusher:
    """Starts writeback early: ``fdatasync`` on a background thread every ``every`` bytes, so
    the disk works while the next chunks compress and the final fsync finds little left."""

    def __init__(self, fd: int | None, every: int = 64 << 20) -> None:
        self.fd, self.every, self.pending = fd, every, 0
        self.error: OSError | None = None
        self._kick, self._stop = threading.Event(), threading.Event()
        self._thread = None
        if fd is not None:
            self._thread = threading.Thread(target=self._run, name="fold-flush", daemon=True)
            self._thread.start()

    def wrote(self, n: int) -> None:
        self.pending += n
        if self._thread is not None and self.pending >= self.every:
            self.pending = 0
            self._kick.set()

    def _run(self) -> None:
        while True:
            self._kick.wait()
            if self._stop.is_set():
                return
            self._kick.clear()
            try:
                os.fdatasync(self.fd)
            except OSError as exc:   # reported by close(); the final fsync decides anyway
                self.error = exc

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._kick.set()
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise self.error


def write_fold(handle: BinaryIO, pieces: Iterable[tuple[str, str, object]], metadata: dict,
               opts: Options, *, fsync: bool = False) -> list[ChunkEntry]:
    """The peer's write protocol on a seekable ``handle`` positioned at 0."""
    handle.write(pack_header())
    offset, entries = HEADER_LEN, []
    flusher = Flusher(handle.fileno() if fsync and hasattr(os, "fdatasync") else None)
    try:
        for enc in iter_encoded(pieces, opts):
            entry = _with_offset(enc.entry, offset)
            handle.write(entry.header_bytes())
            handle.write(enc.comp)
            handle.write(enc.ecc)
            entries.append(entry)
            flusher.wrote(entry.end - offset)
            offset = entry.end
    finally:
        flusher.close()
    index = index_bytes(entries, metadata, opts.created_at)
    if len(index) > opts.limits.max_index:
        raise DataError(f"index of {len(index)} bytes exceeds MAX_INDEX_SIZE "
                        f"({opts.limits.max_index}): too many arrays or chunks")
    handle.write(index)
    if fsync:
        handle.flush()
        os.fsync(handle.fileno())
    handle.seek(0)
    handle.write(pack_header(offset, len(index)))
    handle.seek(0, os.SEEK_END)
    return entries


def _with_offset(entry: ChunkEntry, offset: int) -> ChunkEntry:
    return ChunkEntry(**{**entry.__dict__, "offset": offset})


def save(snapshot: Snapshot, path: str | os.PathLike, **kw) -> dict:
    """Write atomically; the summary includes the file's SHA-256. The header (index offset and
    length) is only known once every chunk is compressed, so it is patched last and the
    digest costs one read of the fresh file from the page cache."""
    opts = Options.build(**kw)
    snapshot = Snapshot.coerce(snapshot)
    pieces, metadata = plan(snapshot, opts)
    with atomic_write_digest(path, seekable=True) as handle:
        entries = write_fold(handle, pieces, metadata, opts, fsync=True)
    return {"arrays": len(snapshot.arrays), "chunks": len(entries),
            "raw_bytes": snapshot.nbytes, "stored_bytes": sum(e.comp_len for e in entries),
            "ecc_bytes": sum(e.ecc_len for e in entries), "file_bytes": handle.size,
            "sha256": handle.hexdigest()}
