"""``verify`` (layered checks, first failure named) and ``inspect`` (the debugging view).

verify: ``structure`` (preamble, active slot, PCMB framing and CRC32, typed metadata, layout),
``payload_crc32c`` (every array's CRC-32C when the writer recorded one), ``padding`` (zero
bytes in the reserved header area and between arrays). Non-fatal findings are notes: an
invalid inactive slot (an interrupted update), non-canonical metadata encoding, bytes after
the active block, arrays without a CRC.

inspect follows the spec's debugging checklist and never raises on a damaged file: magic and
version, both slots (CRC, ranges, alignment, validity, generation), the active slot, the block
framing and CRC, the metadata map and the arrays; the first problem is in ``error``.
"""

from __future__ import annotations

import mmap
import os
import zlib
from typing import Any

from ..errors import ChecksumError, FormatError
from ..integrity import crc32c
from ..report import Report
from . import _spec as S
from ._codec import is_canonical
from ._header import check_preamble, choose_active, read_slots
from ._layout import layout_kind
from ._read import PycausetFile, parse_container, read_metadata

CRC_PIECE = 256 << 20
_HEADER_USED = S.SLOT_OFFSETS["B"] + S.SLOT_SIZE       # preamble + two slots


def verify(path: str | os.PathLike, **_: Any) -> Report:
    """Check a container; ``report.ok`` is False and ``report.failure`` names the check otherwise.

    >>> verify("m.pycauset").checks
    ['structure', 'payload_crc32c', 'padding']
    """
    report = Report(path=os.fspath(path), format="pycauset")
    try:
        with PycausetFile(path) as f:
            c = f.container
            report.passed("structure")
            report.arrays = len(c.entries)
            report.raw_bytes = sum(e.length for e in c.entries)
            report.details.update(file_size=c.size, active_slot=c.active.name,
                                  generation=c.active.generation, layout=layout_kind(c.meta))
            _notes(f, report)
            _check_crcs(f, report)
            _check_padding(f, report)
    except FormatError as exc:
        return report.fail(exc)
    return report


def _notes(f: PycausetFile, report: Report) -> None:
    c = f.container
    for slot in c.slots:
        problems = slot.problems(c.size)
        if slot is not c.active and problems:
            report.notes.append(f"inactive slot {slot.name} is not valid "
                                f"({'; '.join(problems)}): an interrupted update?")
    meta, payload = read_metadata(f.buffer, c.active)
    with payload:
        if not is_canonical(payload, meta):
            report.notes.append("metadata is not in canonical encoding (key order or int tags)")
    end = c.active.metadata_offset + c.active.metadata_length
    if end < c.size:
        report.notes.append(f"{c.size - end} bytes after the active metadata block "
                            "(an interrupted update?)")
    missing = [e.name for e in c.entries if e.crc32c is None]
    if missing:
        report.notes.append(f"{len(missing)} array(s) without a CRC-32C: payload not checked "
                            f"({', '.join(missing[:5])})")


def _check_crcs(f: PycausetFile, report: Report) -> None:
    base = f.container.payload_offset
    with memoryview(f.buffer) as whole:
        for e in f.container.entries:
            if e.crc32c is None:
                continue
            crc = 0
            for lo in range(base + e.offset, base + e.offset + e.length, CRC_PIECE):
                with whole[lo:min(lo + CRC_PIECE, base + e.offset + e.length)] as piece:
                    crc = crc32c(piece, crc)
            if crc != e.crc32c:
                raise ChecksumError("array bytes do not match their CRC-32C", array=e.name,
                                    offset=base + e.offset, expected=f"{e.crc32c:08x}",
                                    got=f"{crc:08x}", check="payload_crc32c")
    report.passed("payload_crc32c")


