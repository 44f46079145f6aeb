"""``inspect`` for PyCauset: the spec's debugging checklist, never raising on a damaged file.

Magic and version, both slots (CRC, ranges, alignment, validity, generation), the active slot,
the block framing and CRC, the metadata map and the arrays; the first problem is in ``error``.
"""

from __future__ import annotations

import mmap
import os
import zlib
from typing import Any

from ..errors import FormatError
from ..iosafe import open_input
from . import _spec as S
from ._header import check_preamble, choose_active, read_slots
from ._layout import layout_kind
from ._read import parse_container


def inspect_container(path: str | os.PathLike) -> dict:
    """The debugging view of a container (never raises on a damaged file once it is open).

    >>> from snapops.formats import pycauset
    >>> _ = pycauset.save({"a": np.zeros(3)}, "m.pycauset")
    >>> inspect_container("m.pycauset")["active_slot"]
    'A'
    """
    path = os.fspath(path)
    try:
        with open_input(path) as handle:
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
