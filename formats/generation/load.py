"""Reassemble a generation's arrays: original names, logical dtypes, parts joined into their
global arrays. Verifies the generation first unless told not to, so what comes back is exactly
what was sealed, bit for bit, with its dtype, or nothing.

A generation written by N training ranks loads as its global arrays, whatever N was; to resume
at another world size, each new rank takes its slice with :func:`rank_view` (what it loads) or
:func:`rank_shards` (what it requests, as :class:`~snapops.formats.generation.plan.Shard` s).
The rule is a row split (:func:`row_range`): dimension 0 is cut into ``world_size`` runs of
``ceil(rows / world_size)`` rows, as ``torch.chunk`` and DTensor's ``Shard(0)`` cut it, so the
last ranks may get fewer rows or none; 0-d arrays are not split.

Example::

    snap = load_from_source(FolderSource("repo"), "run1")
    snap["blocks.0.attn.in_proj_bias"].dtype.name, snap.meta["gen"]
    # -> ('bfloat16', 12)
    rank_view(snap.arrays, rank=1, world_size=2)["emb.weight"].shape   # rows 50..100 of 100
    # -> (50, 64)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
import threading
from pathlib import Path
from typing import Mapping

import numpy as np
from snapops.formats.dtypes import numpy_dtype
from snapops.formats.errors import DataError, FormatError
from snapops.formats.limits import check_shape
from snapops.formats.model import Snapshot
from snapops.formats.registry import handler
from snapops.formats.workers import HelperPool

from .manifest import ArrayRecord, Manifest, Part, ShardRecord
from .plan import Shard, content_digest
from .source import Source
from .verify import (
    AGE_SUFFIX,
    GenerationOptions,
    pruned_note,
    read_manifest,
    run_folder,
    verify_generation,
)


def load_from_source(source: Source, run: str, *, verify: bool = True,
                     options: GenerationOptions = GenerationOptions()) -> Snapshot:
    """The generation of ``run`` in ``source`` as one Snapshot (meta: run, gen, ts, build,
    keyid). With ``verify`` the whole generation is verified (FormatError if it fails) while
    its shards are decoded, and each shard's arrays are proven by the content digest the
    sealed MANIFEST lists for it, or else by the file's SHA-256 (``_load_while_verifying``)."""
    if options.retention is not None:
        _, manifest = read_manifest(source, run)
        note = pruned_note(manifest, options)
        if note is not None:
            raise FormatError(f"{note}: its shards are no longer in the LFS store",
                              path=f"{run_folder(run)}/MANIFEST", check="pruned")
    if verify:
        arrays, manifest = _load_while_verifying(source, run, options)
    else:
        _, manifest = read_manifest(source, run)
        arrays = assemble(source, run, manifest, options.identity)
    h = manifest.header
    return Snapshot(arrays, {"run": h.run, "gen": h.gen, "ts": h.ts, "build": h.build,
                             "keyid": h.keyid, "format": h.format})


def _load_while_verifying(source: Source, run: str, options: GenerationOptions
                          ) -> tuple[dict[str, np.ndarray], Manifest]:
    """Verify the generation, and decode each shard on the verify worker that checks it,
    while the other workers copy out the next shards. A plain shard is proven by what it
    decodes to: its arrays' BLAKE3 against the content digest the sealed MANIFEST lists for
    it (``by_content``), so the copy's SHA-256 is not computed (BLAKE3 runs at three times
    its speed here, over the raw bytes rather than WTXT's 1.39x of text); where that does not
    hold, the file's SHA-256 decides, and a shard it proves is decoded then (``on_shard``).
    Decoding where the shard was checked keeps its copy in that core's cache and needs no
    thread of its own (separate decoding threads were slower: 416-466 against 467-470 MB/s
    for 1 GiB of WTXT). Nothing is returned unless the whole generation verifies; its
    failure, not a decoding error it caused, is what is raised, and after a decoding error
    no further shard is decoded."""
    _, manifest = read_manifest(source, run)
    loader = _Assembler(source, run, manifest, options.identity, verified=True)
    errors: list[BaseException] = []

    def decode(shard: str) -> None:
        if errors:
            return
        try:
            loader.load(shard)
        except BaseException as exc:     # raised once the verification is known
            errors.append(exc)

    with loader, HelperPool(1) as pool:
        verifying = pool.submit(verify_generation, source, run, dataclasses.replace(
            options, on_shard=decode, by_content=loader.load_if_content_matches))
        report = verifying.result()
        if not report.ok:
            raise report.failure
        if errors:
            raise errors[0]
        loader.load_rest()
    return loader.out, manifest


