"""Writing AERO: turn a Snapshot into a plan, then stream the plan into an atomic file.

A thread pool first computes the BLAKE3 digests the TOC, TIDX and PHSH need (from the arrays'
memory); then every byte is written once, in file order, weights straight from the arrays'
memory (no copy), so the file's SHA-256 is computed on the way; the file only appears under its
name once complete.
"""

from __future__ import annotations

import functools
import json
import os
import uuid as uuidlib
from dataclasses import dataclass
from typing import Annotated, Any, Sequence

import msgpack
import numpy as np
import zstandard

from ..atomic import atomic_write_digest
from ..contract import WORKERS, ZSTD_LEVEL, SaveOptions, between
from ..errors import DataError, LimitError
from ..model import Snapshot, raw_bytes
from . import _hash
from . import _spec as S
from ._layout import (ChunkSpec, ShardPlan, TensorSlot, ihsh_payload, page_count, pack_control,
                      phsh_length, phsh_payload, plan_file, plan_tensors, zero_toc_hashes)

@dataclass(frozen=True)
class Options(SaveOptions):
    """AERO writer options (``gen``/``ts``/``build`` go to ``meta.json``).

    ``shard_max`` (bytes per WTSH shard, default 2 GiB; a larger tensor gets its own shard),
    ``page_hashes`` (add PHSH per shard, default False), ``page_size`` (default 4 MiB),
    ``control_integrity`` (add IHSH, default True), ``model_name`` / ``architecture``
    (manifest ``model``; default ``meta["model_name"]`` / ``meta["architecture"]`` or ""),
    ``uuid`` (None: derived from the content, so equal input gives equal bytes; ``"random"``;
    or a fixed UUID / 16 bytes), ``zstd_level`` (default 6), ``workers`` (hash threads).
    """

    shard_max: Annotated[int, between(1)] = S.DEFAULT_SHARD_MAX
    page_hashes: bool = False
    page_size: Annotated[int, between(1, 1 << 40)] = S.PHSH_PAGE_SIZE_DEFAULT
    control_integrity: bool = True
    model_name: str | None = None
    architecture: str | None = None
    uuid: Any = None
    zstd_level: Annotated[int, ZSTD_LEVEL] = S.DEFAULT_ZSTD_LEVEL
    workers: Annotated[int, WORKERS] | None = None


@dataclass(frozen=True)
class Prepared:
    specs: list[tuple[str, int, tuple[int, ...], int, tuple]]
    buffers: list[memoryview]
    meta: dict


def prepare(snapshot: Snapshot) -> Prepared:
    """Names in byte order, each array's dtype code and little-endian bytes (a view if possible)."""
    snapshot = Snapshot.coerce(snapshot)
    meta = dict(snapshot.meta)
    packed = _packed_meta(meta.pop(S.PACKED_META_KEY, None))
    specs, buffers = [], []
    for name in snapshot.sorted_names():
        array = snapshot.arrays[name]
        if name in packed:
            if array.dtype != np.uint8 or array.ndim != 1:
                raise DataError(f"array {name!r}: packed tensors are 1-D uint8 byte arrays")
            info = packed[name]
            extra = tuple((k, info[k]) for k in ("quant_id", "quant_params") if k in info)
            spec = (name, S.DTYPE_PACKED, tuple(info["shape"]), int(array.nbytes), extra)
        else:
            code = S.dtype_code(array.dtype)
            if code is None:
                raise DataError(f"array {name!r}: dtype {array.dtype} has no AERO dtype code "
                                f"(supported: {', '.join(S.DTYPE_NAMES.values())})")
            if array.ndim > S.MAX_NDIM:
                raise DataError(f"array {name!r}: more than {S.MAX_NDIM} dimensions")
            spec = (name, code, tuple(int(d) for d in array.shape), int(array.nbytes), ())
        specs.append(spec)
        buffers.append(raw_bytes(array))
    return Prepared(specs, buffers, meta)


