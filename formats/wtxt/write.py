"""Writing WTXT files: ``save`` (atomic, to a path) and ``write`` (to an open binary stream)."""

from __future__ import annotations

import os
from typing import BinaryIO, Mapping

from ..atomic import atomic_write, atomic_write_bytes
from ..keys import coerce_hmac_key, coerce_signing_key
from ..model import Snapshot
from ._emit import WriteResult, write_wtxt
from ._prepare import WriteOptions, check_options, prepare_arrays
from .wsum import wsum_path


def _options(options: dict) -> WriteOptions:
    options = dict(options)
    options["hmac_key"] = coerce_hmac_key(options.get("hmac_key"))
    options["sign_key"] = coerce_signing_key(options.get("sign_key"))
    try:
        return WriteOptions(**options)
    except TypeError as exc:
        from ..errors import DataError

        raise DataError(f"unknown WTXT option: {exc}") from None


def write(snapshot: Snapshot | Mapping, out: BinaryIO, **options) -> WriteResult:
    """Write WTXT to an open binary stream; returns root values (and WSUM bytes if streaming).

    Seekable streams get the root line patched in place; others cost one extra hashing pass.
    """
    opts = _options(options)
    ts = check_options(opts)
    arrays = prepare_arrays(Snapshot.coerce(snapshot), opts)
    return write_wtxt(out, arrays, opts, ts)


def save(snapshot: Snapshot | Mapping, path: str | os.PathLike, **options) -> WriteResult:
    """Write a WTXT file atomically (temp file, fsync, rename); with ``streaming=True`` also
    ``PATH.wsum``.

    >>> save({"w": np.eye(3, dtype=np.float32)}, "w.wtxt", gen=7, ts="2026-01-02T03:04:05Z",
    ...      row_blocking=True, hmac_key="keys/hmac.key", sign_key="keys/signing.key")
    """
    opts = _options(options)
    ts = check_options(opts)
    arrays = prepare_arrays(Snapshot.coerce(snapshot), opts)
    with atomic_write(path) as handle:
        result = write_wtxt(handle, arrays, opts, ts)
    if result.wsum is not None:
        atomic_write_bytes(wsum_path(path), result.wsum)
    return result