def assemble(source: Source, run: str, manifest: Manifest, identity=None, *,
             verified: bool = False) -> dict[str, np.ndarray]:
    """Every array of ``manifest``; single-part arrays stay the reader's (mapped) arrays.
    Each shard is verified as it is loaded unless the generation was (``verified``)."""
    with _Assembler(source, run, manifest, identity, verified=verified) as loader:
        loader.load_rest()
    return loader.out


LAST_SHARD_THREADS = 2


class _Assembler:
    """Loads a generation's shards one at a time, in any order, into its arrays."""

    def __init__(self, source: Source, run: str, manifest: Manifest, identity, *,
                 verified: bool) -> None:
        self.source, self.identity, self.verified = source, identity, verified
        self.by_shard: dict[str, list[ArrayRecord]] = {}
        for array in manifest.arrays:
            for part in array.parts:
                self.by_shard.setdefault(part.shard, []).append(array)
        self.formats = {s.path: s.format for s in manifest.shards}
        self.wsums = {f.of: f.path for f in manifest.files if f.role == "wsum"}
        self.folder = run_folder(run)
        self.out: dict[str, np.ndarray] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> "_Assembler":
        self._tmp = tempfile.TemporaryDirectory(prefix="snapops-load-")
        return self

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()

    def load(self, shard_path: str) -> None:
        """Decode one shard and place its parts (a shard holding no part, or one placed
        already: nothing to decode), then let the source free its copy. Safe to call from
        several threads at once (for different shards)."""
        with self._lock:
            decode = shard_path in self.by_shard and shard_path not in self._done
            self._done.add(shard_path)
        wsum = f"{self.folder}/{self.wsums[shard_path]}" if shard_path in self.wsums else None
        where = f"{self.folder}/{shard_path}"
        if decode:
            with _plain(self.source, where, wsum, self.identity, Path(self._tmp.name)) as local:
                with _named_by(local, where):
                    loaded = _load_shard(local, self.formats[shard_path],
                                         verify=not self.verified)
            for array in self.by_shard[shard_path]:
                _place(array, shard_path, loaded, self.out, self._lock)
        release = getattr(self.source, "release", None)   # a git source's kept copies
        if release is not None:
            for done in (where, wsum):
                if done is not None:
                    release(done)

    def load_if_content_matches(self, shard: ShardRecord, local: Path,
                                wsum: Path | None) -> bool:
        """Decode ``local``, a copy of ``shard`` whose file digest was not checked, and keep
        its parts only if together they hash to the content digest the sealed MANIFEST lists
        for the shard (:func:`~.plan.content_digest`: BLAKE3 over each part's name, dtype,
        shape and bytes, as the writer computed it over the arrays it was given): they are
        then exactly what was sealed. False: nothing kept (the file's digest decides)."""
        where = f"{self.folder}/{shard.path}"
        if wsum is not None and wsum != Path(f"{local}.wsum"):
            raise FormatError("a WSUM must lie beside its shard", path=where, check="fileset")
        with _named_by(local, where):
            loaded = _load_shard(local, self.formats[shard.path], verify=False)
        pieces = [(array, part, _piece(array, part, loaded, shard.path))
                  for array in self.by_shard.get(shard.path, ())
                  for part in array.parts if part.shard == shard.path]
        # one thread: the verifier's workers already hash shards side by side (BLAKE3's own
        # threads made an AERO restore 10-12% slower: 2305-2322 against 2570-2592 MB/s);
        # two for the last shard, when no other is left to keep the second core busy
        parts = {part.key: piece for _, part, piece in pieces}
        with self._lock:
            last = self._done >= self.by_shard.keys() - {shard.path}
        if content_digest(parts, threads=LAST_SHARD_THREADS if last else 1) != shard.content:
            return False
        with self._lock:
            self._done.add(shard.path)
        for array, part, piece in pieces:
            _put(array, part, piece, self.out, self._lock)
        return True

    def load_rest(self) -> None:
        for shard_path in self.by_shard:
            self.load(shard_path)


@contextlib.contextmanager
def _plain(source: Source, path: str, wsum: str | None, identity, tmp: Path):
    """A plaintext file of the shard at ``path``, with its WSUM (if any) beside it."""
    with source.file(path) as local, \
            (source.file(wsum) if wsum else contextlib.nullcontext()) as local_wsum:
        if not path.endswith(AGE_SUFFIX):
            if local_wsum is not None and local_wsum != Path(f"{local}.wsum"):
                raise FormatError("a WSUM must lie beside its shard", path=wsum, check="fileset")
            yield local
            return
        if identity is None:
            raise FormatError("age-encrypted shard: an identity is needed to load it", path=path,
                              check="keys", expected="--identity FILE", got="none")
        from snapops.formats.armor import decrypt_file

        plain = tmp / Path(path).name.removesuffix(AGE_SUFFIX)
        decrypt_file(local, plain, identity)
        if local_wsum is not None:
            decrypt_file(local_wsum, Path(f"{plain}.wsum"), identity)
        try:
            yield plain
        finally:
            plain.unlink(missing_ok=True)
            Path(f"{plain}.wsum").unlink(missing_ok=True)


