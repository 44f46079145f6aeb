"""PyCauset v1 containers (``.pycauset``): read, write, verify, update metadata in place.

Layout: a 4096-byte header (16-byte preamble ``PYCAUSET``, two 128-byte slots A/B with CRC32),
the payload at a 4096-aligned offset, and append-only PCMB metadata blocks (typed metadata
encoding v1) at 16-byte aligned offsets. The active slot is the valid one with the higher
generation (A on a tie). The payload opens by mmap without copying.

One 1-D or 2-D array of a peer dtype is written the way ``pycauset==0.6.1`` writes a matrix or
vector (``payload_layout.kind = "raw_dense"``), so the peer loads it; anything else uses
snapops' own ``snapops.arrays/v1`` layout (see ``_layout``). ``Snapshot.meta`` is stored in the
``provenance`` namespace. Readers ignore unknown keys.

>>> save({"w": np.eye(3, dtype=np.float32)}, "w.pycauset").details["layout"]
'raw_dense'
>>> with open_lazy("w.pycauset") as f:
...     f["w"].flags.writeable                 # a read-only view on the mmap
False
>>> update_metadata("w.pycauset", {"provenance": {"verified": True}})["generation"]
2
>>> verify("w.pycauset").ok
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..contract import Capabilities, SaveOptions, SnapshotFormat, VerifyOptions, WriteResult
from ..dtypes import dtype_name
from ..model import ArrayMapping, Snapshot
from ..report import Report
from . import _spec as S
from ._inspect import inspect_container
from ._read import PycausetFile, parse_container
from ._update import merge_patch
from ._update import update_metadata as _update_metadata
from ._write import save as save_file
from .verify import verify_file

__all__ = ["FORMAT", "Pycauset", "PycausetOptions", "save", "load", "open_lazy", "verify",
           "inspect", "update_metadata", "PycausetFile", "parse_container", "merge_patch"]


@dataclass(frozen=True)
class PycausetOptions(SaveOptions):
    """PyCauset writer options.

    ``layout``: ``"auto"`` (the peer's raw_dense for one 1-D/2-D array of a peer dtype, else
    ``snapops.arrays/v1``), ``"arrays"`` or ``"raw_dense"``. ``payload_uuid``: None (derived
    from the content via the CRCs, so equal input gives equal bytes, or random when
    ``checksum=False``), ``"random"``, or a fixed UUID. ``checksum``: record each array's
    CRC-32C (default True).
    """

    layout: str = "auto"
    payload_uuid: Any = None
    checksum: bool = True


class Pycauset(SnapshotFormat):
    name = "pycauset"
    title = "PyCauset"
    suffixes = (".pycauset",)
    capabilities = Capabilities(
        native_dtypes=frozenset(dtype_name(d) for d in S.ARRAY_DTYPES.values()), mmap=True,
        integrity=frozenset({"structure", "data", "metadata"}))
    options_type = PycausetOptions

    def sniff(self, head: bytes) -> bool:
        return head[:8] == S.MAGIC

    def _save(self, snapshot: Snapshot, path: str, options: PycausetOptions) -> WriteResult:
        done = save_file(snapshot, path, layout=options.layout,
                         payload_uuid=options.payload_uuid, checksum=options.checksum)
        return self.result(path, snapshot, done["file_size"], done["sha256"], done)

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        """Arrays are read-only views on one mmap; payload CRCs are checked by ``verify``."""
        f = PycausetFile(path)
        try:
            arrays = {name: f.array(name) for name in f.names}
            meta = f.container.snapshot_meta()
        finally:
            f.close()       # the map lives on while the arrays refer to it
        return Snapshot(arrays, meta)

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        f = PycausetFile(path)
        return f, f.container.snapshot_meta()

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        return verify_file(path)

    def _inspect(self, path: str) -> dict:
        return inspect_container(path)


FORMAT = Pycauset()
save, load, open_lazy, verify, inspect = (FORMAT.save, FORMAT.load, FORMAT.open_lazy,
                                          FORMAT.verify, FORMAT.inspect)


def update_metadata(path: str | os.PathLike, changes: Mapping[str, Any], **io: Any) -> dict:
    """Merge ``changes`` into the metadata in place, crash-consistently, in O(1).

    ``changes`` is a JSON merge patch (RFC 7386) on the top-level typed map: maps merge, None
    deletes a key, anything else replaces. Identity keys (rows, cols, matrix_type, data_type,
    payload_layout, payload_uuid, view) are refused. Snapshot metadata lives under
    ``provenance``. Returns the new slot's name and generation.

    >>> _ = save({"a": np.zeros(3), "b": np.ones((2, 2))}, "s.pycauset")
    >>> update_metadata("s.pycauset", {"provenance": {"pushed": "origin/main"}})["slot"]
    'B'
    """
    return _update_metadata(path, changes, **io)
