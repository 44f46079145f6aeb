"""FINF 0.1.0 (``.finf``): a YAML tree plus binary blocks (the 2014 name of ASDF).

Layout: the header line ``%FINF 0.1.0``; the tree (``%YAML 1.1``, ``%TAG !
tag:stsci.edu:finf/0.1.0/``, ``--- !finf`` .. ``...``) with one ``!ndarray`` per array under
``arrays`` and the snapshot's metadata under ``meta``; unused space (spaces) so the tree can
grow in place; then blocks, each a 46-byte header (``89 42 4C 4B``, header_size 40,
allocated/used/checksum u64 BE, 16-byte encoding: raw or ``zstd``) and its data, which starts
at a multiple of ``align`` (the gap is the block's unused allocated space). The first block is
found by scanning for the magic from the end of the tree; raw blocks open as zero-copy views.

>>> save({"w": np.zeros((2, 3), np.float32)}, "m.finf", compression="zstd").details["blocks"]
1
>>> with open_lazy("m.finf") as f:
...     f["w"].shape
(2, 3)
>>> update_tree("m.finf", {"step": 1200})["mode"]           # in place, blocks untouched
'in_place'
>>> verify("m.finf").ok
True

dtypes: int8..uint64, float32, float64 natively; bool, f16, bf16 and the other numeric dtypes
are stored as the unsigned integer of their width with ``meta.snapops_dtypes`` naming the
logical dtype; arrays are always written little-endian and C-ordered with ``byteorder:
little`` spelled out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ..contract import (WORKERS, ZSTD_LEVEL, Capabilities, SaveOptions, SnapshotFormat,
                        VerifyOptions, WriteResult, between)
from ..dtypes import dtype_name
from ..model import ArrayMapping, Snapshot
from ..report import Report
from . import _spec as S
from ._edit import update_tree
from ._read import FinfFile
from ._write import save as save_file
from .exploded import explode, implode
from .verify import verify_file

__all__ = ["FORMAT", "Finf", "FinfOptions", "save", "load", "open_lazy", "verify", "inspect",
           "update_tree", "explode", "implode", "FinfFile", "Limits"]

Limits = S.Limits


@dataclass(frozen=True)
class FinfOptions(SaveOptions):
    """FINF writer options.

    ``compression`` (None/``"none"`` or ``"zstd"``; a block stays raw when zstd does not make
    it smaller), ``zstd_level`` (3), ``checksum`` (False, the default, writes 0 = "unchecked"
    as the spec allows; True: MD5 of every block in its header, which ``verify`` then checks —
    about 2.5x slower to write here: MD5 runs at ~0.32 GB/s per core), ``align`` (block data
    alignment, 64), ``reserve`` (unused bytes after the tree, 4096), ``workers``
    (checksum/compression threads). Equal input gives equal bytes.
    """

    compression: str | None = None
    zstd_level: Annotated[int, ZSTD_LEVEL] = 3
    checksum: bool = False
    align: Annotated[int, between(1, 1 << 20)] = S.DEFAULT_ALIGN
    reserve: Annotated[int, between(0, 1 << 30)] = S.DEFAULT_RESERVE
    workers: Annotated[int, WORKERS] | None = None


class Finf(SnapshotFormat):
    name = "finf"
    title = "FINF"
    suffixes = (".finf",)
    capabilities = Capabilities(
        native_dtypes=frozenset(dtype_name(S.BYTEORDERS["little"] + code)
                                for code in S.DTYPES.values()), mmap=True)
    options_type = FinfOptions

    def sniff(self, head: bytes) -> bool:
        return head.startswith(b"%FINF ")

    def _save(self, snapshot: Snapshot, path: str, options: FinfOptions) -> WriteResult:
        done = save_file(snapshot, path, compression=options.compression,
                         zstd_level=options.zstd_level, checksum=options.checksum,
                         align=options.align, reserve=options.reserve, workers=options.workers)
        return self.result(path, snapshot, done["file_bytes"], done["sha256"], done)

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        """Raw arrays are read-only views on one mmap; checksums are computed by ``verify``;
        exploded trees load through their URIs."""
        f = FinfFile(path)
        try:
            arrays = {name: f.array(name) for name in f.names}
            meta = f.meta()
        finally:
            f.close()       # the map lives on while the arrays refer to it
        return Snapshot(arrays, meta)

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        f = FinfFile(path)
        return f, f.meta()

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        return verify_file(path, workers=options.workers)

    def _inspect(self, path: str) -> dict:
        """Header, sections, blocks, arrays and meta as plain data."""
        with FinfFile(path) as f:
            s = f.sections
            return {
                "version": ".".join(map(str, s.version)), "file_size": f.size,
                "header": {"version": ".".join(map(str, s.version)), "blocks": len(f.blocks),
                           "tree_bytes": s.tree_end - s.tree_start},
                "tree": {"offset": s.tree_start, "bytes": s.tree_end - s.tree_start,
                         "unused_after": s.tree_space - (s.tree_end - s.tree_start),
                         "root_tag": getattr(f.tree, "tag", None)},
                "first_block": s.first_block,
                "blocks": [b.to_dict() for b in f.blocks],
                "arrays": [{"name": n, "source": r.source, "offset": r.offset,
                            "byteorder": r.byteorder, "line": r.line}
                           for n, r in f.refs.items()],
                "meta": f.meta(),
            }


FORMAT = Finf()
save, load, open_lazy, verify, inspect = (FORMAT.save, FORMAT.load, FORMAT.open_lazy,
                                          FORMAT.verify, FORMAT.inspect)
