"""AERO v0.1: a chunked binary container for model weights (``.aero``), and AEROSET.

Layout: a 96-byte header, a TOC of 80-byte entries, a string table, then 16-byte aligned chunk
payloads, each with the BLAKE3-256 of its uncompressed bytes in the TOC. Weights (WTSH) are
never compressed and open as zero-copy mmap views; the tensor index (TIDX) and the manifest
(MMSG) are zstd-compressed MessagePack; ``meta.json`` (MJSN) holds the snapshot's metadata.
IHSH covers the control region (header + TOC + string table); PHSH holds per-page digests.

>>> save(snapshot, "model.aero", shard_max=1 << 30, page_hashes=True)
>>> with open_lazy("model.aero") as f:
...     w = f["layer.0.weight"]          # read-only view on the mmap
>>> verify("model.aero").ok
True

dtypes: the spec's enum (f16, f32, bf16, f64, i8..u64, bool) maps to numpy dtypes, bf16 to
``ml_dtypes.bfloat16``. A packed (0x8000) tensor loads as its raw bytes (1-D uint8) with its
logical shape and codec fields in ``meta["aero.packed"]`` (JSON), which ``save`` reads back.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import FormatError
from ..model import Snapshot
from ..registry import FormatHandler
from ..report import Report
from . import _spec as S
from . import aeroset
from ._read import AeroFile
from ._write import Options
from ._write import save as _save
from .verify import verify

__all__ = ["save", "load", "open_lazy", "verify", "inspect", "sniff", "HANDLER", "HANDLERS",
           "AeroFile", "Options"]


def save(snapshot: Snapshot, path: str | os.PathLike, **opts: Any) -> dict:
    """Write ``snapshot`` to ``path`` atomically as AERO v0.1; returns a short summary.

    Options (all keywords):
      ``shard_max`` (bytes per WTSH shard, default 2 GiB; a larger tensor gets its own shard),
      ``page_hashes`` (add PHSH per shard, default False), ``page_size`` (default 4 MiB),
      ``control_integrity`` (add IHSH, default True), ``model_name`` / ``architecture``
      (manifest ``model``; default ``meta["model_name"]`` / ``meta["architecture"]`` or ""),
      ``uuid`` (None: derived from the content, so equal input gives equal bytes; ``"random"``;
      or a fixed UUID / 16 bytes), ``zstd_level`` (default 6), ``workers`` (hash threads).

    >>> save({"w": np.zeros((2, 2), np.float32)}, "w.aero")["tensors"]
    1
    """
    return _save(snapshot, path, **opts)


def open_lazy(path: str | os.PathLike) -> AeroFile:
    """Open without reading weights: ``.names``, ``f[name]`` (a zero-copy view), ``.meta()``.

    >>> with open_lazy("model.aero") as f:
    ...     f.names[:2]
    ['a', 'b']
    """
    return AeroFile(path)


def load(path: str | os.PathLike) -> Snapshot:
    """The whole file as a Snapshot whose arrays are read-only views on one mmap.

    Metadata chunks are hash-checked on open; weights are not read (``verify`` checks them).

    >>> load("model.aero").sorted_names()
    ['a', 'b']
    """
    f = AeroFile(path)
    try:
        if f.index_only:
            raise FormatError("index-only AERO file: open its model.aeroset.json instead",
                              path=f.path, check="tidx_bounds")
        arrays = {name: f.array(name) for name in f.names}
        meta = f.meta()
    finally:
        f.close()       # the map lives on while the arrays refer to it
    packed = {t.name: {"shape": list(t.shape), **t.extra} for t in f.tensors
              if t.dtype == S.DTYPE_PACKED}
    if packed:
        meta[S.PACKED_META_KEY] = json.dumps(packed, sort_keys=True, separators=(",", ":"))
    return Snapshot(arrays, meta)


def inspect(path: str | os.PathLike) -> dict:
    """Header, chunks, manifest, meta and tensor table as plain data (for ``snapops inspect``)."""
    with AeroFile(path) as f:
        flag_names = lambda v: [fl.name for fl in S.ChunkFlags if v & fl]  # noqa: E731
        return {
            "format": "aero", "version": "0.1", "path": f.path, "file_size": f.size,
            "uuid": f.control.uuid.hex(),
            "chunks": [{"index": c.index, "fourcc": c.fourcc.decode("ascii"), "name": c.name,
                        "flags": flag_names(c.flags), "offset": c.offset, "length": c.length,
                        "ulen": c.ulen, "blake3": c.blake3.hex()} for c in f.control.chunks],
            "manifest": f.metadata(S.MMSG),
            "meta": f.meta(),
            "index_only": f.index_only,
            "tensors": [{"name": t.name, "dtype": S.DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                         "shard_id": t.shard_id, "data_off": t.data_off,
                         "data_len": t.data_len, "hash_b3": t.hash_b3} for t in f.tensors],
        }


def sniff(head: bytes) -> bool:
    return head[:4] == S.MAGIC


def _verify(path: str | os.PathLike, level: str = "full", **kw: Any) -> Report:
    return verify(path, level, **kw)


HANDLER = FormatHandler(name="aero", suffixes=(".aero",), sniff=sniff, load=load, save=save,
                        verify=_verify, inspect=inspect)
HANDLERS = {"aero": HANDLER, "aeroset": aeroset.HANDLER}
