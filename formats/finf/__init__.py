"""FINF 0.1.0 (``.finf``): a YAML tree plus binary blocks (the 2014 name of ASDF).

Layout: the header line ``%FINF 0.1.0``; the tree (``%YAML 1.1``, ``%TAG !
tag:stsci.edu:finf/0.1.0/``, ``--- !finf`` .. ``...``) with one ``!ndarray`` per array under
``arrays`` and the snapshot's metadata under ``meta``; unused space (spaces) so the tree can
grow in place; then blocks, each a 46-byte header (``89 42 4C 4B``, header_size 40,
allocated/used/checksum u64 BE, 16-byte encoding: raw or ``zstd``) and its data, which starts
at a multiple of ``align`` (the gap is the block's unused allocated space). The first block is
found by scanning for the magic from the end of the tree; raw blocks open as zero-copy views.

>>> save({"w": np.zeros((2, 3), np.float32)}, "m.finf", compression="zstd")["blocks"]
1
>>> with open_lazy("m.finf") as f:
...     f["w"].shape
(2, 3)
>>> update_tree("m.finf", {"step": 1200})["mode"]           # in place, blocks untouched
'in_place'
>>> verify("m.finf").ok
True

dtypes: int8..uint64, float32, float64 (others are refused with DataError); arrays are always
written little-endian and C-ordered with ``byteorder: little`` spelled out.
"""

from __future__ import annotations

import os
from typing import Any

from ..model import Snapshot
from ..registry import FormatHandler
from . import _spec as S
from ._edit import update_tree
from ._read import FinfFile
from ._write import save as _save
from ._yaml import plain_value
from .exploded import explode, implode
from .verify import verify

__all__ = ["save", "load", "open_lazy", "verify", "inspect", "update_tree", "explode",
           "implode", "sniff", "FinfFile", "Limits", "HANDLER"]

Limits = S.Limits


def save(snapshot: Snapshot, path: str | os.PathLike, **opts: Any) -> dict:
    """Write ``snapshot`` to ``path`` atomically as FINF 0.1.0; returns a short summary.

    Options (keywords): ``compression`` (None or ``"zstd"``; a block stays raw when zstd
    does not make it smaller), ``zstd_level`` (3), ``checksum`` (False, the default,
    writes 0 = "unchecked" as the spec allows; True: MD5 of every block in its header, which
    ``verify`` then checks — about 2.5x slower to write here: MD5 runs at ~0.32 GB/s per core), ``align``
    (block data alignment, 64), ``reserve`` (unused bytes after the tree, 4096),
    ``workers`` (checksum/compression threads). Equal input gives equal bytes.

    >>> save({"w": np.arange(4.0)}, "w.finf")["file_bytes"] > 0
    True
    """
    return _save(snapshot, path, **opts)


def open_lazy(path: str | os.PathLike, *, limits: Limits = S.DEFAULT_LIMITS) -> FinfFile:
    """Open without reading block data: ``.names``, ``f[name]`` (a view), ``.meta()``.

    >>> with open_lazy("m.finf") as f:
    ...     f.names
    ['w']
    """
    return FinfFile(path, limits=limits)


def load(path: str | os.PathLike, *, limits: Limits = S.DEFAULT_LIMITS) -> Snapshot:
    """The whole file as a Snapshot; raw arrays are read-only views on one mmap.

    Checksums are not computed here (``verify`` does); exploded trees load through their URIs.

    >>> load("m.finf").sorted_names()
    ['w']
    """
    f = FinfFile(path, limits=limits)
    try:
        arrays = {name: f.array(name) for name in f.names}
        meta = f.meta()
    finally:
        f.close()       # the map lives on while the arrays refer to it
    return Snapshot(arrays, meta)


def inspect(path: str | os.PathLike) -> dict:
    """Header, sections, blocks, arrays and meta as plain data (for ``snapops inspect``)."""
    with FinfFile(path) as f:
        s = f.sections
        return {
            "format": "finf", "version": ".".join(map(str, s.version)), "path": f.path,
            "file_size": f.size,
            "tree": {"offset": s.tree_start, "bytes": s.tree_end - s.tree_start,
                     "unused_after": s.tree_space - (s.tree_end - s.tree_start),
                     "root_tag": getattr(f.tree, "tag", None)},
            "first_block": s.first_block,
            "blocks": [b.to_dict() for b in f.blocks],
            "arrays": [{"name": n, **plain_value(r.to_mapping()), "nbytes": r.nbytes,
                        "line": r.line} for n, r in f.refs.items()],
            "meta": f.meta(),
        }


def sniff(head: bytes) -> bool:
    return head.startswith(b"%FINF ")


HANDLER = FormatHandler(name="finf", suffixes=(".finf",), sniff=sniff, load=load, save=save,
                        verify=verify, inspect=inspect)
