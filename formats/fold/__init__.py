"""FOLD (``.fold`` / ``.mind``): the chunked container of pyfolds, read and written by snapops.

Layout (big-endian): a 28-byte header (``FOLDv1\\0\\0``, header_len, index_off, index_len),
chunks ``[32-byte header | payload (zstd or raw) | Reed–Solomon parity]`` tiling the file up to
the JSON index at its end. CRC32C and SHA-256 cover each compressed payload; the index's
``metadata.chunk_hashes`` repeats the SHA-256s and ``metadata.manifest_hash`` covers the metadata,
so one hash binds the whole file. A ``.mind`` is a FOLD file with an ``ai_graph`` or
``ai_vectors`` chunk.

snapops stores arrays without pickle (see ``_arrays``: NDAR chunks of raw little-endian bytes,
described by ``metadata.snapops``); it reads the peer's TSAV (torch, ``weights_only=True``) and
NPZ0 (``allow_pickle=False``) chunks too.

>>> save({"w": np.ones((2, 3), np.float32)}, "w.fold", ecc="rs(32)").details["chunks"]
1
>>> load("w.fold")["w"].sum()
np.float32(6.0)
>>> verify("w.fold").ok
True
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from ..contract import (WORKERS, ZSTD_LEVEL, Capabilities, SaveOptions, SnapshotFormat,
                        VerifyOptions, WriteResult, between)
from ..dtypes import DTYPES
from ..model import ArrayMapping, Snapshot
from ..report import Report
from . import _arrays as A
from ._layout import CHUNK_HEADER_LEN, HEADER_LEN, MAGIC, MAX_CHUNK_SIZE, MAX_INDEX_SIZE, Limits
from ._read import FoldFile
from ._write import Options, plan, write_fold
from ._write import save as save_file
from .verify import verify_file

__all__ = ["FORMAT", "Fold", "FoldOptions", "save", "load", "loads", "dumps", "open_lazy",
           "verify", "inspect", "FoldFile", "Limits", "MAX_CHUNK_SIZE", "MAX_INDEX_SIZE"]


@dataclass(frozen=True)
class FoldOptions(SaveOptions):
    """FOLD writer options.

    ``compression``: ``"zstd"`` (at ``level``) or ``"none"``. ``ecc``: ``"none"``, ``"rs(N)"``
    or a preset ``"low"``/``"med"``/``"high"`` (rs(16)/rs(32)/rs(64)). Arrays are split into
    chunks of ``segment`` bytes (16 MiB). ``created_at`` (the index's ``created_at_unix``)
    defaults to ``$SOURCE_DATE_EPOCH`` or 0, so equal input gives equal bytes.
    """

    compression: str = "zstd"
    level: Annotated[int, ZSTD_LEVEL] = 3
    ecc: str | int | None = "none"
    segment: Annotated[int, between(1, MAX_CHUNK_SIZE)] = A.SEGMENT
    workers: Annotated[int, WORKERS] | None = None
    created_at: float | None = None


class Fold(SnapshotFormat):
    name = "fold"
    load_verifies = True     # every chunk's CRC32C and SHA-256 are checked as it is read
    title = "FOLD"
    suffixes = (".fold", ".mind")
    capabilities = Capabilities(
        native_dtypes=frozenset(DTYPES), any_dtype=True, chunk_index=True,
        integrity=frozenset({"structure", "data", "metadata"}))
    options_type = FoldOptions

    def sniff(self, head: bytes) -> bool:
        return head[:8] == MAGIC

    def _save(self, snapshot: Snapshot, path: str, options: FoldOptions) -> WriteResult:
        done = save_file(snapshot, path, **_writer_fields(options))
        return self.result(path, snapshot, done["file_bytes"], done["sha256"], done)

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        with FoldFile.open(path, workers=options.workers) as f:
            return f.load()

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        f = FoldFile.open(path)
        return f, f.meta()

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        return verify_file(path, workers=options.workers)

    def _inspect(self, path: str) -> dict:
        """Header, index, array table and chunk list as plain data; reads no chunk payload."""
        with FoldFile.open(path) as f:
            meta = {k: v for k, v in f.index.metadata.items() if k != "snapops"}
            return {
                "file_size": f.size, "kind": "mind" if f.is_mind else "fold",
                "version": f.index.version, "created_at_unix": f.index.created_at,
                "header": {"header_len": HEADER_LEN, "index_off": f.header.index_off,
                           "index_len": f.header.index_len},
                "layout": A.LAYOUT if f.specs or "snapops" in f.index.metadata else "peer",
                "arrays": [{"name": s.name, "chunks": list(s.chunks)} for s in f.specs],
                "meta": dict(f.snap_meta), "metadata": meta,
                "chunks": [{**c.to_json(), "header_len": CHUNK_HEADER_LEN} for c in f.chunks],
            }


def _writer_fields(options: FoldOptions) -> dict[str, Any]:
    return {"compression": options.compression, "level": options.level, "ecc": options.ecc,
            "segment": options.segment, "workers": options.workers,
            "created_at": options.created_at}


FORMAT = Fold()
save, load, open_lazy, verify, inspect = (FORMAT.save, FORMAT.load, FORMAT.open_lazy,
                                          FORMAT.verify, FORMAT.inspect)


def dumps(snapshot: Snapshot | Mapping[str, Any], **kw: Any) -> bytes:
    """The bytes ``save`` would write (writer options, plus ``limits``), built in memory.

    >>> dumps({"w": np.zeros(2)})[:8]
    b'FOLDv1\\x00\\x00'
    """
    opts = Options.build(**kw)
    pieces, metadata = plan(FORMAT.stored_snapshot(snapshot, FORMAT.options()), opts)
    buf = io.BytesIO()
    write_fold(buf, pieces, metadata, opts)
    return buf.getvalue()


def loads(data: bytes, *, trusted: bool = False, workers: int | None = 1,
          limits: Limits | None = None) -> Snapshot:
    """``load`` from bytes already in memory (``trusted=True`` lets peer TSAV chunks unpickle
    without ``weights_only``: only for files you trust).

    >>> loads(dumps({"w": np.zeros(2)}))["w"].tolist()
    [0.0, 0.0]
    """
    with FoldFile(data, trusted=trusted, workers=workers,
                  **({"limits": limits} if limits else {})) as f:
        return f.load()
