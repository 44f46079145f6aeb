"""PyCauset v1 containers (``.pycauset``): read, write, verify, update metadata in place.

Layout: a 4096-byte header (16-byte preamble ``PYCAUSET``, two 128-byte slots A/B with CRC32),
the payload at a 4096-aligned offset, and append-only PCMB metadata blocks (typed metadata
encoding v1) at 16-byte aligned offsets. The active slot is the valid one with the higher
generation (A on a tie). The payload opens by mmap without copying.

One 1-D or 2-D array of a peer dtype is written the way ``pycauset==0.6.1`` writes a matrix or
vector (``payload_layout.kind = "raw_dense"``), so the peer loads it; anything else uses
snapops' own ``snapops.arrays/v1`` layout (see ``_layout``). ``Snapshot.meta`` is stored in the
``provenance`` namespace. Readers ignore unknown keys.

>>> save({"w": np.eye(3, dtype=np.float32)}, "w.pycauset")["layout"]
'raw_dense'
>>> with open_lazy("w.pycauset") as f:
...     w = f["w"]                          # read-only view on the mmap
>>> update_metadata("w.pycauset", {"provenance": {"verified": True}})["generation"]
2
>>> verify("w.pycauset").ok
True
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..model import Snapshot
from ..registry import FormatHandler
from . import _spec as S
from ._read import PycausetFile, parse_container
from ._update import merge_patch
from ._update import update_metadata as _update_metadata
from ._write import save as _save
from .verify import inspect, verify

__all__ = ["save", "load", "open_lazy", "verify", "inspect", "update_metadata", "sniff",
           "HANDLER", "PycausetFile", "parse_container", "merge_patch"]


def save(snapshot: Snapshot | Mapping[str, Any], path: str | os.PathLike, **opts: Any) -> dict:
    """Write ``snapshot`` to ``path`` atomically; returns a summary (layout, offsets, size).

    Options: ``layout`` (``"auto"``: the peer's raw_dense for one 1-D/2-D array of a peer
    dtype, else ``snapops.arrays/v1``; ``"arrays"``; ``"raw_dense"``), ``payload_uuid``
    (None: derived from the content via the CRCs, so equal input gives equal bytes, or random
    when ``checksum=False``; ``"random"``; or a fixed UUID), ``checksum`` (record each
    array's CRC-32C, default True).

    >>> save({"a": np.zeros(3), "b": np.ones((2, 2))}, "s.pycauset")["layout"]
    'snapops.arrays/v1'
    """
    return _save(snapshot, path, **opts)


def open_lazy(path: str | os.PathLike) -> PycausetFile:
    """Open without reading the payload: ``.names``, ``f[name]`` (a zero-copy view), ``.meta``.

    >>> with open_lazy("s.pycauset") as f:
    ...     f.names
    ['a', 'b']
    """
    return PycausetFile(path)


def load(path: str | os.PathLike) -> Snapshot:
    """The file as a Snapshot whose arrays are read-only views on one mmap.

    ``meta`` is the ``provenance`` map. Payload CRCs are not checked here (``verify`` does).

    >>> load("s.pycauset").sorted_names()
    ['a', 'b']
    """
    f = PycausetFile(path)
    try:
        arrays = {name: f.array(name) for name in f.names}
        meta = f.container.snapshot_meta()
    finally:
        f.close()       # the map lives on while the arrays refer to it
    return Snapshot(arrays, meta)


def update_metadata(path: str | os.PathLike, changes: Mapping[str, Any], **io: Any) -> dict:
    """Merge ``changes`` into the metadata in place, crash-consistently, in O(1).

    ``changes`` is a JSON merge patch (RFC 7386) on the top-level typed map: maps merge, None
    deletes a key, anything else replaces. Identity keys (rows, cols, matrix_type, data_type,
    payload_layout, payload_uuid, view) are refused. Snapshot metadata lives under
    ``provenance``. Returns the new slot's name and generation.

    >>> update_metadata("s.pycauset", {"provenance": {"pushed": "origin/main"}})["slot"]
    'B'
    """
    return _update_metadata(path, changes, **io)


def sniff(head: bytes) -> bool:
    return head[:8] == S.MAGIC


HANDLER = FormatHandler(name="pycauset", suffixes=(".pycauset",), sniff=sniff, load=load,
                        save=save, verify=verify, inspect=inspect)
