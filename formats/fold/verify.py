"""``verify`` and ``inspect`` for FOLD: every chunk checked, ECC repairs reported, no raising."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import FormatError
from ..report import Report
from . import _arrays as A
from ._layout import CHUNK_HEADER_LEN, HEADER_LEN, ChunkEntry, Limits, decode_json
from ._read import FoldFile

STRUCTURE_CHECKS = ("header", "index", "extents", "chunk_hashes", "manifest_hash", "arrays")
CHUNK_CHECKS = ("chunk_header", "ecc", "crc32c", "chunk_sha256", "decompress")


def verify(path: str | os.PathLike, *, limits: Limits | None = None,
           workers: int | None = None, use_mmap: bool = True) -> Report:
    """Check the whole file: header, index, hashes, extents, then every chunk (ECC, CRC32C,
    SHA-256, decompression, JSON and NPZ0 contents). ECC repairs and unusable ECC regions are
    listed in ``notes`` and ``details["ecc"]``; the file itself is never modified.

    >>> verify("model.fold").ok
    True
    """
    name = os.fspath(path)
    report = Report(path=name, format="fold")
    try:
        f = FoldFile.open(name, **({"limits": limits} if limits else {}), workers=workers,
                          use_mmap=use_mmap, check_parity=True)
    except FormatError as exc:
        return report.fail(exc)
    with f:
        for check in STRUCTURE_CHECKS:
            report.passed(check)
        report.details.update(kind="mind" if f.is_mind else "fold", version=f.index.version,
                              chunks=len(f.chunks))
        report.arrays = len(f.specs)
        report.raw_bytes = sum(c.uncomp_len for c in f.chunks)
        try:
            f._run(lambda entry: _verify_chunk(f, entry), list(f.chunks))
        except FormatError as exc:
            report.fail(exc)
        else:
            for check in CHUNK_CHECKS:
                report.passed(check)
        report.details["ecc"] = [r.to_dict() for r in f.events.results]
        report.notes.extend(r.note() for r in f.events.results)
        if any(c.ctype == A.TSAV for c in f.chunks):
            report.notes.append("TSAV (torch pickle) chunks checked for integrity only; "
                                "load() unpickles them with weights_only=True")
        if Path(name).suffix.lower() == ".mind" and not f.is_mind:
            report.notes.append("named .mind but has no ai_graph or ai_vectors chunk")
    return report


def _verify_chunk(f: FoldFile, entry: ChunkEntry) -> None:
    if entry.ctype == A.JSON:
        decode_json(f.read_chunk(entry.name), entry.payload_off, f"JSON chunk {entry.name!r}")
    elif entry.ctype == A.NPZ0:
        A.npz_arrays(f.read_chunk(entry.name), entry.name, f.limits.max_chunk,
                     f._where(entry))
    else:
        f.read_into(entry, None)


def inspect(path: str | os.PathLike) -> dict:
    """Header, index, array table and chunk list as plain data; reads no chunk payload.

    >>> inspect("model.mind")["kind"]
    'mind'
    """
    with FoldFile.open(path) as f:
        meta = {k: v for k, v in f.index.metadata.items() if k != "snapops"}
        return {
            "format": "fold", "path": f.path, "file_size": f.size,
            "kind": "mind" if f.is_mind else "fold", "version": f.index.version,
            "created_at_unix": f.index.created_at,
            "header": {"header_len": HEADER_LEN, "index_off": f.header.index_off,
                       "index_len": f.header.index_len},
            "layout": A.LAYOUT if f.specs or "snapops" in f.index.metadata else "peer",
            "arrays": [{"name": s.name, "dtype": s.dtype.str, "shape": list(s.shape),
                        "chunks": list(s.chunks)} for s in f.specs],
            "meta": dict(f.snap_meta),
            "metadata": meta,
            "chunks": [{**c.to_json(), "header_len": CHUNK_HEADER_LEN} for c in f.chunks],
        }
