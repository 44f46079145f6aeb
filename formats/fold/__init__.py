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

>>> save({"w": np.ones((2, 3), np.float32)}, "w.fold", ecc="rs(32)")["chunks"]
1
>>> load("w.fold")["w"].sum()
6.0
>>> verify("w.fold").ok
True
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..model import Snapshot
from ..registry import FormatHandler
from ._layout import MAGIC, MAX_CHUNK_SIZE, MAX_INDEX_SIZE, Limits
from ._read import FoldFile
from ._write import Options, plan, write_fold
from ._write import save as _save
from .verify import inspect, verify

__all__ = ["save", "load", "loads", "dumps", "open_lazy", "verify", "inspect", "sniff",
           "HANDLER", "FoldFile", "Limits", "MAX_CHUNK_SIZE", "MAX_INDEX_SIZE"]


def save(snapshot: Snapshot | Mapping[str, Any], path: str | os.PathLike, *,
         compression: str = "zstd", level: int = 3, ecc: str | int | None = "none",
         segment: int | None = None, workers: int | None = None,
         created_at: float | None = None, limits: Limits | None = None) -> dict:
    """Write ``snapshot`` to ``path`` atomically; returns a summary (chunks, sizes).

    ``compression``: ``"zstd"`` (at ``level``) or ``"none"``. ``ecc``: ``"none"``, ``"rs(N)"``
    or a preset ``"low"``/``"med"``/``"high"`` (rs(16)/rs(32)/rs(64)). Arrays are split into
    chunks of ``segment`` bytes (16 MiB). ``created_at`` (the index's ``created_at_unix``)
    defaults to ``$SOURCE_DATE_EPOCH`` or 0, so equal input gives equal bytes.

    >>> save({"w": np.zeros(4)}, "w.fold", ecc="med")["ecc_bytes"]
    32
    """
    extra = {} if segment is None else {"segment": segment}
    return _save(snapshot, path, compression=compression, level=level, ecc=ecc,
                 workers=workers, created_at=created_at, limits=limits, **extra)


def load(path: str | os.PathLike, *, trusted: bool = False, workers: int | None = None,
         use_mmap: bool = True, limits: Limits | None = None) -> Snapshot:
    """Read every array, checking each chunk it reads (ECC, CRC32C, SHA-256, sizes).

    Chunks are read through a read-only mmap, or with ``use_mmap=False`` by ``preadv`` into
    reused per-thread buffers.

    Peer files: ``torch_state`` (TSAV) arrays keep their state_dict keys and need torch;
    ``trusted=True`` lets ``torch.load`` run without ``weights_only`` (only for files you trust).
    NPZ0 arrays are named ``<chunk>/<key>``. Arrays are writable copies.

    >>> load("w.fold").sorted_names()
    ['w']
    """
    with FoldFile.open(path, trusted=trusted, workers=workers, use_mmap=use_mmap,
                       **({"limits": limits} if limits else {})) as f:
        return f.load()


def open_lazy(path: str | os.PathLike, *, trusted: bool = False,
              use_mmap: bool = True) -> FoldFile:
    """Map the file and parse its index only; ``f[name]`` reads and checks one array's chunks
    (a writable copy), ``f.read_chunk(name)`` one chunk's payload, ``f.events`` ECC repairs.

    >>> with open_lazy("w.fold") as f:
    ...     f.names, f["w"].dtype, f.read_chunk("w")[:4]
    (['w'], dtype('float64'), b'\\x00\\x00\\x00\\x00')
    """
    return FoldFile.open(path, trusted=trusted, use_mmap=use_mmap)


def dumps(snapshot: Snapshot | Mapping[str, Any], **kw: Any) -> bytes:
    """The bytes ``save`` would write (same options), built in memory."""
    import io

    opts = Options.build(**kw)
    pieces, metadata = plan(Snapshot.coerce(snapshot), opts)
    buf = io.BytesIO()
    write_fold(buf, pieces, metadata, opts)
    return buf.getvalue()


def loads(data: bytes, *, trusted: bool = False, workers: int | None = 1,
          limits: Limits | None = None) -> Snapshot:
    """``load`` from bytes already in memory."""
    with FoldFile(data, trusted=trusted, workers=workers,
                  **({"limits": limits} if limits else {})) as f:
        return f.load()


def sniff(head: bytes) -> bool:
    return head[:8] == MAGIC


HANDLER = FormatHandler(name="fold", suffixes=(".fold", ".mind"), sniff=sniff, load=load,
                        save=save, verify=verify, inspect=inspect)
