"""Reading: parse a container held in a buffer, serve its arrays as zero-copy mmap views.

:func:`parse_container` is a pure function of a buffer (bytes or an mmap): it reads the header,
picks the active slot, checks the metadata block and decodes it, and derives the array entries.
It touches the first 4096 bytes and the active metadata block only, never the payload, so
opening costs the same for 1 KiB and 1 TiB. :class:`PycausetFile` owns the mmap.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from ..model import ArrayMapping, close_map
from ..errors import FormatError, TruncatedError
from ..iosafe import open_input
from . import _spec as S
from ._block import block_payload
from ._codec import decode_metadata
from ._header import Slot, check_preamble, choose_active, read_slots
from ._layout import Entry, parse_entries


@dataclass(frozen=True)
class Container:
    size: int
    slots: tuple[Slot, Slot]
    active: Slot
    meta: dict
    entries: tuple[Entry, ...]

    @property
    def payload_offset(self) -> int:
        return self.active.payload_offset

    def snapshot_meta(self) -> dict:
        """The snapshot's own metadata: the ``provenance`` map ({} when absent)."""
        value = self.meta.get("provenance")
        return dict(value) if isinstance(value, dict) else {}


def read_metadata(buf, active: Slot, *, block_only: bool = False) -> tuple[dict, memoryview]:
    """Decode the metadata block ``active`` points at; returns (map, encoded payload view).

    ``block_only``: ``buf`` holds just the block (as read by ``update_metadata``).
    """
    at = 0 if block_only else active.metadata_offset
    payload = block_payload(buf, at, active.metadata_length, base=active.metadata_offset)
    return decode_metadata(payload, base=active.metadata_offset + S.BLOCK_HEADER_SIZE), payload


def parse_container(buf) -> Container:
    """Header, active slot, metadata and array entries of the container in ``buf``.

    Example::

        parse_container(open("m.pycauset", "rb").read()).active.name
        # -> 'A'
    """
    check_preamble(buf)
    size = len(buf)
    slots = read_slots(buf)
    active = choose_active(slots, size)
    meta, payload = read_metadata(buf, active)
    payload.release()
    entries = tuple(parse_entries(meta, active.payload_length))
    return Container(size, slots, active, meta, entries)


class PycausetFile(ArrayMapping):
    """An open container: header and metadata parsed, payload mapped but not read.

    Example::

        with PycausetFile("m.pycauset") as f:
            w = f["matrix"]              # a read-only view on the mmap
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._mm: mmap.mmap | None = None
        try:
            with open_input(self.path) as handle:
                size = os.fstat(handle.fileno()).st_size
                if size == 0:
                    raise TruncatedError("empty file", path=self.path, offset=0,
                                         expected="a PyCauset header", got="0 bytes")
                self._mm = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror}", path=self.path) from exc
        try:
            self.container = parse_container(self._mm)
        except FormatError as exc:
            self.close()
            raise exc.located(self.path)
        self.by_name = {e.name: e for e in self.container.entries}

    @property
    def buffer(self) -> mmap.mmap:
        if self._mm is None:
            raise FormatError("file is closed", path=self.path)
        return self._mm

    @property
    def meta(self) -> dict:
        """The whole typed metadata map of the active slot."""
        return self.container.meta

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.container.entries]

    def array(self, name: str) -> np.ndarray:
        """Array ``name`` as a read-only view on the mmap (BIT data and conjugation copy)."""
        try:
            entry = self.by_name[name]
        except KeyError:
            raise FormatError("no such array", path=self.path, array=name,
                              expected=f"one of {self.names[:8]}", got=name) from None
        return entry.materialize(self.buffer, self.container.payload_offset)

    def close(self) -> None:
        mm, self._mm = self._mm, None
        close_map(mm)