def _check_padding(f: PycausetFile, report: Report) -> None:
    base, pos = f.container.payload_offset, 0
    with memoryview(f.buffer) as whole:
        with whole[_HEADER_USED:S.HEADER_BYTES] as rest:
            if any(rest):
                raise FormatError("reserved header bytes are not zero", offset=_HEADER_USED,
                                  expected="zeros up to 4096", got="non-zero bytes",
                                  check="padding")
        for e in f.container.entries:
            if e.offset > pos:
                with whole[base + pos:base + e.offset] as gap:
                    if any(gap):
                        raise FormatError("padding between arrays is not zero", array=e.name,
                                          offset=base + pos, expected="zero bytes",
                                          got=bytes(gap).hex(), check="padding")
            pos = max(pos, e.offset + e.length)
    report.passed("padding")


# ---- inspect -----------------------------------------------------------------------------------

def inspect(path: str | os.PathLike) -> dict:
    """The debugging view of a container (never raises on a damaged file).

    >>> inspect("m.pycauset")["active_slot"]
    'A'
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            mm = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror}", path=path) from exc
    try:
        return _inspect(path, mm)
    finally:
        if isinstance(mm, mmap.mmap):
            mm.close()


def _inspect(path: str, mm) -> dict:
    size = len(mm)
    out: dict[str, Any] = {"format": "pycauset", "path": path, "file_size": size, "error": None}
    if size >= S.PREAMBLE.size:
        magic, version, endian, header_bytes, reserved = S.PREAMBLE.unpack_from(mm, 0)
        out["preamble"] = {"magic": magic.decode("latin-1"), "format_version": version,
                           "endian": endian, "header_bytes": header_bytes, "reserved0": reserved}
    if size >= S.SLOT_OFFSETS["B"] + S.SLOT_SIZE:
        out["slots"] = [s.to_dict(size) for s in read_slots(mm)]
    try:
        check_preamble(mm)
        active = choose_active(read_slots(mm), size)
        out["active_slot"] = active.name
        out["metadata_block"] = _block_info(mm, active)
        container = parse_container(mm)
        out["metadata"] = container.meta
        out["layout"] = layout_kind(container.meta)
        out["arrays"] = [{**e.to_dict(), "file_offset": active.payload_offset + e.offset}
                         for e in container.entries]
    except FormatError as exc:
        out["error"] = str(exc.located(path))
    out["header"] = _summary(out)
    return out


def _block_info(mm, active) -> dict:
    info: dict[str, Any] = {"offset": active.metadata_offset, "length": active.metadata_length}
    if active.metadata_length >= S.BLOCK_HEADER_SIZE:
        magic, version, encoding, _, plen, crc, _ = S.BLOCK_HEADER.unpack_from(
            mm, active.metadata_offset)
        start = active.metadata_offset + S.BLOCK_HEADER_SIZE
        fits = plen == active.metadata_length - S.BLOCK_HEADER_SIZE
        with memoryview(mm)[start:start + plen if fits else start] as body:
            crc_ok = fits and zlib.crc32(body) == crc
        info.update(magic=magic.decode("latin-1"), block_version=version,
                    encoding_version=encoding, payload_length=plen, crc32=f"{crc:08x}",
                    crc_ok=crc_ok)
    return info


def _summary(info: dict) -> dict:
    """The few lines the text form of ``snapops inspect`` prints."""
    out: dict[str, Any] = {}
    pre = info.get("preamble")
    if pre:
        out["magic"] = pre["magic"]
        out["format_version"] = pre["format_version"]
    for slot in info.get("slots", []):
        state = "valid" if slot["valid"] else "INVALID: " + "; ".join(slot["problems"])
        out[f"slot {slot['name']}"] = (
            f"gen={slot['generation']} crc32={slot['crc32']} payload={slot['payload_offset']}"
            f"+{slot['payload_length']} metadata={slot['metadata_offset']}"
            f"+{slot['metadata_length']} {state}")
    if "active_slot" in info:
        out["active slot"] = info["active_slot"]
    block = info.get("metadata_block")
    if block and "crc32" in block:
        out["metadata block"] = (f"{block['magic']} v{block['block_version']} "
                                 f"enc{block['encoding_version']} {block['payload_length']} bytes "
                                 f"crc32={block['crc32']} {'ok' if block['crc_ok'] else 'BAD'}")
    if "layout" in info:
        out["layout"] = info["layout"]
    if info.get("error"):
        out["error"] = info["error"]
    return out
