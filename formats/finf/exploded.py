"""Exploded form: the tree file plus one single-block FINF file per block, and back.

``explode("m.finf", "out/")`` writes ``out/m.finf`` (header + tree, every ``source`` a relative
URI) and ``out/m0000.finf``, ``out/m0001.finf``, ... (header + one block, no padding, the
block's stored bytes, encoding and checksum unchanged). ``implode("out/m.finf", "m2.finf")``
reads the URIs back into local blocks; for a file snapops wrote with default options the
result is byte-identical to the original. URIs never leave the tree file's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DataError
from . import _spec as S
from ._blocks import Block, stored
from ._ndarray import NDArrayRef
from ._read import FinfFile
from ._write import Payload, write_file


def _block_name(stem: str, index: int) -> str:
    return f"{stem}{index:04d}.finf"


def _source_block(f: FinfFile, ref: NDArrayRef) -> tuple[tuple, object, Block]:
    """Where an entry's bytes are stored: (identity, buffer, block)."""
    if ref.is_external:
        ext = f.external(ref)
        return ("uri", ext.path), ext.buffer(), ext.blocks[0]
    return ("local", ref.source), f.buffer(), f.blocks[ref.source]


def explode(path: str | os.PathLike, folder: str | os.PathLike, *,
            limits: S.Limits = S.DEFAULT_LIMITS) -> dict:
    """Write ``path`` in exploded form into ``folder``; returns the files written.

    Example::

        explode("m.finf", "parts")["blocks"]
        # -> ['m0000.finf', 'm0001.finf']
    """
    source = Path(path)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tree_path = out / source.name
    if tree_path.resolve() == source.resolve():
        raise DataError("explode would overwrite its input: choose another folder")
    stem = source.stem
    written: list[str] = []
    with FinfFile(source, limits=limits) as f:
        uri_of: dict[tuple, str] = {}
        for ref in f.refs.values():
            key, buf, block = _source_block(f, ref)
            if key not in uri_of:
                uri_of[key] = _block_name(stem, len(uri_of))
                with stored(buf, block) as data:
                    write_file(out / uri_of[key], None,
                               [Payload(data, block.encoding, block.checksum)])
                written.append(uri_of[key])
            ref.source = uri_of[key]
        write_file(tree_path, f.tree, [])
        dropped = len(f.blocks) - sum(1 for k in uri_of if k[0] == "local")
    return {"tree": str(tree_path), "blocks": written, "unreferenced_blocks_dropped": dropped}


def implode(tree_file: str | os.PathLike, out: str | os.PathLike, *,
            align: int = S.DEFAULT_ALIGN, reserve: int = S.DEFAULT_RESERVE,
            limits: S.Limits = S.DEFAULT_LIMITS) -> dict:
    """Gather an exploded tree and its block files into one FINF file ``out`` (atomically).

    Example::

        implode("parts/m.finf", "m2.finf")["blocks"]
        # -> 2
    """
    payloads: list[Payload] = []
    with FinfFile(tree_file, limits=limits) as f:
        index_of: dict[tuple, int] = {}
        for name, ref in f.refs.items():
            f.array(name)     # a hand-edited tree must point at bytes that hold the array
            key, buf, block = _source_block(f, ref)
            if key not in index_of:
                index_of[key] = len(payloads)
                payloads.append(Payload(stored(buf, block), block.encoding, block.checksum))
            ref.source = index_of[key]
        try:
            plan = write_file(out, f.tree, payloads, align=align, reserve=reserve)
        finally:
            for p in payloads:
                p.data.release()
    return {"path": os.fspath(out), "blocks": len(plan.blocks), "file_bytes": plan.size}
