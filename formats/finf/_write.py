"""Writing FINF: build the tree and the block payloads, plan the layout, sink the chunks.

``save`` turns a Snapshot into a tree (``arrays``: one ``!ndarray`` per array, names sorted
byte-wise, block ``i`` for the ``i``-th name; ``meta``) and payloads; ``write_file`` is shared
with ``implode`` and the full rewrite of ``update_tree``, which pass payloads copied from
existing blocks (their encoding and checksum kept). MD5 checksums run on worker threads while
earlier blocks are being written (hashlib releases the GIL).
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..atomic import atomic_write_digest
from ..errors import DataError
from ..model import Snapshot, as_numpy, le_contiguous
from ..workers import HelperPool, run_all
from . import _spec as S
from ._blocks import encode_zstd, md5_checksum, pack_header
from ._layout import Plan, plan_layout
from ._ndarray import ref_for_array
from ._yaml import Root, dump_tree


@dataclass
class Payload:
    """Bytes for one block as stored; ``checksum`` None means "compute it if asked"."""

    data: Any                   # bytes or a C-contiguous buffer
    encoding: str = S.ENCODING_RAW
    checksum: int | None = None

    @property
    def size(self) -> int:
        return memoryview(self.data).nbytes


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def encode_tree(root: Root) -> bytes:
    """The tree as UTF-8, checked to end exactly at its own end marker."""
    text = dump_tree(root)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"the tree holds text that is not valid Unicode: {exc}") from exc
    match = S.TREE_END_RE.search(data)
    if match is None or match.end() != len(data):
        raise DataError("the tree text contains an early '...' line")   # never from PyYAML
    return data


def finf_chunks(plan: Plan, tree: bytes, payloads: list[Payload],
                checksums: list[Future | int]) -> Iterator[bytes | memoryview]:
    """The file's bytes in order, following ``plan`` (headers wait for their checksums)."""
    yield S.HEADER_LINE
    yield tree
    if plan.pad:
        yield b" " * plan.pad
    for slot, payload, checksum in zip(plan.blocks, payloads, checksums):
        value = checksum.result() if isinstance(checksum, Future) else checksum
        yield pack_header(slot.allocated, slot.used, value, payload.encoding)
        if slot.used:
            yield payload.data
        if slot.allocated > slot.used:
            yield bytes(slot.allocated - slot.used)


def write_file(path: str | os.PathLike, root: Root | None, payloads: list[Payload], *,
               checksum: bool = False, align: int = S.DEFAULT_ALIGN,
               reserve: int = S.DEFAULT_RESERVE, workers: int | None = None) -> Plan:
    """Write header, tree (None: no tree) and blocks to ``path`` atomically; returns the plan
    (``plan.sha256``: the file's SHA-256, computed while writing)."""
    tree = encode_tree(root) if root is not None else b""
    plan = plan_layout(len(tree), [p.size for p in payloads], align=align, reserve=reserve)
    with HelperPool(workers or default_workers()) as pool:
        sums: list[Future | int] = []
        for p in payloads:
            if p.checksum is not None:
                sums.append(p.checksum)
            elif checksum:
                sums.append(pool.submit(md5_checksum, p.data))
            else:
                sums.append(0)
        try:
            with atomic_write_digest(path, stable=True) as handle:   # blocks stay as they are
                for chunk in finf_chunks(plan, tree, payloads, sums):
                    handle.write(chunk)
        finally:
            for s in sums:
                if isinstance(s, Future):
                    s.cancel()
    return dataclasses.replace(plan, sha256=handle.hexdigest())


def _plain_meta(meta: Any) -> dict:
    if not isinstance(meta, dict):
        raise DataError(f"snapshot meta must be a mapping, got {type(meta).__name__}")
    for key in meta:
        if not isinstance(key, str):
            raise DataError(f"meta keys must be str, got {key!r}")
    return dict(meta)


def build(snapshot: Snapshot, *, compression: str | None, zstd_level: int,
          workers: int | None) -> tuple[Root, list[Payload]]:
    """The tree and the payloads for ``snapshot`` (zstd only where it makes a block smaller)."""
    if compression not in (None, "none", "raw", S.ENCODING_ZSTD):
        raise DataError(f"compression must be None or 'zstd', got {compression!r}")
    names = snapshot.sorted_names()
    arrays, refs = [], {}
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise DataError(f"array names must be str, got {name!r}")
        array = as_numpy(snapshot.arrays[name], name)
        refs[name] = ref_for_array(array, i, name)
        flat = le_contiguous(array).reshape(-1)
        arrays.append(flat.view(np.uint8) if flat.size else b"")
    if compression == S.ENCODING_ZSTD:
        packed = run_all(lambda a: encode_zstd(a, zstd_level), arrays,
                         workers or default_workers())
        payloads = [Payload(z, S.ENCODING_ZSTD) if len(z) < len(a) else Payload(a)
                    for a, z in zip(arrays, packed)]
    else:
        payloads = [Payload(a) for a in arrays]
    root = Root({"arrays": refs, "meta": _plain_meta(snapshot.meta)})
    return root, payloads


def save(snapshot: Snapshot, path: str | os.PathLike, *, compression: str | None = None,
         zstd_level: int = 3, checksum: bool = False, align: int = S.DEFAULT_ALIGN,
         reserve: int = S.DEFAULT_RESERVE, workers: int | None = None) -> dict:
    snap = Snapshot.coerce(snapshot)
    root, payloads = build(snap, compression=compression, zstd_level=zstd_level,
                           workers=workers)
    plan = write_file(path, root, payloads, checksum=checksum, align=align, reserve=reserve,
                      workers=workers)
    return {"path": os.fspath(path), "arrays": len(payloads), "blocks": len(plan.blocks),
            "file_bytes": plan.size, "tree_bytes": plan.tree_len, "unused_after_tree": plan.pad,
            "zstd_blocks": sum(p.encoding == S.ENCODING_ZSTD for p in payloads),
            "checksums": checksum, "sha256": plan.sha256}
