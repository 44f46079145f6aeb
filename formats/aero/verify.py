"""Verifying AERO files, in two levels.

``control``: the header, TOC and string table parse and respect every bound; the metadata chunks
(TIDX, and MJSN/MMSG when read) match their BLAKE3; IHSH (AIP-0001) matches the control region.
``full``: all of that, plus the BLAKE3 of every chunk's uncompressed bytes, TIDX bounds and no
overlap, PHSH page digests (AIP-0002), every tensor's ``hash_b3``, and zero padding between
extents. Hashing runs on a thread pool over the mmap; identical byte ranges are hashed once.

The first failure is reported with the name of its check: ``grammar``, ``truncated``, ``limit``,
``version``, ``extents``, ``tidx``, ``tidx_bounds``, ``tidx_overlap``, ``ihsh``, ``manifest``,
``chunk_blake3``, ``phsh``, ``tensor_blake3``, ``padding``.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import ChecksumError, FormatError
from ..report import Report
from . import _decode, _hash
from . import _spec as S
from ._layout import page_count, zero_toc_hashes
from ._read import AeroFile, Chunk

LEVELS = ("control", "full")


def verify_file(path: str | os.PathLike, level: str = "full", *,
                workers: int | None = None) -> Report:
    """Check an AERO file; ``report.ok`` is False and ``report.failure`` names the check otherwise
    (the format contract's ``verify`` calls this with ``options.level``).

    Example::

        verify_file("model.aero", level="control").ok
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    report = Report(path=os.fspath(path), format="aero")
    report.details["level"] = level
    try:
        with AeroFile(path) as f:
            report.passed("structure")
            report.arrays = len(f.tensors)
            report.raw_bytes = sum(t.data_len for t in f.tensors)
            report.details.update(chunks=len(f.control.chunks), shards=len(f.shards),
                                  file_size=f.size)
            verify_control(f, report)
            if level == "full":
                verify_full(f, report, workers)
    except FormatError as exc:
        return report.fail(exc)
    return report


def verify_control(f: AeroFile, report: Report) -> None:
    """IHSH: the control region, TOC hash fields zeroed, against the digest it stores."""
    chunk = f.control.find(S.IHSH)
    if chunk is None:
        report.notes.append("no IHSH chunk: the control region is not covered by a digest")
        report.details["ihsh"] = "absent"
        return
    if chunk.index != 0:
        raise FormatError("IHSH must be TOC entry 0", chunk=chunk.index, expected="0",
                          got=chunk.index, check="ihsh")
    payload = f.stored(chunk)
    if _hash.digest(payload) != chunk.blake3:
        raise ChecksumError("IHSH payload does not match its TOC BLAKE3", chunk=chunk.index,
                            offset=chunk.offset, check="ihsh")
    body = _decode.unpack_msgpack(payload, chunk=chunk.label, allow_trailing_zeros=True)
    expected_range = [[0, f.control.payloads_start]]
    if not isinstance(body, dict) or body.get("algo") != "blake3-256":
        raise FormatError("IHSH payload is not a blake3-256 record", chunk=chunk.index,
                          expected="{'algo': 'blake3-256', ...}", got=body, check="ihsh")
    if body.get("covered_ranges") != expected_range:
        raise FormatError("IHSH does not cover the control region", chunk=chunk.index,
                          expected=str(expected_range), got=body.get("covered_ranges"),
                          check="ihsh")
    stored = body.get("digest")
    if not isinstance(stored, bytes) or len(stored) != 32:
        raise FormatError("IHSH digest is not 32 bytes", chunk=chunk.index, got=stored,
                          check="ihsh")
    region = zero_toc_hashes(f.stored_range(0, f.control.payloads_start), f.control.toc_offset,
                             len(f.control.chunks))
    actual = _hash.digest(region)
    if actual != stored:
        raise ChecksumError("control region (header, TOC, string table) does not match IHSH",
                            offset=0, expected=stored.hex(), got=actual.hex(), check="ihsh")
    report.details["ihsh"] = "ok"
    report.passed("ihsh")


def verify_full(f: AeroFile, report: Report, workers: int | None) -> None:
    _check_manifest(f)
    report.passed("manifest")
    f.advise(getattr(mmap, "MADV_SEQUENTIAL", None))
    view = f.stored_range(0, f.size)
    phsh = _phsh_pages(f)
    jobs = _jobs(f, view, phsh)
    digests = _hash.run_jobs(jobs, workers)
    report.details["bytes_hashed"] = sum({j.span: j.size for j in jobs}.values())
    jobs.clear()
    for c in f.control.chunks:
        if digests[("chunk", c.index)] != c.blake3:
            raise ChecksumError(f"{c.label} does not match its TOC BLAKE3", chunk=c.index,
                                offset=c.offset, expected=c.blake3.hex(),
                                got=digests[("chunk", c.index)].hex(), check="chunk_blake3")
    report.passed("chunk_blake3")
    _check_pages(f, phsh, digests, report)
    _check_tensors(f, digests, report)
    _check_padding(f, view)
    report.passed("padding")


def _jobs(f: AeroFile, view: memoryview, phsh: dict) -> list[_hash.HashJob]:
    """One job per chunk (uncompressed bytes), PHSH page and tensor; spans are absolute."""
    jobs = []
    for c in f.control.chunks:
        if c.compressed:
            jobs.append(_hash.HashJob(("chunk", c.index), ("z", c.index), c.ulen, f.content(c)))
        else:
            jobs.append(_hash.HashJob(("chunk", c.index), (c.offset, c.offset + c.length),
                                      c.length, view[c.offset:c.offset + c.length]))
    for shard_name, (_, _, spans) in phsh.items():
        for p, (lo, hi) in enumerate(spans):
            jobs.append(_hash.HashJob(("page", shard_name, p), (lo, hi), hi - lo, view[lo:hi]))
    if not f.index_only:
        for t in f.tensors:
            lo = f.shards[S.shard_name(t.shard_id)].offset + t.data_off
            hi = lo + t.data_len
            jobs.append(_hash.HashJob(("tensor", t.name), (lo, hi), t.data_len, view[lo:hi]))
    return jobs


def _check_manifest(f: AeroFile) -> None:
    f.meta()    # MJSN decodes to an object and matches its hash
    manifest = f.metadata(S.MMSG)
    if manifest is None:
        return
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if not isinstance(fmt, dict) or fmt.get("name") != "AERO" or fmt.get("version") != [0, 1]:
        raise FormatError("manifest does not describe AERO 0.1",
                          expected="format {'name': 'AERO', 'version': [0, 1]}",
                          got=fmt if fmt is not None else manifest, check="manifest")
    listed = manifest.get("chunks", [])
    for item in listed if isinstance(listed, list) else [None]:
        index = item.get("toc_index") if isinstance(item, dict) else None
        fourcc = item.get("fourcc") if isinstance(item, dict) else None
        chunks = f.control.chunks
        if (type(index) is not int or not 0 <= index < len(chunks) or not isinstance(fourcc, str)
                or chunks[index].fourcc != fourcc.encode("utf-8", "replace")):
            raise FormatError("manifest chunk list disagrees with the TOC",
                              expected="each listed fourcc at its toc_index", got=item,
                              check="manifest")


def _phsh_pages(f: AeroFile) -> dict[str, tuple[Chunk, list, list[tuple[int, int]]]]:
    """Per shard with a PHSH chunk: the chunk, its digests and each page's absolute range."""
    out = {}
    for c in f.control.chunks:
        if c.fourcc != S.PHSH:
            continue
        body = _decode.unpack_msgpack(f.checked_content(c), chunk=c.label)
        body = body if isinstance(body, dict) else {}
        shard_name, page_size, digests = (body.get("shard_name"), body.get("page_size"),
                                          body.get("digests"))
        wtsh = f.shards.get(shard_name) if isinstance(shard_name, str) else None
        if wtsh is None or c.name != f"{shard_name}.phsh":
            raise FormatError("PHSH names no WTSH shard of this file", chunk=c.index,
                              expected=f"shard_name matching {c.name!r}", got=shard_name,
                              check="phsh")
        if type(page_size) is not int or page_size < 1:
            raise FormatError("PHSH page_size must be a positive integer", chunk=c.index,
                              got=page_size, check="phsh")
        count = page_count(wtsh.length, page_size)
        if not isinstance(digests, list) or len(digests) != count:
            raise FormatError("PHSH page count disagrees with the shard size", chunk=c.index,
                              expected=f"{count} digests",
                              got=len(digests) if isinstance(digests, list) else digests,
                              check="phsh")
        if not all(isinstance(d, bytes) and len(d) == 32 for d in digests):
            raise FormatError("PHSH digests must be 32-byte binaries", chunk=c.index,
                              check="phsh")
        end = wtsh.offset + wtsh.length
        spans = [(lo, min(end, lo + page_size))
                 for lo in range(wtsh.offset, wtsh.offset + count * page_size, page_size)]
        out[shard_name] = (c, digests, spans)
    return out


def _check_pages(f: AeroFile, phsh: dict, digests: dict, report: Report) -> None:
    for shard_name, (c, stored, spans) in phsh.items():
        for p, want in enumerate(stored):
            got = digests[("page", shard_name, p)]
            if got != want:
                raise ChecksumError(f"page {p} of {shard_name} does not match PHSH",
                                    chunk=c.index, offset=spans[p][0], expected=want.hex(),
                                    got=got.hex(), check="phsh")
    report.details["phsh_shards"] = len(phsh)
    if phsh:
        report.passed("phsh")
    elif f.shards:
        report.notes.append("no PHSH chunks: pages are not individually hashed")


def _check_tensors(f: AeroFile, digests: dict, report: Report) -> None:
    if f.index_only:
        report.notes.append("index-only AERO (no WTSH): tensor bytes live in AEROSET parts")
        return
    missing = 0
    for t in f.tensors:
        if t.hash_b3 is None:
            missing += 1
            continue
        got = digests[("tensor", t.name)].hex()
        if got != t.hash_b3:
            raise ChecksumError("tensor bytes do not match hash_b3", array=t.name,
                                expected=t.hash_b3, got=got, check="tensor_blake3")
    if missing:
        report.notes.append(f"{missing} tensors carry no hash_b3")
    report.passed("tensor_blake3")


def _check_padding(f: AeroFile, view: memoryview) -> None:
    """Every byte outside the header, TOC, string table and chunks must be zero."""
    ctl = f.control
    spans = [(0, ctl.toc_offset + ctl.toc_length), (ctl.st_offset, ctl.st_offset + ctl.st_length)]
    spans += sorted((c.offset, c.offset + c.length) for c in ctl.chunks)
    cursor = 0
    for lo, hi in sorted(spans):
        if lo > cursor and np.frombuffer(view[cursor:lo], np.uint8).any():
            _raise_padding(view, cursor, lo)
        cursor = max(cursor, hi)
    if cursor < f.size and np.frombuffer(view[cursor:f.size], np.uint8).any():
        _raise_padding(view, cursor, f.size)


def _raise_padding(view: memoryview, lo: int, hi: int) -> None:
    where = lo + int(np.flatnonzero(np.frombuffer(view[lo:hi], np.uint8))[0])
    raise FormatError("non-zero byte outside every extent (padding or trailing data)",
                      offset=where, expected="0", got=view[where], check="padding")
