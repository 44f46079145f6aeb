"""An independent, deliberately small AERO builder for hostile-input tests.

It packs whatever it is given (wrong hashes, bad flags, overlapping offsets...) with plain
``struct`` calls, without using snapops' own layout code, so tests can craft files the writer
would never produce.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack
import zstandard
from blake3 import blake3

HEADER = "<4sHHIQQQQQ16s28s"
TOC_ENTRY = "<4sIQQQIIQ32s"


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass
class Raw:
    fourcc: bytes
    name: str
    data: bytes                 # uncompressed content
    flags: int = 0
    compress: bool = False
    offset: int | None = None   # force a payload offset
    length: int | None = None   # force chunk_length
    ulen: int | None = None     # force chunk_ulen
    digest: bytes | None = None  # force the TOC hash


def build(chunks: list[Raw], *, version=(0, 1), file_flags: int = 0,
          uuid: bytes = bytes(16), trailing: bytes = b"") -> bytes:
    table = b""
    names = []
    for c in chunks:
        raw = c.name.encode()
        names.append((len(table), len(raw)))
        table += raw + b"\0"
    table = table.ljust(align(len(table), 8), b"\0")
    toc_len = 16 + 80 * len(chunks)
    st_off = align(96 + toc_len, 8)
    start = align(st_off + len(table), 16)
    stored = []
    for c in chunks:
        body = zstandard.ZstdCompressor().compress(c.data) if c.compress else c.data
        stored.append(body)
    offsets, cursor = [], start
    for c, body in zip(chunks, stored):
        cursor = align(cursor, 16)
        offsets.append(cursor if c.offset is None else c.offset)
        cursor = max(cursor, offsets[-1] + len(body))
    out = bytearray(max([start] + [o + len(b) for o, b in zip(offsets, stored)]))
    struct.pack_into(HEADER, out, 0, b"AERO", *version, 96, 96, toc_len, st_off, len(table),
                     file_flags, uuid, bytes(28))
    struct.pack_into("<IIQ", out, 96, len(chunks), 0, 0)
    for i, (c, body) in enumerate(zip(chunks, stored)):
        flags = c.flags | (1 if c.compress else 0)
        struct.pack_into(TOC_ENTRY, out, 112 + 80 * i, c.fourcc, flags, offsets[i],
                         len(body) if c.length is None else c.length,
                         len(c.data) if c.ulen is None else c.ulen, names[i][0], names[i][1], 0,
                         blake3(c.data).digest() if c.digest is None else c.digest)
    out[st_off:st_off + len(table)] = table
    for o, body in zip(offsets, stored):
        out[o:o + len(body)] = body
    return bytes(out) + trailing


def tidx(entries: list[dict]) -> Raw:
    return Raw(b"TIDX", "tensors", msgpack.packb({"tensors": entries}), flags=4, compress=True)


def entry(name="w", dtype=1, shape=(2,), shard_id=0, data_off=0, data_len=8, **extra) -> dict:
    return {"name": name, "dtype": dtype, "shape": list(shape), "shard_id": shard_id,
            "data_off": data_off, "data_len": data_len, "flags": 0, **extra}


def wtsh(data: bytes, shard_id: int = 0) -> Raw:
    return Raw(b"WTSH", f"weights.shard{shard_id}", data, flags=2)


def finish_ihsh(blob: bytes) -> bytes:
    """Fill TOC entry 0 (an IHSH placeholder) as AIP-0001 says: digest of the control region
    with every TOC hash zeroed, msgpack padded to 256 bytes, then the entry's own hash."""
    data = bytearray(blob)
    count = struct.unpack_from("<I", data, 96)[0]
    st_off, st_len = struct.unpack_from("<QQ", data, 28)
    start = align(st_off + st_len, 16)
    region = bytearray(data[:start])
    for i in range(count):
        region[112 + 80 * i + 48:112 + 80 * (i + 1)] = bytes(32)
    payload = msgpack.packb({"algo": "blake3-256", "covered_ranges": [[0, start]],
                             "digest": blake3(bytes(region)).digest()}).ljust(256, b"\0")
    off = struct.unpack_from("<Q", data, 112 + 8)[0]
    data[off:off + 256] = payload
    data[112 + 48:112 + 80] = blake3(payload).digest()
    return bytes(data)


def reference_style(arrays: dict, *, shard_id: int = 0, phsh_page: int = 16,
                    ihsh: bool = True) -> bytes:
    """A file laid out as the reference writer (f1d395d) lays it out: TOC order IHSH, MJSN,
    MMSG, TIDX, WTSH, PHSH; tensors packed back to back; no hash_b3; the PHSH area sized by
    the reference's estimate (80 + len(name) + 32*pages) with the real, shorter length in the
    TOC, which leaves a zero hole."""
    import json

    import numpy as np

    shard, entries, off = b"", [], 0
    for name, a in arrays.items():
        raw = np.ascontiguousarray(a).tobytes()
        code = {"float32": 1, "int8": 4, "uint8": 5, "int64": 10, "float16": 0}[a.dtype.name]
        entries.append({"name": name, "dtype": code, "shape": list(a.shape),
                        "shard_id": shard_id, "data_off": off, "data_len": len(raw), "flags": 0})
        shard += raw
        off += len(raw)
    sname = f"weights.shard{shard_id}"
    pages = [blake3(shard[i:i + phsh_page]).digest() for i in range(0, len(shard), phsh_page)]
    phsh = msgpack.packb({"shard_name": sname, "page_size": phsh_page, "digests": pages})
    base = 1 if ihsh else 0
    listing = ([{"role": "control_integrity", "fourcc": "IHSH", "toc_index": 0}] if ihsh else [])
    listing += [{"role": "json", "fourcc": "MJSN", "toc_index": base},
                {"role": "manifest", "fourcc": "MMSG", "toc_index": base + 1},
                {"role": "tensors", "fourcc": "TIDX", "toc_index": base + 2},
                {"role": "weights", "fourcc": "WTSH", "toc_index": base + 3, "shard_id": shard_id},
                {"role": "page_hashes", "fourcc": "PHSH", "toc_index": base + 4,
                 "shard_id": shard_id}]
    manifest = {"format": {"name": "AERO", "version": [0, 1]},
                "model": {"name": "ref", "architecture": "mlp"}, "chunks": listing,
                "shards": [{"shard_id": shard_id, "toc_index": base + 3, "size_bytes": len(shard),
                            "tensor_count": len(entries), "mmap_critical": True}]}
    meta = json.dumps({"architecture": "mlp", "model_name": "ref"}, separators=(",", ":"),
                      sort_keys=True).encode()
    chunks = ([Raw(b"IHSH", "control.integrity", bytes(256), flags=8)] if ihsh else []) + [
        Raw(b"MJSN", "meta.json", meta),
        Raw(b"MMSG", "manifest", msgpack.packb(manifest), compress=True),
        Raw(b"TIDX", "tensors", msgpack.packb({"tensors": entries}), flags=4, compress=True),
        Raw(b"WTSH", sname, shard, flags=2),
        Raw(b"PHSH", sname + ".phsh", phsh, flags=8)]
    blob = build(chunks)
    estimate = 80 + len(sname) + 32 * len(pages)
    blob += bytes(max(0, estimate - len(phsh)))     # reserved, unused PHSH room
    return finish_ihsh(blob) if ihsh else blob
