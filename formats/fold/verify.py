"""``verify_file`` for FOLD: every chunk checked, ECC repairs reported, no raising (the format
contract's ``verify`` calls it)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import FormatError
from ..report import Report
from . import _arrays as A
from ._layout import ChunkEntry, Limits, decode_json
from ._read import FoldFile

STRUCTURE_CHECKS = ("header", "index", "extents", "chunk_hashes", "manifest_hash", "arrays")
CHUNK_CHECKS = ("chunk_header", "ecc", "crc32c", "chunk_sha256", "decompress")


def verify_file(path: str | os.PathLike, *, limits: Limits | None = None,
                workers: int | None = None, use_mmap: bool = True) -> Report:
    """Check the whole file: header, index, hashes, extents, then every chunk (ECC, CRC32C,
    SHA-256, decompression, JSON and NPZ0 contents). ECC repairs and unusable ECC regions are
    listed in ``notes`` and ``details["ecc"]``; the file itself is never modified.

    Example::

        verify_file("model.fold", use_mmap=False).ok
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
