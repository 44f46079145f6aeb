"""Crash-consistent metadata updates, O(1) in the payload size.

:func:`plan_update` is pure: from the header, the active metadata block and the file size it
computes the steps; :func:`apply_steps` is the sink. The steps follow the spec's rule:

1. append the new PCMB block at align16(EOF) (zero padding before it);
2. fsync;
3. write the *inactive* slot with generation = active + 1, pointing at the new block;
4. fsync.

A crash before step 3 completes leaves the old slot the only valid one with the highest
generation (the new slot's CRC cannot match a torn write), so the file opens with the old
metadata; after it, with the new. The payload is never read or moved. ``pwrite`` and ``fsync``
are injectable so tests can cut the sequence after any byte.
"""

from __future__ import annotations

import copy
import fcntl
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import DataError, FormatError, LimitError
from . import _spec as S
from ._block import pack_block
from ._codec import encode_metadata
from ._header import Slot, check_preamble, choose_active, read_slots
from ._layout import parse_entries
from ._read import read_metadata


@dataclass(frozen=True)
class Write:
    offset: int
    data: bytes


FSYNC = "fsync"


@dataclass(frozen=True)
class UpdatePlan:
    steps: tuple[Write | str, ...]
    old: Slot
    new: Slot
    meta: dict

    def summary(self) -> dict:
        return {"slot": self.new.name, "generation": self.new.generation,
                "metadata_offset": self.new.metadata_offset,
                "metadata_length": self.new.metadata_length, "previous_slot": self.old.name}


def merge_patch(target: dict, changes: Mapping[str, Any]) -> dict:
    """RFC 7386 JSON Merge Patch: maps merge recursively, None deletes, anything else replaces.

    >>> merge_patch({"a": {"x": 1, "y": 2}, "b": 1}, {"a": {"y": None, "z": 3}, "b": None})
    {'a': {'x': 1, 'z': 3}}
    """
    out = dict(target)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            base = out.get(key)
            out[key] = merge_patch(base if isinstance(base, dict) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def plan_update(header: bytes, block: bytes, file_size: int,
                changes: Mapping[str, Any]) -> UpdatePlan:
    """The steps that replace the metadata. ``header`` is the file's first 4096 bytes,
    ``block`` the active slot's metadata block, ``file_size`` the current size."""
    if not isinstance(changes, Mapping):
        raise DataError(f"changes must be a mapping, got {type(changes).__name__}")
    touched = sorted(k for k in changes if k in S.IDENTITY_KEYS)
    if touched:
        raise DataError(f"update_metadata cannot change identity keys {touched}: they define how "
                        "the payload is read (write a new file instead)")
    active = _active(header, file_size)
    if len(block) != active.metadata_length:
        raise FormatError("metadata block shorter than the slot says",
                          offset=active.metadata_offset, expected=f"{active.metadata_length} bytes", got=f"{len(block)} bytes")
    meta, view = read_metadata(block, active, block_only=True)
    view.release()
    new_meta = merge_patch(meta, changes)
    parse_entries(new_meta, active.payload_length)     # never commit metadata that won't open
    payload = encode_metadata(new_meta)
    if len(payload) > S.MAX_METADATA_PAYLOAD:
        raise LimitError("updated metadata too large", expected=f"<= {S.MAX_METADATA_PAYLOAD}",
                         got=len(payload))
    if active.generation >= (1 << 64) - 1:
        raise LimitError("generation counter exhausted", got=active.generation)
    offset = S.align(file_size, S.METADATA_ALIGN)
    framed = pack_block(payload)
    inactive = "B" if active.name == "A" else "A"
    new = Slot(inactive, active.generation + 1, active.payload_offset, active.payload_length,
               offset, len(framed))
    steps = (Write(file_size, bytes(offset - file_size) + framed), FSYNC,
             Write(new.offset, new.pack()), FSYNC)
    return UpdatePlan(steps, active, new, new_meta)


def _active(header: bytes, file_size: int) -> Slot:
    check_preamble(header)
    return choose_active(read_slots(header), file_size)


def apply_steps(fd: int, steps, *, pwrite: Callable = os.pwrite,
                fsync: Callable = os.fsync) -> None:
    """Carry out the plan's writes and fsyncs in order (short writes are continued)."""
    for step in steps:
        if step == FSYNC:
            fsync(fd)
            continue
        view, at = memoryview(step.data), step.offset
        while view:
            n = pwrite(fd, view, at)
            view, at = view[n:], at + n


def update_metadata(path: str | os.PathLike, changes: Mapping[str, Any], *,
                    pwrite: Callable = os.pwrite, fsync: Callable = os.fsync) -> dict:
    """Apply ``changes`` (a merge patch) to the file's metadata in place; see the module doc."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise FormatError(f"cannot open for update: {exc.strerror}", path=path) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)      # one updater at a time; readers never block
        size = os.fstat(fd).st_size
        header = os.pread(fd, S.HEADER_BYTES, 0)
        try:
            active = _active(header, size)
            block = os.pread(fd, active.metadata_length, active.metadata_offset)
            plan = plan_update(header, block, size, changes)
        except FormatError as exc:
            raise exc.located(path)
        apply_steps(fd, plan.steps, pwrite=pwrite, fsync=fsync)
    finally:
        os.close(fd)
    return plan.summary()