def _packed_meta(value: Any) -> dict:
    if value is None:
        return {}
    try:
        table = json.loads(value) if isinstance(value, str) else value
        if not isinstance(table, dict):
            raise TypeError("not an object")
        for info in table.values():
            if not all(type(d) is int and d >= 0 for d in info["shape"]):
                raise TypeError("shape must be non-negative integers")
    except (ValueError, TypeError, KeyError) as exc:
        raise DataError(f"meta[{S.PACKED_META_KEY!r}] must map names to "
                        f"{{'shape': [...], 'quant_id'?, 'quant_params'?}}: {exc}") from exc
    return table


def save(snapshot: Snapshot, path: str | os.PathLike, options: Options) -> dict:
    """Write ``snapshot`` as one AERO file; returns a summary (shards, tensors, bytes, sha256)."""
    prepared = prepare(snapshot)
    slots, shards = plan_tensors(prepared.specs, options.shard_max)
    summary = write_file(path, slots, shards, prepared.buffers, prepared.meta, options)
    del summary["tensor_hashes"]
    return summary


# ---- the sink ----------------------------------------------------------------------------------

def _chunk_list(shards: Sequence[ShardPlan], options: Options) -> list[ChunkSpec]:
    """Every chunk in file/TOC order; metadata lengths are placeholders (they come last)."""
    chunks = []
    if options.control_integrity:
        chunks.append(ChunkSpec(S.IHSH, S.NAME_IHSH, S.ChunkFlags.OPTIONAL, S.IHSH_PAYLOAD_SIZE,
                                S.IHSH_PAYLOAD_SIZE))
    for shard in shards:
        name = S.shard_name(shard.shard_id)
        chunks.append(ChunkSpec(S.WTSH, name, S.ChunkFlags.MMAP_CRITICAL, shard.size, shard.size))
        if options.page_hashes:
            size = phsh_length(name, options.page_size, shard.size)
            chunks.append(ChunkSpec(S.PHSH, S.phsh_name(shard.shard_id), S.ChunkFlags.OPTIONAL,
                                    size, size))
    chunks.append(ChunkSpec(S.MJSN, S.NAME_MJSN, 0, 0, 0))
    chunks.append(ChunkSpec(S.MMSG, S.NAME_MMSG, S.ChunkFlags.COMPRESSED_ZSTD, 0, 0))
    chunks.append(ChunkSpec(S.TIDX, S.NAME_TIDX,
                            S.ChunkFlags.COMPRESSED_ZSTD | S.ChunkFlags.INDEX, 0, 0))
    return chunks


def _hash_jobs(slots: Sequence[TensorSlot], shards: Sequence[ShardPlan],
               buffers: Sequence[memoryview], options: Options) -> list[_hash.HashJob]:
    jobs = []
    for shard in shards:
        sid = shard.shard_id
        segs = _hash.Segments(tuple((slots[i].data_off, buffers[i]) for i in shard.slots),
                              shard.size)
        jobs.append(_hash.HashJob(("shard", sid), (sid, 0, shard.size), shard.size, segs.pieces))
        for i in shard.slots:
            s = slots[i]
            jobs.append(_hash.HashJob(("tensor", i), (sid, s.data_off, s.data_off + s.data_len),
                                      s.data_len, buffers[i]))
        if options.page_hashes:
            ps = options.page_size
            for p in range(page_count(shard.size, ps)):
                lo, hi = p * ps, min(shard.size, (p + 1) * ps)
                jobs.append(_hash.HashJob(("page", sid, p), (sid, lo, hi), hi - lo,
                                          functools.partial(segs.pieces, lo, hi)))
    return jobs


