"""AEROSET: a model split into several AERO parts plus a global index.

A folder holds ``model.aeroset.json`` (the set's index: parts with sha256, size and shard ids,
and ``global_tidx``), ``index.aero`` (IHSH, MJSN, MMSG and the TIDX of every tensor, no weights)
and ``part-NNN.aero`` files, each a standalone AERO file. Shard ids are global: shard 5 is the
WTSH chunk ``weights.shard5`` of whichever part lists it.

Saving (staged members, renames, several sets in one folder) is in ``_aeroset_save``; the
JSON index's parsing and validation in ``_aeroset_index``.

>>> state = {f"layer.{i}.weight": np.full((4, 4), i, np.float32) for i in range(3)}
>>> FORMAT.save(state, "out/model.aeroset.json", shard_max=64, part_shards=2).details["parts"]
2
>>> with open_set("out/model.aeroset.json") as s:
...     s["layer.2.weight"][0, 0]
np.float32(2.0)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from ..dtypes import dtype_name
from ..integrity import file_sha256
from ..contract import Capabilities, SnapshotFormat, VerifyOptions, WriteResult
from ..errors import ChecksumError, FormatError
from ..iosafe import open_input
from ..model import ArrayMapping, Snapshot
from ..report import Report
from . import _spec as S
from ._aeroset_index import MAX_SET_JSON, parse_set, set_paths
from ._aeroset_save import AerosetOptions, save_set
from ._read import AeroFile, Tensor, packed_snapshot
from .verify import verify_file

NATIVE = frozenset(dtype_name(dtype) for _, dtype in S.DTYPES.values())


# ---- reading -------------------------------------------------------------------------------

class AeroSet(ArrayMapping):
    """An open AEROSET: the global TIDX from ``index.aero``; parts are opened on first use."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.folder, self.json_path = set_paths(path)
        where = str(self.json_path)
        try:
            with open_input(self.json_path) as f:   # read what is there, up to the bound
                data = f.read(min(os.fstat(f.fileno()).st_size, MAX_SET_JSON) + 1)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror}", path=where) from exc
        self.doc = parse_set(data, where)
        self.index = AeroFile(_member(self.folder, self.doc["global_tidx"]["path"]),
                              follow=False)
        self.tensors = self.index.tensors
        self.by_name = {t.name: t for t in self.tensors}
        self._parts: dict[str, AeroFile] = {}
        self._maps: dict[str, dict[int, int]] = {}
        self._listed = {p["path"]: p["shards"] for p in self.doc["parts"]}
        for t in self.tensors:
            if t.shard_id not in self.doc["owner"]:
                self.close()
                raise FormatError("tensor's shard is in no part", path=where, array=t.name,
                                  expected="a shard id listed under parts", got=t.shard_id,
                                  check="tidx_bounds")

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def part(self, rel: str) -> AeroFile:
        if rel not in self._parts:
            f = AeroFile(_member(self.folder, rel), follow=False)
            try:
                self._maps[rel] = _shard_map(f, self._listed[rel])
            except FormatError:
                f.close()
                raise
            self._parts[rel] = f
        return self._parts[rel]

    def shard_map(self, rel: str) -> dict[int, int]:
        """Shard ids as numbered inside part ``rel`` -> global shard ids."""
        self.part(rel)
        return self._maps[rel]

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        t = self.by_name.get(name)
        return (t.np_dtype, tuple(t.np_shape)) if t is not None else super().spec(name)

    def array(self, name: str) -> np.ndarray:
        """The tensor as a view on its part's mmap, once the part agrees with the index."""
        t = self.by_name.get(name)
        if t is None:
            raise FormatError("no such tensor", path=str(self.json_path), array=name)
        rel = self.doc["owner"][t.shard_id]
        part = self.part(rel)
        _same_entry(t, part.by_name.get(name), part.path, self._maps[rel])
        return part.array(name)

    def meta(self) -> dict:
        return self.index.meta()

    def close(self) -> None:
        self.index.close()
        for f in self._parts.values():
            f.close()
        self._parts.clear()


def _shard_map(part: AeroFile, listed: list[int]) -> dict[int, int]:
    """Part shard id -> global shard id.

    snapops numbers shards globally inside parts (the part listed with [4, 5] holds
    ``weights.shard4`` and ``weights.shard5``); the reference writer numbers them from 0 in each
    part. Both are accepted: the ids must be the listed ones, or 0..n-1 in listed order.
    """
    held = sorted(part.shard_sizes())
    if len(held) != len(part.shards):
        raise FormatError("part has WTSH chunks not named weights.shard{N}", path=part.path,
                          got=sorted(part.shards), check="aeroset")
    if held == sorted(listed):
        return {s: s for s in held}
    if held == list(range(len(listed))):
        return dict(zip(held, sorted(listed)))
    raise FormatError("part holds other shards than the AEROSET index lists", path=part.path,
                      expected=str(sorted(listed)), got=held, check="aeroset")


def _same_entry(global_t: Tensor, part_t: Tensor | None, part_path: str,
                shard_map: dict[int, int]) -> None:
    """The part's TIDX entry describes the same bytes as the global one (and hash_b3, if both
    carry it)."""
    same = part_t is not None and shard_map.get(part_t.shard_id) == global_t.shard_id
    if same:
        mine, theirs = global_t.entry(), part_t.entry()
        for key in ("shard_id", "hash_b3"):
            if key == "shard_id" or key not in mine or key not in theirs:
                mine.pop(key, None)
                theirs.pop(key, None)
        same = mine == theirs
    if not same:
        raise FormatError("part and global index disagree about a tensor", path=part_path,
                          array=global_t.name, expected=str(global_t.entry()),
                          got=None if part_t is None else str(part_t.entry()), check="aeroset")


