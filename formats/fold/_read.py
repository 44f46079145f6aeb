"""Reading FOLD: a source (bytes, mmap or preadv) checked chunk by chunk.

Per chunk: the binary header against the index, ECC (parity check, correction of the damaged
blocks), CRC32C and SHA-256 of the compressed bytes, then a bounded decompression straight into
the destination array. ``verify`` checks parity first, as the spec orders; ``load`` checks the
digests first and turns to the parity only when they fail (same bytes out, no parity cost on
intact files). The index's ``chunk_hashes`` and ``manifest_hash`` are checked once, on open.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field

import numpy as np
import zstandard

from ..errors import ChecksumError, FormatError
from ..limits import zstd_decompressor
from ..integrity import crc32c
from ..model import ArrayMapping, Snapshot
from ..workers import run_all
from . import _arrays as A
from . import _ecc
from ._layout import (
    CHUNK_HEADER_LEN, DEFAULT_LIMITS, FLAG_ZSTD, HEADER_LEN, ChunkEntry, Index, Limits, is_mind,
    parse_chunk_header, parse_header, parse_index,
)
from ._source import BufferSource, FileSource, open_source


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


@dataclass
class ChunkResult:
    """What reading one chunk found: ECC repairs, or an ECC region that does not fit intact data."""

    name: str
    ecc_algo: str = "none"
    repair: _ecc.Repair | None = None
    ecc_unusable: bool = False
    stale_blocks: int = 0

    def note(self) -> str | None:
        if self.repair and (self.repair.data_bytes or self.repair.parity_bytes):
            r = self.repair
            return (f"chunk {self.name!r}: {self.ecc_algo} corrected {r.data_bytes} data and "
                    f"{r.parity_bytes} parity bytes in {r.bad_blocks} of {r.blocks} blocks")
        if self.ecc_unusable:
            return (f"chunk {self.name!r}: {self.ecc_algo} parity disagrees with the intact data "
                    f"in {self.stale_blocks} blocks; ECC region unusable, data accepted on its "
                    "CRC32C and SHA-256 (pyfolds 1.0.2 writes such regions for multi-block chunks)")
        return None

    def to_dict(self) -> dict:
        r = self.repair or _ecc.Repair()
        return {"chunk": self.name, "ecc_algo": self.ecc_algo, "bad_blocks": r.bad_blocks,
                "corrected_data_bytes": r.data_bytes, "corrected_parity_bytes": r.parity_bytes,
                "corrected_offsets": r.positions, "ecc_unusable": self.ecc_unusable}


@dataclass
class Events:
    """ECC findings gathered while reading (thread-safe enough: list.append is atomic)."""

    results: list[ChunkResult] = field(default_factory=list)

    def add(self, result: ChunkResult) -> None:
        if result.repair and (result.repair.data_bytes or result.repair.parity_bytes) \
                or result.ecc_unusable:
            self.results.append(result)


class FoldFile(ArrayMapping):
    """A FOLD file opened over a source (bytes, mmap or positional reads).

    ``FoldFile.open(path, use_mmap=...)`` opens a file; ``FoldFile(data)`` parses bytes.

    Example::

        with FoldFile.open("model.fold", use_mmap=True) as f:
            f.names, f["w"].shape
        # -> (['w'], (2, 3))
    """

    def __init__(self, source, *, path: str | None = None, limits: Limits = DEFAULT_LIMITS,
                 workers: int | None = None, trusted: bool = False,
                 check_parity: bool = False) -> None:
        self.source = source if isinstance(source, (BufferSource, FileSource)) \
            else BufferSource(source)
        self.path = path
        self.limits = limits
        self.workers = workers or default_workers()
        self.trusted = trusted
        self.check_parity = check_parity
        self.events = Events()
        self._repair_budget = limits.max_ecc_repairs
        self._budget_lock = threading.Lock()
        self._foreign: dict[str, np.ndarray] | None = None
        self._foreign_meta: dict = {}
        try:
            self._parse()
        except FormatError as exc:
            self.source.close()
            if path:
                exc.located(path)
            raise
        except BaseException:
            self.source.close()
            raise

    def _parse(self) -> None:
        self.size = self.source.size
        head = self.source.read(0, min(self.size, HEADER_LEN))
        self.header = parse_header(head, self.size, self.limits)
        raw = self.source.read(self.header.index_off, self.header.index_len)
        self.index: Index = parse_index(raw, self.header, self.limits)
        self.by_name = {c.name: c for c in self.index.chunks}
        self.number = {c.name: i for i, c in enumerate(self.index.chunks)}
        table = A.parse_table(self.index.metadata, self.by_name,
                              dict(offset=self.header.index_off))
        self.specs, self.snap_meta = table if table else ([], {})
        self._spec = {s.name: s for s in self.specs}

    @classmethod
    def open(cls, path: str | os.PathLike, *, use_mmap: bool = True, **kw) -> "FoldFile":
        name = os.fspath(path)
        return cls(open_source(name, use_mmap), path=name, **kw)

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        self.source.close()


    # -- chunks ---------------------------------------------------------------------------------

    @property
    def chunks(self) -> tuple[ChunkEntry, ...]:
        return self.index.chunks

    @property
    def is_mind(self) -> bool:
        return is_mind(self.index.chunks)

    def _where(self, entry: ChunkEntry) -> dict:
        return dict(path=self.path, offset=entry.offset, chunk=self.number[entry.name])

    def checked_payload(self, entry: ChunkEntry) -> tuple[bytes | memoryview, ChunkResult]:
        """The chunk's compressed bytes after the ECC and CRC32C/SHA-256 checks.

        With ``check_parity`` (verify) every block's parity is checked first, as the spec
        orders. Without it (load) intact data is recognised by its CRC32C and SHA-256 and the
        parity is only consulted when they fail: the bytes returned are the same either way,
        and reading a protected file costs no more than reading an unprotected one.
        """
        where = self._where(entry)
        parse_chunk_header(self.source.read(entry.offset, CHUNK_HEADER_LEN), entry, where)
        stored = self.source.read(entry.payload_off, entry.comp_len + entry.ecc_len,
                                  scratch=True)
        comp, ecc = stored[:entry.comp_len], stored[entry.comp_len:]
        result = ChunkResult(entry.name, entry.ecc_algo)
        nsym = _ecc.parse_algo(entry.ecc_algo, where)
        if not nsym or not self.check_parity:
            if self._check_digests(comp, entry, where, raise_=not nsym):
                return comp, result
        bad = _ecc.bad_blocks(comp, ecc, nsym)
        if bad.size == 0:
            self._check_digests(comp, entry, where, raise_=True)
            return comp, result
        if self.check_parity and self._check_digests(comp, entry, where, raise_=False):
            result.ecc_unusable, result.stale_blocks = True, int(bad.size)
            self.events.add(result)
            return comp, result
        try:
            self._reserve_repairs(int(bad.size))
            fixed, result.repair = _ecc.correct(comp, ecc, nsym, bad)
        except _ecc.Uncorrectable as exc:
            raise ChecksumError(f"chunk {entry.name!r} is damaged beyond what "
                                f"{entry.ecc_algo} can correct: {exc}", **where, check="ecc",
                                expected="<= N/2 byte errors per block", got=int(bad.size)) \
                from None
        self._check_digests(fixed, entry, where, raise_=True, after_ecc=True)
        self.events.add(result)
        return bytes(fixed), result

    def _reserve_repairs(self, blocks: int) -> None:
        """Reed–Solomon decoding is slow: a file gets ``max_ecc_repairs`` blocks in all."""
        with self._budget_lock:
            if blocks > self._repair_budget:
                raise _ecc.Uncorrectable(
                    f"{blocks} damaged ECC blocks; at most {self.limits.max_ecc_repairs} are "
                    "repaired per file")
            self._repair_budget -= blocks

    def _check_digests(self, comp, entry: ChunkEntry, where: dict, *, raise_: bool,
                       after_ecc: bool = False) -> bool:
        suffix = " after ECC correction" if after_ecc else ""
        crc = crc32c(comp)
        if crc != entry.crc32c:
            if raise_:
                raise ChecksumError(f"chunk {entry.name!r} CRC32C{suffix}", **where,
                                    check="crc32c", expected=f"{entry.crc32c:08x}",
                                    got=f"{crc:08x}")
            return False
        sha = hashlib.sha256(comp).hexdigest()
        if sha != entry.sha256:
            if raise_:
                raise ChecksumError(f"chunk {entry.name!r} SHA-256{suffix}", **where,
                                    check="chunk_sha256", expected=entry.sha256, got=sha)
            return False
        return True

    def read_into(self, entry: ChunkEntry, out: np.ndarray | None) -> int:
        """Check ``entry`` and decompress it into ``out`` (uint8, exactly uncomp_len long);
        with ``out=None`` only count the bytes. Returns the uncompressed size."""
        comp, _ = self.checked_payload(entry)
        where = self._where(entry)
        if entry.flags != FLAG_ZSTD:
            if out is not None:
                out[:] = np.frombuffer(comp, np.uint8)
            return entry.comp_len
        try:
            return _unzstd(comp, out, entry.uncomp_len)
        except zstandard.ZstdError as exc:
            raise FormatError(f"chunk {entry.name!r} does not decompress", **where,
                              check="zstd", got=str(exc)) from exc
        except _SizeMismatch as exc:
            raise FormatError(f"chunk {entry.name!r} decompressed size", **where, check="zstd",
                              expected=f"{entry.uncomp_len} bytes", got=exc.args[0]) from None

    def read_chunk(self, name: str) -> bytes | memoryview:
        """One chunk's uncompressed payload, fully checked (like the peer's read_chunk_bytes);
        bytes, or a memoryview (no extra copy) from 1 MiB up."""
        entry = self.entry(name)
        out = A.alloc(entry.uncomp_len, self._where(entry), name)
        self.read_into(entry, out)
        return out.tobytes() if out.size < (1 << 20) else memoryview(out)

    def entry(self, name: str) -> ChunkEntry:
        try:
            return self.by_name[name]
        except KeyError:
            raise FormatError("no such chunk", path=self.path, expected="one of "
                              + ", ".join(list(self.by_name)[:8]), got=name) from None

    # -- arrays ---------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs] + list(self._peer_arrays())

    def meta(self) -> dict:
        self._peer_arrays()
        return {**self.snap_meta, **self._foreign_meta}

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        if name in self._spec:
            return self._spec[name].dtype, tuple(self._spec[name].shape)
        return super().spec(name)

    def array(self, name: str) -> np.ndarray:
        """One array, reading only its chunks (a writable copy, independent of the map)."""
        if name in self._spec:
            return self._read_arrays([self._spec[name]])[name]
        peer = self._peer_arrays()
        if name in peer:
            return peer[name]
        raise FormatError("no such array", path=self.path, array=name,
                          expected="one of " + ", ".join(self.names[:8]), got=name)

    def load(self) -> Snapshot:
        arrays = self._read_arrays(self.specs)
        for name, value in self._peer_arrays().items():
            if name in arrays:
                raise FormatError("peer chunk array collides with an NDAR array", path=self.path,
                                  array=name, expected="unique names", got=name)
            arrays[name] = value
        return Snapshot(arrays, self.meta())

    def _read_arrays(self, specs: list[A.ArraySpec]) -> dict[str, np.ndarray]:
        flats, jobs = {}, []
        for spec in specs:
            first = self.by_name[spec.chunks[0]]
            flat = A.alloc(spec.nbytes, self._where(first), spec.name)
            flats[spec.name] = flat
            at = 0
            for cname in spec.chunks:
                entry = self.by_name[cname]
                jobs.append((entry, flat[at:at + entry.uncomp_len]))
                at += entry.uncomp_len
        self._run(lambda job: self.read_into(*job), jobs)
        return {s.name: A.shaped(flats[s.name], s) for s in specs}

    def _run(self, fn, jobs: list) -> list:
        return run_all(fn, jobs, self.workers)

    def _peer_arrays(self) -> dict[str, np.ndarray]:
        """Arrays of TSAV and NPZ0 chunks (peer files), read once on first use."""
        if self._foreign is not None:
            return self._foreign
        arrays: dict[str, np.ndarray] = {}
        meta: dict = {}
        for entry in self.index.chunks:
            if entry.ctype not in (A.TSAV, A.NPZ0):
                continue
            raw = self.read_chunk(entry.name)
            where = self._where(entry)
            if entry.ctype == A.TSAV:
                found, extra = A.torch_arrays(raw, entry.name, self.trusted, where)
                meta.update(extra)
            else:
                found = A.npz_arrays(raw, entry.name, self.limits.max_chunk, where)
            prefix = "" if entry.name == "torch_state" else f"{entry.name}/"
            for key, value in found.items():
                if prefix + key in arrays:
                    raise FormatError("two peer chunks hold the same array name", **where,
                                      array=prefix + key, expected="unique names", got=key)
                arrays[prefix + key] = value
        for key in ("model_type", "protection"):
            value = self.index.metadata.get(key)
            if isinstance(value, str):
                meta[f"fold.{key}"] = value
        self._foreign, self._foreign_meta = arrays, meta
        return arrays


class _SizeMismatch(Exception):
    pass


def _unzstd(comp, out: np.ndarray | None, size: int) -> int:
    """Decompress into ``out`` (or count), refusing anything but exactly ``size`` bytes."""
    reader = zstd_decompressor().stream_reader(comp, read_size=1 << 20,
                                                        read_across_frames=True)
    with reader:
        if out is not None:
            view, done = memoryview(out), 0
            while done < size:
                n = reader.readinto(view[done:])
                if not n:
                    raise _SizeMismatch(done)
                done += n
            view.release()
        else:
            done = 0
            while done <= size:
                piece = reader.read(min(1 << 20, size - done + 1))
                if not piece:
                    break
                done += len(piece)
            if done != size:
                raise _SizeMismatch(done)
        if reader.read(1):
            raise _SizeMismatch(f"more than {size}")
    return size