def write_file(path: str | os.PathLike, slots: Sequence[TensorSlot],
               shards: Sequence[ShardPlan], buffers: Sequence[memoryview], meta: dict,
               options: Options, *, tensor_hashes: Sequence[bytes] | None = None) -> dict:
    """Stream one AERO file for planned ``slots``/``shards`` (AEROSET parts use this too).

    ``tensor_hashes`` (one per slot) lets a file list tensors it does not hold: the AEROSET
    ``index.aero`` is written with ``shards=[]`` and the digests its parts computed.
    """
    chunks = _chunk_list(shards, options)
    mjsn = _meta_json(meta, options)
    jobs = _hash_jobs(slots, shards, buffers, options)
    workers = _hash.default_workers() if options.workers is None else options.workers
    digests = _hash.run_jobs(jobs, workers)
    if tensor_hashes is not None:
        digests.update({("tensor", i): h for i, h in enumerate(tensor_hashes)})
    tail, manifest_chunks = _metadata(slots, shards, digests, mjsn, chunks, options)
    plan = plan_file(chunks[:-3] + tail)
    hashes = _toc_hashes(plan, digests, manifest_chunks, shards, options)
    uuid = _file_uuid(options.uuid, hashes)
    control, ihsh = _control(plan, hashes, uuid, options)
    with atomic_write_digest(path, stable=True) as f:     # views of the arrays, fresh bytes
        f.write(control)
        if ihsh is not None:
            _pad_to(f, plan.offsets[0])
            f.write(ihsh)
        _stream_weights(f, plan, slots, shards, buffers, digests, options)
        for i in range(len(chunks) - 3, len(chunks)):
            _pad_to(f, plan.offsets[i])
            f.write(manifest_chunks[i - (len(chunks) - 3)])
    return {"shards": len(shards), "tensors": len(slots), "file_size": f.size,
            "payload_bytes": sum(s.size for s in shards), "uuid": uuid.hex(),
            "sha256": f.hexdigest(),
            "tensor_hashes": [digests[("tensor", i)] for i in range(len(slots))]}


def _stream_weights(f, plan, slots, shards, buffers, digests: dict, options: Options) -> None:
    """Each WTSH straight from the arrays' memory, then its PHSH (writeback is started as the
    file grows: ``atomic_write_digest``)."""
    for shard in shards:
        _pad_to(f, plan.offsets[plan.index(S.WTSH, S.shard_name(shard.shard_id))])
        segs = _hash.Segments(tuple((slots[i].data_off, buffers[i]) for i in shard.slots),
                              shard.size)
        for piece in segs.pieces():
            f.write(piece)
        if options.page_hashes:
            _pad_to(f, plan.offsets[plan.index(S.PHSH, S.phsh_name(shard.shard_id))])
            f.write(_phsh_bytes(shard, digests, options))


def _pad_to(f, offset: int) -> None:
    gap = offset - f.tell()
    if gap < 0:
        raise AssertionError(f"layout overrun: at {f.tell()}, next chunk at {offset}")
    if gap:
        f.write(bytes(gap))


def _meta_json(meta: dict, options: Options) -> bytes:
    body = dict(meta)
    for key, value in (("model_name", options.model_name),
                       ("architecture", options.architecture)):
        if value is not None:
            body[key] = value
    try:
        return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise DataError(f"snapshot meta is not JSON-serialisable: {exc}") from exc


def _model(meta: dict, options: Options) -> dict:
    name = options.model_name if options.model_name is not None else meta.get("model_name", "")
    arch = (options.architecture if options.architecture is not None
            else meta.get("architecture", ""))
    return {"name": str(name), "architecture": str(arch)}


_ROLES = {S.IHSH: "control_integrity", S.MJSN: "json", S.MMSG: "manifest", S.TIDX: "tensors",
          S.WTSH: "weights", S.PHSH: "page_hashes"}