def open_set(path: str | os.PathLike) -> AeroSet:
    return AeroSet(path)


def verify_set(path: str | os.PathLike, level: str = "full", *,
               workers: int | None = None) -> Report:
    """Index JSON, sizes (and at ``full`` the sha256) of every file, each file's own verify,
    and agreement between the global TIDX and the parts."""
    folder, json_path = set_paths(path)
    report = Report(path=str(json_path), format="aeroset")
    report.details["level"] = level
    try:
        with AeroSet(json_path) as s:
            report.passed("structure")
            files = [(s.doc["global_tidx"], True)] + [(p, False) for p in s.doc["parts"]]
            for entry, is_index in files:
                _verify_member(folder, entry, level, workers, report)
            _verify_agreement(s)
            report.passed("aeroset")
            report.arrays = len(s.tensors)
            report.raw_bytes = sum(t.data_len for t in s.tensors)
            report.details["parts"] = len(s.doc["parts"])
    except FormatError as exc:
        return report.fail(exc)
    return report


def _member(folder: Path, rel: str) -> Path:
    """The file ``rel`` (a name the JSON gives) beside the set's JSON, never through a
    symlink: a checked-out tree could plant one pointing anywhere."""
    file = folder / rel
    try:
        link = stat.S_ISLNK(os.lstat(file).st_mode)
    except FileNotFoundError:
        link = False                     # the caller's read names the missing file
    except OSError as exc:               # a name too long for the file system, say
        raise FormatError(f"cannot read: {exc.strerror}", path=str(file), check="aeroset",
                          expected="a file beside the set's JSON") from None
    if link:
        raise FormatError("a member of the set is a symlink (not followed)", path=str(file),
                          check="aeroset", expected="a regular file beside the set's JSON",
                          got="a symlink")
    return file


def _verify_member(folder: Path, entry: dict, level: str, workers: int | None,
                   report: Report) -> None:
    file = _member(folder, entry["path"])
    try:
        size = file.stat().st_size
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror}", path=str(file), check="aeroset") from exc
    if size != entry["size_bytes"]:
        raise FormatError("file size disagrees with the AEROSET index", path=str(file),
                          expected=str(entry["size_bytes"]), got=size, check="aeroset")
    if level == "full":
        got = file_sha256(file)
        if got != entry["sha256"]:
            raise ChecksumError("file sha256 disagrees with the AEROSET index", path=str(file),
                                expected=entry["sha256"], got=got, check="sha256")
        report.passed("sha256")
    sub = verify_file(file, level, workers=workers)
    if not sub.ok:
        raise sub.failure
    report.notes.extend(f"{entry['path']}: {n}" for n in sub.notes
                        if "index-only" not in n and "PHSH" not in n)


def _verify_agreement(s: AeroSet) -> None:
    """Each part holds exactly the shards it is listed with, and the tensors the index says."""
    seen: set[str] = set()
    for part in s.doc["parts"]:
        f = s.part(part["path"])
        for t in f.tensors:
            g = s.by_name.get(t.name)
            if g is None or t.name in seen:
                raise FormatError("part holds a tensor the global index lacks (or another "
                                  "part holds too)", path=f.path, array=t.name, check="aeroset")
            _same_entry(g, t, f.path, s.shard_map(part["path"]))
            seen.add(t.name)
    missing = [t.name for t in s.tensors if t.name not in seen]
    if missing:
        raise FormatError("tensors of the global index are in no part", path=str(s.json_path),
                          array=missing[0], got=f"{len(missing)} missing", check="aeroset")


class Aeroset(SnapshotFormat):
    name = "aeroset"
    title = "AEROSET"
    suffixes = (".aeroset.json",)
    capabilities = Capabilities(
        native_dtypes=NATIVE, mmap=True, integrity=frozenset({"structure", "data", "metadata"}),
        verify_levels=("full", "control"), multi_file=True)
    options_type = AerosetOptions

    def sniff(self, head: bytes) -> bool:
        return head.lstrip()[:1] == b"{" and b'"AEROSET"' in head

    def _save(self, snapshot: Snapshot, path: str, options: AerosetOptions) -> WriteResult:
        done = save_set(snapshot, path, options)
        return self.result(done["index"], snapshot, done["size"], done["sha256"], done)

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        """Every tensor as mmap views on the parts (index order), meta from index.aero."""
        with AeroSet(path) as s:
            return packed_snapshot({name: s[name] for name in s.names}, s.meta(), s.tensors)

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        s = AeroSet(path)
        return s, s.meta()

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        return verify_set(path, options.level, workers=options.workers)

    def _inspect(self, path: str) -> dict:
        with AeroSet(path) as s:
            return {"path": str(s.json_path), "version": s.doc["format"].get("version"),
                    "header": {"parts": len(s.doc["parts"]), "tensors": len(s.tensors)},
                    "model": s.doc["model"], "parts": s.doc["parts"],
                    "global_tidx": s.doc["global_tidx"], "meta": s.meta()}


FORMAT = Aeroset()
save, load, open_lazy, verify, inspect = (FORMAT.save, FORMAT.load, FORMAT.open_lazy,
                                          FORMAT.verify, FORMAT.inspect)
