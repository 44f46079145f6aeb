"""``verify_file``: layered checks, the first failure named (the format contract's ``verify``).

Checks: ``structure`` (preamble, active slot, PCMB framing and CRC32, typed metadata, layout),
``payload_crc32c`` (every array's CRC-32C when the writer recorded one), ``padding`` (zero
bytes in the reserved header area and between arrays). Non-fatal findings are notes: an
invalid inactive slot (an interrupted update), non-canonical metadata encoding, bytes after
the active block, arrays without a CRC.
"""

from __future__ import annotations

import os

from ..errors import ChecksumError, FormatError
from ..integrity import crc32c
from ..report import Report
from . import _spec as S
from ._codec import is_canonical
from ._layout import layout_kind
from ._read import PycausetFile, read_metadata

CRC_PIECE = 256 << 20
_HEADER_USED = S.SLOT_OFFSETS["B"] + S.SLOT_SIZE       # preamble + two slots


def verify_file(path: str | os.PathLike) -> Report:
    """Check a container; ``report.ok`` is False and ``report.failure`` names the check otherwise.

    >>> from snapops.formats import pycauset
    >>> _ = pycauset.save({"a": np.zeros(3), "b": np.ones(2)}, "m.pycauset")
    >>> verify_file("m.pycauset").checks
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