def _metadata(slots, shards, digests, mjsn: bytes, chunks: list[ChunkSpec],
              options: Options) -> tuple[list[ChunkSpec], list[bytes]]:
    """MJSN, MMSG and TIDX payloads (stored form) and their final chunk specs."""
    listing = []
    shard_info = []
    for i, c in enumerate(chunks):
        item = {"role": _ROLES[c.fourcc], "fourcc": c.fourcc.decode(), "toc_index": i}
        if c.fourcc in (S.WTSH, S.PHSH):
            item["shard_id"] = int(c.name[13:].split(".")[0])
        listing.append(item)
        if c.fourcc == S.WTSH:
            shard = next(s for s in shards if S.shard_name(s.shard_id) == c.name)
            shard_info.append({"shard_id": shard.shard_id, "toc_index": i,
                               "size_bytes": shard.size, "tensor_count": len(shard.slots),
                               "mmap_critical": True})
    meta = json.loads(mjsn)
    manifest = {"format": {"name": "AERO", "version": list(S.VERSION)},
                "model": _model(meta, options), "chunks": listing, "shards": shard_info}
    tidx = {"tensors": [_tidx_entry(s, digests[("tensor", i)]) for i, s in enumerate(slots)]}
    raw = [mjsn, msgpack.packb(manifest, use_bin_type=True), msgpack.packb(tidx, use_bin_type=True)]
    if max(len(r) for r in raw) > S.MAX_METADATA_ULEN:
        raise LimitError("tensor index or metadata chunk too large",
                         expected=f"<= {S.MAX_METADATA_ULEN} bytes", got=max(map(len, raw)))
    zc = zstandard.ZstdCompressor(level=options.zstd_level)
    stored = [raw[0], zc.compress(raw[1]), zc.compress(raw[2])]
    tail = [ChunkSpec(c.fourcc, c.name, c.flags, len(s), len(r))
            for c, s, r in zip(chunks[-3:], stored, raw)]
    for fourcc, data in zip((S.MJSN, S.MMSG, S.TIDX), raw):
        digests[("meta", fourcc)] = _hash.digest(data)
    return tail, stored


def _tidx_entry(slot: TensorSlot, digest: bytes) -> dict:
    entry = {"name": slot.name, "dtype": slot.dtype, "shape": list(slot.shape),
             "shard_id": slot.shard_id, "data_off": slot.data_off, "data_len": slot.data_len,
             "flags": 0}
    entry.update(dict(slot.extra))
    entry["hash_b3"] = digest.hex()
    return entry


def _phsh_bytes(shard: ShardPlan, digests: dict, options: Options) -> bytes:
    pages = page_count(shard.size, options.page_size)
    return phsh_payload(S.shard_name(shard.shard_id), options.page_size,
                        [digests[("page", shard.shard_id, p)] for p in range(pages)])


def _toc_hashes(plan, digests, manifest_chunks, shards, options) -> list[bytes]:
    hashes = []
    for c in plan.chunks:
        if c.fourcc == S.WTSH:
            hashes.append(digests[("shard", int(c.name[13:]))])
        elif c.fourcc == S.PHSH:
            shard = next(s for s in shards if S.phsh_name(s.shard_id) == c.name)
            hashes.append(_hash.digest(_phsh_bytes(shard, digests, options)))
        elif c.fourcc == S.IHSH:
            hashes.append(bytes(32))             # filled in by _patch_control
        else:
            hashes.append(digests[("meta", c.fourcc)])
    return hashes


def _file_uuid(option: Any, hashes: list[bytes]) -> bytes:
    """A fixed uuid, a random one (``"random"``), or by default one derived from the content."""
    if option is None:
        raw = bytearray(_hash.digest(b"aero-uuid\0" + b"".join(hashes))[:16])
        raw[6] = (raw[6] & 0x0F) | 0x80          # RFC 9562 version 8 (custom), variant 10
        raw[8] = (raw[8] & 0x3F) | 0x80
        return bytes(raw)
    if option == "random":
        return uuidlib.uuid4().bytes
    if isinstance(option, uuidlib.UUID):
        return option.bytes
    if isinstance(option, str):
        try:
            return uuidlib.UUID(option).bytes
        except ValueError as exc:
            raise DataError(f"uuid: {exc}") from exc
    if isinstance(option, (bytes, bytearray)) and len(option) == 16:
        return bytes(option)
    raise DataError(f"uuid must be None, 'random', a UUID, its string or 16 bytes; got {option!r}")


def _control(plan, hashes, uuid, options: Options) -> tuple[bytes, bytes | None]:
    """The control region (header, TOC, string table) and the IHSH payload covering it."""
    control = pack_control(plan, hashes, uuid)
    if not options.control_integrity:
        return bytes(control), None
    zeroed = zero_toc_hashes(control, plan.toc_offset, len(plan.chunks))
    payload = ihsh_payload(_hash.digest(zeroed), plan.payloads_start)
    entry = plan.toc_offset + S.TOC_HEADER_SIZE      # IHSH is TOC entry 0
    control[entry + S.HASH_FIELD.start:entry + S.HASH_FIELD.stop] = _hash.digest(payload)
    return bytes(control), payload
