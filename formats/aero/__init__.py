"""AERO v0.1: a chunked binary container for model weights (``.aero``), and AEROSET.

Layout: a 96-byte header, a TOC of 80-byte entries, a string table, then 16-byte aligned chunk
payloads, each with the BLAKE3-256 of its uncompressed bytes in the TOC. Weights (WTSH) are
never compressed and open as zero-copy mmap views; the tensor index (TIDX) and the manifest
(MMSG) are zstd-compressed MessagePack; ``meta.json`` (MJSN) holds the snapshot's metadata.
IHSH covers the control region (header + TOC + string table); PHSH holds per-page digests.

>>> result = save({"layer.0.weight": np.ones((2, 2), np.float32)}, "model.aero",
...               page_hashes=True, gen=4)
>>> with open_lazy("model.aero") as f:
...     f["layer.0.weight"].shape, f.meta["gen"]
((2, 2), 4)
>>> verify("model.aero").ok
True

dtypes: the spec's enum (f16, f32, bf16, f64, i8..u64, bool) maps to numpy dtypes, bf16 to
``ml_dtypes.bfloat16``. A packed (0x8000) tensor loads as its raw bytes (1-D uint8) with its
logical shape and codec fields in ``meta["aero.packed"]`` (JSON), which ``save`` reads back.
"""

from __future__ import annotations

from ..contract import Capabilities, SnapshotFormat, VerifyOptions, WriteResult
from ..errors import FormatError
from ..model import ArrayMapping, Snapshot
from ..report import Report
from . import _spec as S
from . import aeroset
from .aeroset import NATIVE
from ._read import AeroFile, packed_snapshot
from ._write import Options
from ._write import save as save_file
from .verify import verify_file

__all__ = ["FORMAT", "FORMATS", "Aero", "Options", "save", "load", "open_lazy", "verify",
           "inspect", "AeroFile"]



class Aero(SnapshotFormat):
    name = "aero"
    title = "AERO"
    suffixes = (".aero",)
    capabilities = Capabilities(
        native_dtypes=NATIVE, mmap=True, chunk_index=True,
        integrity=frozenset({"structure", "data", "metadata"}),
        verify_levels=("full", "control"))
    options_type = Options

    def sniff(self, head: bytes) -> bool:
        return head[:4] == S.MAGIC

    def _save(self, snapshot: Snapshot, path: str, options: Options) -> WriteResult:
        done = save_file(snapshot, path, options)
        return self.result(path, snapshot, done["file_size"], done["sha256"], done)

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        """Arrays are read-only views on one mmap; metadata chunks are hash-checked on open,
        weights are not read (``verify`` checks them)."""
        f = AeroFile(path)
        try:
            if f.index_only:
                raise FormatError("index-only AERO file: open its model.aeroset.json instead",
                                  path=f.path, check="tidx_bounds")
            arrays = {name: f.array(name) for name in f.names}
            meta = f.meta()
        finally:
            f.close()       # the map lives on while the arrays refer to it
        return packed_snapshot(arrays, meta, f.tensors)

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        f = AeroFile(path)
        return f, f.meta()

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        return verify_file(path, options.level, workers=options.workers)

    def _inspect(self, path: str) -> dict:
        """Header, chunks, manifest, meta and tensor table as plain data."""
        with AeroFile(path) as f:
            flag_names = lambda v: [fl.name for fl in S.ChunkFlags if v & fl]  # noqa: E731
            return {
                "version": "0.1", "file_size": f.size, "uuid": f.control.uuid.hex(),
                "header": {"version": "0.1", "file_size": f.size, "uuid": f.control.uuid.hex(),
                           "chunks": len(f.control.chunks), "shards": len(f.shards),
                           "index_only": f.index_only},
                "chunks": [{"index": c.index, "fourcc": c.fourcc.decode("ascii"),
                            "name": c.name, "flags": flag_names(c.flags), "offset": c.offset,
                            "length": c.length, "ulen": c.ulen, "blake3": c.blake3.hex()}
                           for c in f.control.chunks],
                "manifest": f.metadata(S.MMSG), "meta": f.meta(), "index_only": f.index_only,
                "arrays": [{"name": t.name, "shard_id": t.shard_id, "data_off": t.data_off,
                            "data_len": t.data_len, "hash_b3": t.hash_b3,
                            **({"packed": {"shape": list(t.shape), **t.extra}}
                               if t.dtype == S.DTYPE_PACKED else {})}
                           for t in f.tensors],
            }


FORMAT = Aero()
FORMATS = {"aero": FORMAT, "aeroset": aeroset.FORMAT}
save, load, open_lazy, verify, inspect = (FORMAT.save, FORMAT.load, FORMAT.open_lazy,
                                          FORMAT.verify, FORMAT.inspect)