def _load_shard(local: Path, fmt: str, verify: bool) -> dict[str, np.ndarray]:
    return dict(handler(fmt).load(str(local), verify=verify).arrays)


@contextlib.contextmanager
def _named_by(local: Path, where: str):
    """Errors about the copy ``local`` name the tree's path ``where``, as every other
    finding about a generation does."""
    try:
        yield
    except FormatError as exc:
        if exc.path == str(local):
            exc.path = where
            exc.args = (str(exc),)
        raise


def _place(array: ArrayRecord, shard: str, loaded: dict[str, np.ndarray],
           out: dict[str, np.ndarray], lock: threading.Lock) -> None:
    for part in array.parts:
        if part.shard == shard:
            _put(array, part, _piece(array, part, loaded, shard), out, lock)


def _piece(array: ArrayRecord, part: Part, loaded: dict[str, np.ndarray],
           shard: str) -> np.ndarray:
    """The part as the shard holds it, in the array's logical dtype and its box's shape."""
    logical = numpy_dtype(array.dtype)
    piece = loaded.get(part.key)
    extent = tuple(hi - lo for lo, hi in part.box)
    if (piece is None or logical is None or piece.dtype.itemsize != logical.itemsize
            or piece.size != math.prod(extent)):
        raise FormatError("the shard does not hold this part as the MANIFEST describes it "
                          "(load with verify to find out why)", path=shard,
                          array=array.name, expected=f"{part.key}: {array.dtype} {extent}",
                          got="missing" if piece is None else f"{piece.dtype} {piece.shape}")
    if piece.dtype != logical:
        piece = piece.view(logical)  # same width: the format stored the bits as uint
    return piece.reshape(extent)


def _put(array: ArrayRecord, part: Part, piece: np.ndarray, out: dict[str, np.ndarray],
         lock: threading.Lock) -> None:
    if len(array.parts) == 1:
        out[array.name] = piece
        return
    logical = piece.dtype
    with lock:     # the parts of one array may come from shards decoded side by side
        target = out.get(array.name)
        if target is None:
            parts = sum(math.prod(hi - lo for lo, hi in p.box) for p in array.parts)
            check_shape(array.name, array.shape, logical.itemsize,
                        available=parts * logical.itemsize, path=part.shard)
            target = out[array.name] = np.empty(array.shape, logical)
    target[tuple(slice(lo, hi) for lo, hi in part.box)] = piece


def row_range(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of ``rank`` when ``rows`` rows are split over ``world_size``
    ranks: runs of ``ceil(rows / world_size)`` rows, the last ranks get fewer or none.

    >>> [row_range(10, r, 4) for r in range(4)]
    [(0, 3), (3, 6), (6, 9), (9, 10)]
    """
    if not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is not in 0..{world_size - 1}")
    per = -(-rows // world_size)
    return min(rank * per, rows), min((rank + 1) * per, rows)


def rank_slice(array: np.ndarray, rank: int, world_size: int) -> Shard:
    """Rank ``rank``'s rows of ``array`` (a view) with where they lie; a 0-d array whole."""
    if array.ndim == 0:
        return Shard(array, global_shape=(), offsets=())
    start, stop = row_range(array.shape[0], rank, world_size)
    return Shard(array[start:stop], global_shape=array.shape,
                 offsets=(start,) + (0,) * (array.ndim - 1))


def rank_view(state: Mapping[str, np.ndarray], rank: int, world_size: int
              ) -> dict[str, np.ndarray]:
    """What rank ``rank`` of ``world_size`` loads: its rows of every array (views), 0-d
    arrays whole on every rank.

    >>> rank_view({"w": np.zeros((5, 2)), "step": np.array(3)}, 1, 2)["w"].shape
    (2, 2)
    """
    return {name: rank_slice(array, rank, world_size).local for name, array in state.items()}


def rank_shards(state: Mapping[str, np.ndarray], rank: int, world_size: int
                ) -> dict[str, Shard]:
    """What rank ``rank`` of ``world_size`` requests so that the ranks together hold every
    array exactly once: its non-empty row slices; 0-d arrays and arrays without rows on rank
    0 only.

    >>> sorted(rank_shards({"w": np.zeros((5, 2)), "step": np.array(3)}, 0, 2))
    ['step', 'w']
    """
    out = {}
    for name, array in state.items():
        piece = rank_slice(array, rank, world_size)
        unsplit = array.ndim == 0 or array.shape[0] == 0
        if (rank == 0) if unsplit else piece.local.shape[0] > 0:
            out[name] = piece
    return out
