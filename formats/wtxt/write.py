"""Writing WTXT: ``save_stored`` (atomic, to a path) and ``write_stored`` (to a binary stream),
both fed by the format contract (``snapops.formats.wtxt.save`` / ``write``).

Files are laid out first and filled in place by the writer's workers (see :mod:`._emit`); the
file's SHA-256 (``WriteResult.sha256``) is read back from the page cache behind them and
finishes during the fsync (:class:`~snapops.formats.atomic.TrailingDigest`). Streams get the
bytes in order through a :class:`~snapops.formats.atomic.DigestingFile`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Annotated, BinaryIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..atomic import DigestingFile, atomic_write, atomic_write_bytes
from ..contract import (COMMON_META, META_TOKEN, WORKERS, KeyPath, SaveOptions, WriteResult,
                        between)
from ..dtypes import DTYPE_META_KEY
from ..keys import coerce_hmac_key, coerce_signing_key
from ..model import Snapshot
from . import _emit
from ._grammar import MAX_ARRAY_BYTES
from ._prepare import PreparedArray, WriteOptions, check_options, prepare_arrays
from .logical import compose_audit, stored_names
from .wsum import wsum_path


@dataclass(frozen=True)
class WtxtOptions(SaveOptions):
    """WTXT writer options (the WTXT flags of ``snapops convert``); ``gen`` and ``build``
    not given are written as 0 and ``unknown``.

    ``hmac_key``/``sign_key``: key bytes/objects or key files; ``audit``: the user's
    ``key=value`` pairs (snapops adds its own ``snapops_*`` records after them).
    """

    schema: Annotated[str, META_TOKEN] = "weights/v1"
    host: Annotated[str, META_TOKEN] = "cpu"
    cuda: Annotated[str, META_TOKEN] = "off"
    merkle_prev: str | None = None
    row_blocking: bool = False
    rows_per_chunk: Annotated[int, between(1, MAX_ARRAY_BYTES)] | None = None
    hmac_key: bytes | KeyPath | None = None
    sign_key: Ed25519PrivateKey | KeyPath | None = None
    streaming: bool = False
    audit: str | None = None
    threads: Annotated[int, WORKERS] = 2


def prepare(snapshot: Snapshot, opts: WtxtOptions) -> tuple[list[PreparedArray], WriteOptions,
                                                            str]:
    """Canonical write inputs: names mapped, records in the audit line, options checked;
    gen/ts/build come from the snapshot's meta (where the contract put the options' ones).
    Other meta keys have no place in WTXT and are not written (a restore's provenance, say)."""
    mapping, names_record = stored_names(snapshot.arrays)
    audit = compose_audit(opts.audit, names_record, snapshot.meta.get(DTYPE_META_KEY))
    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(WriteOptions)
              if hasattr(opts, f.name) and f.name not in COMMON_META}
    fields.update({k: snapshot.meta[k] for k in COMMON_META
                   if snapshot.meta.get(k) is not None})
    writer = WriteOptions(**{**fields, "audit": audit,
                             "hmac_key": coerce_hmac_key(opts.hmac_key),
                             "sign_key": coerce_signing_key(opts.sign_key)})
    ts = check_options(writer)
    renamed = Snapshot({mapping[n]: a for n, a in snapshot.arrays.items()})
    return prepare_arrays(renamed, writer), writer, ts


def write_stored(snapshot: Snapshot, out: BinaryIO, opts: WtxtOptions) -> WriteResult:
    """Write WTXT to an open binary stream, in order (nothing is patched afterwards)."""
    arrays, writer, ts = prepare(snapshot, opts)
    digesting = DigestingFile(out, stable=True)     # every chunk text is a fresh buffer
    try:
        done = _emit.write_wtxt(digesting, arrays, writer, ts)
        digesting.finish()
    finally:
        digesting.close()
    return result_of(done, getattr(out, "name", "<stream>"), digesting.size,
                     digesting.hexdigest())


def save_stored(snapshot: Snapshot, path: str | os.PathLike, opts: WtxtOptions) -> WriteResult:
    """Write a WTXT file atomically (temp file, fsync, rename); with ``streaming=True`` also
    ``PATH.wsum``."""
    arrays, writer, ts = prepare(snapshot, opts)
    digest = None

    def digested(_tmp) -> None:          # after the fsync, which the read-back overlapped
        digest.result()

    with atomic_write(path, before_replace=digested) as handle:
        done, size, digest = _emit.write_file(handle.fileno(), arrays, writer, ts)
    if done.wsum is not None:
        atomic_write_bytes(wsum_path(path), done.wsum)
    return result_of(done, os.fspath(path), size, digest.result())


def result_of(done: _emit.WriteResult, path: str, size: int, sha256: str) -> WriteResult:
    details = {k: getattr(done, k) for k in ("gen", "ts", "build", "merkle_prev", "fastxor",
                                             "keyid", "wsum")}
    return WriteResult(path=path, format="wtxt", size=size, sha256=sha256, arrays=done.arrays,
                       raw_bytes=done.raw_bytes, sha256_all=done.sha256_all,
                       merkle_this=done.merkle_this, details=details)
