"""snapops: safe, verifiable, Git-reviewable weight snapshots for ML training runs.

>>> import numpy as np, snapops
>>> snapops.save({"w": np.ones((4, 4), np.float32)}, "w.wtxt", gen=1, row_blocking=True)
>>> snapops.verify("w.wtxt").ok
True
>>> snapops.load("w.wtxt")["w"].shape
(4, 4)
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from snapops.formats import errors  # noqa: F401
from snapops.formats.errors import FormatError, SnapopsError  # noqa: F401
from snapops.formats.model import Snapshot
from snapops.formats.report import Report

__version__ = "0.1.0"
__all__ = ["Snapshot", "Snapshotter", "Shard", "Report", "load", "save", "verify",
           "SnapopsError", "FormatError"]


def __getattr__(name: str):
    if name == "Snapshotter":  # the training-side client, imported on first use
        from snapops.daemon.client import Snapshotter

        return Snapshotter
    if name == "Shard":  # a rank's box of a global array: Shard(local, global_shape=, offsets=)
        from snapops.formats.generation.plan import Shard

        return Shard
    raise AttributeError(f"module 'snapops' has no attribute {name!r}")


def load(path: str | os.PathLike, **options: Any) -> Snapshot:
    """Load any supported file (detected by magic bytes) into a Snapshot."""
    from snapops.formats.registry import detect

    return detect(path).load(path, **options)


def save(
    snapshot: Snapshot | Mapping[str, Any],
    path: str | os.PathLike,
    *,
    format: str | None = None,
    **options: Any,
) -> Any:
    """Write ``snapshot`` (a Snapshot or a dict of arrays) to ``path`` atomically.

    The format comes from ``format=`` or the file suffix; ``options`` are the format's own
    (for WTXT: gen, ts, schema, build, host, cuda, merkle_prev, row_blocking, rows_per_chunk,
    hmac_key, sign_key, streaming, audit).
    """
    from snapops.formats.registry import handler, handler_for_suffix

    chosen = handler(format) if format else handler_for_suffix(path)
    if chosen.save is None:
        raise FormatError(f"snapops cannot write {chosen.name}", path=os.fspath(path))
    return chosen.save(Snapshot.coerce(snapshot), path, **options)


def verify(path: str | os.PathLike, **options: Any) -> Report:
    """Fully verify any supported file; returns a Report (``report.ok``)."""
    from snapops.formats.registry import detect

    chosen = detect(path)
    if chosen.verify is None:
        raise FormatError(f"snapops cannot verify {chosen.name} files", path=os.fspath(path))
    return chosen.verify(path, **options)
