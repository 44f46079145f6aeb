"""WTXT 1.1: deterministic, ASCII, Git-diffable snapshots (format documentation: docs/formats/).

Verbs: ``save``/``write`` (writer), ``load`` (reader), ``open_lazy`` (one array at a time),
``verify`` (every check, first failure named), ``inspect`` (summary), ``read_header``
(``read_header_from`` for an open stream);
``open_index`` gives chunk-level access (chunk SHA-256 values without decoding, chosen chunks
decoded with or without the checks).
"""

from __future__ import annotations

import os

from ..registry import FormatHandler
from ._emit import WriteResult  # noqa: F401
from ._grammar import DTYPES, MAGIC  # noqa: F401
from ._prepare import WriteOptions, map_name, unmap_name  # noqa: F401
from .index import IndexedArray, WtxtIndex, open_index  # noqa: F401
from .read import (  # noqa: F401
    HeaderInfo, LazyWtxt, load, open_lazy, read_header, read_header_from,
)
from .verify import verify  # noqa: F401
from .write import save, write  # noqa: F401


def inspect(path: str | os.PathLike) -> dict:
    """Header values and, per array, dtype/shape/bytes/chunking/authentication (no decoding)."""
    with open_lazy(path) as lazy:
        header = read_header(path)
        arrays = []
        for name, info in lazy.infos.items():
            arr = info.line
            arrays.append({
                "name": name, "dtype": arr.dtype, "shape": list(arr.shape), "bytes": arr.nbytes,
                "chunks": info.plan.count, "chunk_bytes": info.plan.chunk_len,
                "rows_per_chunk": info.plan.rows_per_chunk, "sha256": arr.sha256,
                "authenticated": not arr.unauthenticated,
            })
    return {"format": "wtxt", "path": os.fspath(path), "header": header.__dict__,
            "arrays": arrays}


def _sniff(head: bytes) -> bool:
    return head.startswith(MAGIC + b"\n")


HANDLER = FormatHandler(name="wtxt", suffixes=(".wtxt",), sniff=_sniff, load=load, save=save,
                        verify=verify, inspect=inspect)
