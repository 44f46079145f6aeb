"""An independent FOLD builder for tests: straight from the FOLD layout (docs/formats/fold.md), sharing no code with snapops.

It writes whatever it is told (sizes, flags, ECC bytes), so tests can forge well-hashed files
that lie in exactly one place.
"""

from __future__ import annotations

import hashlib
import json
import struct

import crc32c as _crc

MAGIC = b"FOLDv1\0\0"


def crc32c(data: bytes) -> int:
    return _crc.crc32c(data)


def chunk(name: str, ctype: str, comp: bytes, *, flags: int = 0, uncomp_len: int | None = None,
          ecc_algo: str = "none", ecc: bytes = b"") -> dict:
    return {"name": name, "ctype": ctype, "comp": comp, "flags": flags,
            "uncomp_len": len(comp) if uncomp_len is None else uncomp_len,
            "ecc_algo": ecc_algo, "ecc": ecc}


def manifest(metadata: dict) -> str:
    body = {k: v for k, v in metadata.items() if k != "manifest_hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def build(chunks: list[dict], metadata: dict | None = None, *, version: str = "1.2.0",
          index_patch=None) -> bytes:
    """A FOLD file; ``index_patch(index_dict)`` may edit the index before it is serialised."""
    out = bytearray(struct.pack(">8sIQQ", MAGIC, 28, 0, 0))
    entries = []
    for c in chunks:
        comp, ecc = c["comp"], c["ecc"]
        crc, sha = crc32c(comp), hashlib.sha256(comp).hexdigest()
        offset = len(out)
        out += struct.pack(">4sIQQII", c["ctype"].encode(), c["flags"], c["uncomp_len"],
                           len(comp), crc, len(ecc))
        out += comp + ecc
        entries.append({"name": c["name"], "ctype": c["ctype"], "flags": c["flags"],
                        "offset": offset, "header_len": 32, "comp_len": len(comp),
                        "uncomp_len": c["uncomp_len"], "crc32c": crc, "sha256": sha,
                        "ecc_algo": c["ecc_algo"], "ecc_len": len(ecc)})
    meta = dict(metadata or {})
    meta["chunk_hashes"] = {e["name"]: e["sha256"] for e in entries}
    meta["manifest_hash"] = manifest(meta)
    index = {"format": "fold", "version": version, "created_at_unix": 0.0, "metadata": meta,
             "chunks": entries}
    if index_patch:
        index_patch(index)
    raw = index if isinstance(index, bytes) else json.dumps(index, separators=(",", ":")).encode()
    index_off = len(out)
    out += raw
    out[:28] = struct.pack(">8sIQQ", MAGIC, 28, index_off, len(raw))
    return bytes(out)


def with_index(data: bytes, raw_index: bytes) -> bytes:
    """Replace a file's index bytes (and fix the header to point at them)."""
    _, _, off, _ = struct.unpack(">8sIQQ", data[:28])
    out = bytearray(data[:off]) + raw_index
    out[:28] = struct.pack(">8sIQQ", MAGIC, 28, off, len(raw_index))
    return bytes(out)


def index_of(data: bytes) -> dict:
    _, _, off, n = struct.unpack(">8sIQQ", data[:28])
    return json.loads(data[off:off + n])


def rehash(index: dict) -> dict:
    """Recompute manifest_hash after editing metadata (a consistent forgery)."""
    index["metadata"]["manifest_hash"] = manifest(index["metadata"])
    return index


def dump(index: dict) -> bytes:
    return json.dumps(index, ensure_ascii=False, separators=(",", ":")).encode()
