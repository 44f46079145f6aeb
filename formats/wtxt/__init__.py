"""WTXT 1.1: deterministic, ASCII, Git-diffable snapshots (docs/formats/wtxt.md).

The format contract (:class:`~snapops.formats.contract.SnapshotFormat`) as ``FORMAT``; its
verbs are this module's ``save``, ``load``, ``open_lazy``, ``verify`` and ``inspect``, plus
``write`` (to an open stream) and ``read_header`` (the first lines only). Names and dtypes WTXT
cannot spell are carried in the audit line (see :mod:`.logical`). ``open_index`` gives
chunk-level access (chunk SHA-256 values without decoding, chosen chunks decoded with or
without the checks); ``read_header_from`` reads the header of an open stream.

>>> import ml_dtypes
>>> state = {"layer.0.weight": np.ones((2, 2), ml_dtypes.bfloat16), "step": np.int64(7)}
>>> result = save(state, "s.wtxt", gen=3, ts="2026-01-02T03:04:05Z", row_blocking=True)
>>> result.arrays, len(result.sha256_all)
(2, 64)
>>> snap = load("s.wtxt")
>>> sorted(snap.arrays), snap["layer.0.weight"].dtype.name
(['layer.0.weight', 'step'], 'bfloat16')
>>> verify("s.wtxt").ok
True
"""

from __future__ import annotations

from typing import Any, BinaryIO, Mapping

from ..contract import Capabilities, SnapshotFormat, VerifyOptions, WriteResult
from ..dtypes import DTYPE_META_KEY, MAX_RECORD
from ..errors import FormatError
from ..model import ArrayMapping, Snapshot
from ..report import Report
from ._grammar import DTYPES, MAGIC
from .index import IndexedArray, WtxtIndex, open_index
from .logical import NAMES_KEY, audit_pairs, original_names
from .read import HeaderInfo, LazyWtxt, header_info, read_header, read_header_from
from .read import load as load_stored
from .verify import verify_file
from .write import WtxtOptions, save_stored, write_stored

__all__ = ["FORMAT", "Wtxt", "WtxtOptions", "save", "write", "load", "open_lazy", "verify",
           "inspect", "read_header", "read_header_from", "header_info", "HeaderInfo", "open_index",
           "IndexedArray", "WtxtIndex", "DTYPES",
           "MAGIC"]


class Wtxt(SnapshotFormat):
    name = "wtxt"
    load_verifies = True     # load_stored checks everything verify checks
    title = "WTXT"
    suffixes = (".wtxt",)
    capabilities = Capabilities(
        native_dtypes=frozenset(DTYPES), can_sign=True, can_hmac=True, chunk_index=True,
        integrity=frozenset({"structure", "data", "metadata"}), streams_text=True)
    options_type = WtxtOptions
    dtype_record_limit = MAX_RECORD

    def sniff(self, head: bytes) -> bool:
        return head.startswith(MAGIC + b"\n")

    def write(self, snapshot: Snapshot | Mapping[str, Any], out: BinaryIO,
              options: Any = None, **fields: Any) -> WriteResult:
        """``save`` to an open binary stream (bytes in file order; nothing is patched)."""
        opts = self.options(options, **fields)
        return write_stored(self.stored_snapshot(snapshot, opts), out, opts)

    def _save(self, snapshot: Snapshot, path: str, options: WtxtOptions) -> WriteResult:
        return save_stored(snapshot, path, options)

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        snap = load_stored(path, hmac_key=options.hmac_key, trusted_keys=options.trusted_keys,
                           wsum=options.wsum, require_signature=options.require_signature,
                           require_hmac=options.require_hmac, threads=options.workers or 2)
        return logical_snapshot(snap.arrays, snap.meta, snap.meta.get("audit"))

    def _decode(self, path: str, options: VerifyOptions) -> Snapshot:
        """Without the SHA-256s and HMACs inside the file (grammar, base64 and CRC32C still
        checked): for a shard whose own digest a sealed MANIFEST vouched for."""
        snap = load_stored(path, wsum=options.wsum, threads=options.workers or 2,
                           digests=False)
        return logical_snapshot(snap.arrays, snap.meta, snap.meta.get("audit"))

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        lazy = LazyWtxt(path)
        try:
            names = _names(lazy.names, lazy.audit)
        except FormatError as exc:
            lazy.close()
            raise exc.located(path) from None
        meta = header_info(lazy.header).__dict__ | {"audit": lazy.audit, "format": "wtxt"}
        record = audit_pairs(lazy.audit).get(DTYPE_META_KEY)
        return RenamedArrays(lazy, names), meta | ({DTYPE_META_KEY: record} if record else {})

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        return verify_file(path, hmac_key=options.hmac_key, trusted_keys=options.trusted_keys,
                           require_hmac=options.require_hmac,
                           require_signature=options.require_signature, wsum=options.wsum,
                           threads=options.workers or 2)

    def _inspect(self, path: str) -> dict:
        with LazyWtxt(path) as lazy:
            names = _names(lazy.names, lazy.audit)
            arrays = [{"name": names[name], "stored_name": name, "chunks": info.plan.count,
                       "chunk_bytes": info.plan.chunk_len,
                       "rows_per_chunk": info.plan.rows_per_chunk, "sha256": info.line.sha256,
                       "authenticated": not info.line.unauthenticated}
                      for name, info in lazy.infos.items()]
            for row in arrays:
                if row["stored_name"] == row["name"]:
                    del row["stored_name"]
            return {"header": header_info(lazy.header).__dict__, "arrays": arrays,
                    "audit": lazy.audit}


class RenamedArrays(ArrayMapping):
    """A WTXT lazy reader under the original names (``names``: stored -> original)."""

    def __init__(self, lazy: LazyWtxt, names: dict[str, str]) -> None:
        self.lazy = lazy
        self.stored = {original: stored for stored, original in names.items()}
        self.names = list(names.values())

    def _stored(self, name: str) -> str:
        if name not in self.stored:
            raise FormatError("no such array", path=self.lazy.path, array=name,
                              expected=f"one of {len(self.names)} arrays", got=name)
        return self.stored[name]

    def array(self, name: str):
        return self.lazy.array(self._stored(name))

    def spec(self, name: str):
        return self.lazy.spec(self._stored(name))

    def close(self) -> None:
        self.lazy.close()


def _names(stored: list[str], audit: str | None) -> dict[str, str]:
    return original_names(stored, audit_pairs(audit).get(NAMES_KEY))


def logical_snapshot(arrays: Mapping, meta: dict, audit: str | None) -> Snapshot:
    """Arrays under their original names, the dtype record moved from the audit into meta."""
    names = _names(list(arrays), audit)
    record = audit_pairs(audit).get(DTYPE_META_KEY)
    if record:
        meta = meta | {DTYPE_META_KEY: record}
    return Snapshot({names[n]: a for n, a in arrays.items()}, meta)


FORMAT = Wtxt()
save, write, load, open_lazy = FORMAT.save, FORMAT.write, FORMAT.load, FORMAT.open_lazy
verify, inspect = FORMAT.verify, FORMAT.inspect

