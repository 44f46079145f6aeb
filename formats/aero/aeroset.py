"""AEROSET: a model split into several AERO parts plus a global index.

A folder holds ``model.aeroset.json`` (the set's index: parts with sha256, size and shard ids,
and ``global_tidx``), ``index.aero`` (IHSH, MJSN, MMSG and the TIDX of every tensor, no weights)
and ``part-NNN.aero`` files, each a standalone AERO file. Shard ids are global: shard 5 is the
WTSH chunk ``weights.shard5`` of whichever part lists it.

A save over an existing set writes each member at a staged name, then renames it to the name
the old set gives the same bytes or to a name tagged with its SHA-256 (``part-000.<hex16>.aero``),
so no file the old set needs is replaced; the JSON is then replaced in one atomic step and the
old set's files it no longer lists are removed (docs/formats/aero.md, section 9).

The JSON names its files, so several sets can share a folder: a set saved as
``<name>.aeroset.json`` writes ``<name>.index.aero`` and ``<name>.part-NNN.aero`` (the default
``model.aeroset.json`` keeps the plain names above). A save never overwrites a file another set
in the folder lists (DataError); readers follow the JSON, whatever the names.

>>> state = {f"layer.{i}.weight": np.full((4, 4), i, np.float32) for i in range(3)}
>>> FORMAT.save(state, "out/model.aeroset.json", shard_max=64, part_shards=2).details["parts"]
2
>>> with open_set("out/model.aeroset.json") as s:
...     s["layer.2.weight"][0, 0]
np.float32(2.0)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Iterator

import numpy as np

from ..atomic import atomic_write_bytes, fsync_dir, remove_leftover_temps
from ..dtypes import dtype_name
from ..integrity import file_sha256
from ..contract import Capabilities, SnapshotFormat, VerifyOptions, WriteResult, between
from ..errors import ChecksumError, DataError, FormatError, LimitError, UnsupportedVersionError
from ..iosafe import open_input
from ..model import ArrayMapping, Snapshot
from ..report import Report
from . import _decode
from . import _spec as S
from ._layout import ShardPlan, plan_tensors
from ._read import AeroFile, Tensor, packed_snapshot
from ._write import Options, prepare, write_file
from .verify import verify_file

NATIVE = frozenset(dtype_name(dtype) for _, dtype in S.DTYPES.values())

SET_NAME = "model.aeroset.json"
INDEX_NAME = "index.aero"
MAX_SET_JSON = 64 << 20
TAG_HEX = 16                 # hex digits of a member's SHA-256 in its tagged name
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{12}\.tmp")    # formats/atomic.py's temps


def _member_names(json_path: Path, parts: int) -> tuple[str, list[str]]:
    """The index file's and the parts' plain names of the set ``json_path``: ``index.aero`` and
    ``part-NNN.aero`` for ``model.aeroset.json``, else prefixed with the set's name."""
    prefix = _set_prefix(json_path)
    if "\\" in prefix:    # the reader refuses a backslash in a member path
        raise DataError(f"AEROSET name {json_path.name!r}: expected a name without a backslash")
    names = [f"{prefix}{INDEX_NAME}"] + [f"{prefix}part-{i:03d}.aero" for i in range(parts)]
    for name in names:
        if len(os.fsencode(_tagged_name(name, "0" * TAG_HEX))) > 255:
            raise DataError(f"AEROSET name {json_path.name[:40]!r}...: expected a shorter name "
                            f"(its part file {name[:40]!r}... would exceed 255 bytes)")
    return names[0], names[1:]


def _set_prefix(json_path: Path) -> str:
    return "" if json_path.name == SET_NAME else json_path.name[:-len(".aeroset.json")] + "."


def _tagged_name(plain: str, sha256: str) -> str:
    """``part-000.aero`` -> ``part-000.<first 16 hex digits of the file's SHA-256>.aero``."""
    return f"{plain[:-len('.aero')]}.{sha256[:TAG_HEX]}.aero"


def _staged_name(plain: str) -> str:
    """Where a member is written before its SHA-256, hence its name, is known."""
    return f"{plain[:-len('.aero')]}.staged.aero"


def _member_pattern(json_path: Path) -> re.Pattern:
    """Names this set's saves write: plain, staged or tagged index and part files."""
    tag = rf"(?:\.(?P<tag>staged|[0-9a-f]{{{TAG_HEX}}}))?"
    return re.compile(re.escape(_set_prefix(json_path)) + r"(?P<stem>index|part-\d{3,})" + tag
                      + r"\.aero")


_UNREADABLE = object()


def _read_set(json_path: Path) -> dict | None | object:
    """The set's parsed JSON; None if there is none; ``_UNREADABLE`` if it cannot be read."""
    if not os.path.lexists(json_path):
        return None
    try:
        with open_input(json_path) as f:
            return parse_set(f.read(MAX_SET_JSON + 1), str(json_path))
    except (OSError, FormatError):
        return _UNREADABLE


def _listed_names(doc: dict | None) -> dict[str, str]:
    """File name -> sha256 of every file a parsed set lists."""
    if not isinstance(doc, dict):
        return {}
    return {PurePosixPath(e["path"]).as_posix(): e["sha256"]
            for e in doc["parts"] + [doc["global_tidx"]]}


def _listed_by_others(folder: Path, json_path: Path) -> tuple[dict[str, str], bool]:
    """File name -> the other set of ``folder`` whose JSON lists it, and whether every other
    set's JSON could be read (one that cannot lists nothing here)."""
    listed: dict[str, str] = {}
    try:
        others = [p for p in folder.glob("*.aeroset.json") if p.name != json_path.name]
    except OSError:
        return listed, False
    all_read = True
    for other in others:
        doc = _read_set(other)
        all_read = all_read and doc is not _UNREADABLE
        for name in _listed_names(doc if doc is not _UNREADABLE else None):
            listed.setdefault(name, other.name)
    return listed, all_read


def _paths(path: str | os.PathLike) -> tuple[Path, Path]:
    p = Path(path)
    if p.name.endswith(".aeroset.json"):
        return p.parent, p
    return p, p / SET_NAME


@dataclass(frozen=True)
class AerosetOptions(Options):
    """AERO options, plus ``part_shards``: WTSH shards per part file (default 4, as the
    reference writer)."""

    part_shards: Annotated[int, between(1)] = 4


# Every step of a save that touches the folder goes through one of these names (tests make
# them fail at each step in turn): write_file, _rename, fsync_dir, atomic_write_bytes, _remove.

def _rename(src: Path, dst: Path) -> None:
    os.replace(src, dst)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """One snapops save at a time per folder, so a save's cleanup never takes another save's
    members for leftovers (file systems without flock on folders go unlocked)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass
class _Save:
    """One save in progress: where it writes, what it replaces, which files it made."""

    folder: Path
    json_path: Path
    replaced: Any                     # the parsed JSON it replaces, None, or _UNREADABLE
    others: dict[str, str]            # names other sets of the folder list -> that set
    made: set[str]

    @property
    def fresh(self) -> bool:
        return self.replaced is None

    def write_member(self, plain: str, write) -> tuple[str, dict]:
        """Write one member with ``write(path)``; returns its final name and summary.

        Into a folder without this set, at its plain name. Over an existing set, first at its
        staged name, then renamed to the name the replaced set gives the same bytes (same
        SHA-256: replacing it changes nothing for that set) or else to its tagged name, which
        no file of the replaced set holds."""
        if self.fresh:
            self.made.add(plain)
            return plain, write(self.folder / plain)
        staged = _staged_name(plain)
        self.made.add(staged)
        done = write(self.folder / staged)
        name = self._final_name(plain, done["sha256"])
        self._refuse_listed_by_others(name)
        self.made.add(name)
        _rename(self.folder / staged, self.folder / name)
        return name, done

    def _final_name(self, plain: str, sha256: str) -> str:
        stem = _member_pattern(self.json_path).fullmatch(plain)["stem"]
        for name, listed_sha in _listed_names(self.replaced).items():
            m = _member_pattern(self.json_path).fullmatch(name)
            if m and m["stem"] == stem and listed_sha == sha256:
                return name
        return _tagged_name(plain, sha256)

    def _refuse_listed_by_others(self, name: str) -> None:
        if name in self.others:
            raise DataError(f"{self.folder / name}: listed by the AEROSET {self.others[name]} "
                            f"in the same folder; expected a file of this set only (save it "
                            f"under another name or into another folder)")

    def announce(self, names: list[str]) -> None:
        """Before a save into a folder without this set writes its members at their plain
        names: list them for removal, so that the next save knows them for its own if this
        one is killed (they are overwritten anyway) and removes what its set does not list."""
        pattern = _member_pattern(self.json_path)
        retired = _read_retired(self.retired_path, pattern) | set(names)
        atomic_write_bytes(self.retired_path, json.dumps(sorted(retired)).encode())

    def publish(self, data: bytes, names: set[str]) -> str:
        """Make the new set, whose files are ``names``, visible in one step: the replaced set's
        files it no longer lists are recorded for removal, the members' renames are made
        durable, then the JSON replaces the old one atomically (temp file, fsync, rename,
        folder fsync)."""
        self._record_retired(names)
        if not self.fresh:
            fsync_dir(self.folder)
        return atomic_write_bytes(self.json_path, data)

    @property
    def retired_path(self) -> Path:
        return self.json_path.with_name(self.json_path.name + ".retired")

    def _record_retired(self, names: set[str]) -> None:
        """``<set>.aeroset.json.retired``: the replaced set's file names the new set drops, so
        that a cleanup interrupted after the publish is finished by the next save."""
        pattern = _member_pattern(self.json_path)
        retired = {n for n in _listed_names(self.replaced if self.replaced is not _UNREADABLE
                                            else None) if pattern.fullmatch(n)}
        retired = (retired | _read_retired(self.retired_path, pattern)) - names
        if retired:
            atomic_write_bytes(self.retired_path, json.dumps(sorted(retired)).encode())

    def remove_unlisted(self) -> None:
        """Remove this set's member files that the JSON now at the path does not list: ones
        this save made, ones the replaced set listed, staged ones, and tagged ones whose
        SHA-256 matches their tag (left by an interrupted save). Never a file another set
        lists, never anything when a set's JSON in the folder cannot be read."""
        current = _read_set(self.json_path)
        others, all_read = _listed_by_others(self.folder, self.json_path)
        if current is _UNREADABLE or not all_read:
            return
        keep = set(others) | set(_listed_names(current))
        pattern = _member_pattern(self.json_path)
        retired = _read_retired(self.retired_path, pattern)
        ours = self.made | retired | set(_listed_names(
            self.replaced if self.replaced is not _UNREADABLE else None))
        for entry in _regular_files(self.folder):
            m = pattern.fullmatch(entry.name)
            with contextlib.suppress(OSError):      # housekeeping: never a reason to fail
                if m and entry.name not in keep and self._provably_ours(entry, m, ours):
                    _remove(Path(entry.path))
        if not any(n not in keep and os.path.lexists(self.folder / n) for n in retired):
            _remove(self.retired_path)
        _remove_leftover_member_temps(self.folder, pattern)

    @staticmethod
    def _provably_ours(entry: os.DirEntry, m: re.Match, ours: set[str]) -> bool:
        """Made by this save, listed by the replaced set or a retired list, staged, or tagged
        with the start of its own SHA-256."""
        if entry.name in ours or m["tag"] == "staged":
            return True
        return m["tag"] is not None and file_sha256(entry.path).startswith(m["tag"])


def _read_retired(path: Path, pattern: re.Pattern) -> set[str]:
    """The member names a ``.retired`` list holds (none if it is missing or damaged)."""
    try:
        with open_input(path) as f:
            names = json.loads(f.read(MAX_SET_JSON + 1))
    except (OSError, FormatError, ValueError):
        return set()
    if not isinstance(names, list):
        return set()
    return {n for n in names if isinstance(n, str) and pattern.fullmatch(n)}


def _regular_files(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as listing:
            return [e for e in listing if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _remove_leftover_member_temps(folder: Path, pattern: re.Pattern) -> None:
    """Temp files a killed save left behind for this set's member names."""
    targets = {m["target"] for e in _regular_files(folder)
               if (m := _TEMP_NAME.fullmatch(e.name)) and pattern.fullmatch(m["target"])}
    for target in targets:
        remove_leftover_temps(folder, target=target)


def save_set(snapshot: Snapshot, path: str | os.PathLike, options: AerosetOptions) -> dict:
    """Write an AEROSET into a folder (or at a ``*.aeroset.json`` path); the summary names the
    index JSON and its SHA-256 (which lists every part's).

    Crash-safe as a whole: new members never replace a file the current set needs, the JSON
    is replaced last in one atomic step, then the old set's files are removed; an interrupted
    save leaves the previous set whole, and its files are removed by itself or the next save.
    """
    part_shards = options.part_shards
    if type(part_shards) is not int or part_shards < 1:
        raise DataError(f"part_shards must be a positive integer, got {part_shards!r}")
    folder, json_path = _paths(path)
    folder.mkdir(parents=True, exist_ok=True)
    prepared = prepare(snapshot)
    slots, shards = plan_tensors(prepared.specs, options.shard_max)
    index_name, part_names = _member_names(json_path, -(-len(shards) // part_shards))
    with _folder_lock(folder):
        save = _Save(folder, json_path, _read_set(json_path),
                     _listed_by_others(folder, json_path)[0], set())
        if save.fresh:
            for name in [index_name, *part_names]:
                save._refuse_listed_by_others(name)
            save.announce([index_name, *part_names])
        try:
            data, names = _write_members(save, prepared, slots, shards, index_name,
                                         part_names, options)
            digest = save.publish(data, names)
        finally:
            save.remove_unlisted()
    return {"parts": len(part_names), "shards": len(shards), "tensors": len(slots),
            "index": str(json_path), "sha256": digest, "size": len(data)}


def _write_members(save: _Save, prepared, slots, shards, index_name: str,
                   part_names: list[str], options: AerosetOptions) -> tuple[bytes, set[str]]:
    """Write every part, then the index file; returns the set's JSON (not yet written) and
    the names of its files."""
    part_shards = options.part_shards
    hashes: list[bytes] = [b""] * len(slots)
    parts = []
    for pid in range(0, len(shards), part_shards):
        group = shards[pid:pid + part_shards]
        order = [i for shard in group for i in shard.slots]
        local = {g: n for n, g in enumerate(order)}
        plans = [ShardPlan(s.shard_id, s.size, tuple(local[i] for i in s.slots)) for s in group]
        name, done = save.write_member(
            part_names[pid // part_shards],
            lambda p: write_file(p, [slots[i] for i in order], plans,
                                 [prepared.buffers[i] for i in order], prepared.meta, options))
        for g, digest in zip(order, done["tensor_hashes"]):
            hashes[g] = digest
        parts.append({"path": name, "sha256": done["sha256"], "size_bytes": done["file_size"],
                      "shards": [s.shard_id for s in group]})
    index_path, index_file = save.write_member(
        index_name, lambda p: write_file(p, slots, [], [], prepared.meta, options,
                                         tensor_hashes=hashes))
    meta = json.loads(json.dumps(prepared.meta))
    model = {"name": str(options.model_name if options.model_name is not None
                         else meta.get("model_name", "")),
             "architecture": str(options.architecture if options.architecture is not None
                                 else meta.get("architecture", ""))}
    index = {"format": {"name": "AEROSET", "version": [0, 1]}, "model": model, "parts": parts,
             "global_tidx": {"path": index_path, "sha256": index_file["sha256"],
                             "size_bytes": index_file["file_size"]}}
    names = {p["path"] for p in parts} | {index_path}
    return (json.dumps(index, indent=2) + "\n").encode(), names


# ---- reading -------------------------------------------------------------------------------

def _relative(value: Any, what: str, path: str) -> str:
    """A part path must stay inside the set's folder: relative, no '..', no URL."""
    if not isinstance(value, str) or not value:
        raise FormatError(f"{what}: path must be a non-empty string", path=path, got=value)
    if "://" in value:
        raise UnsupportedVersionError(f"{what}: remote parts are not supported", path=path,
                                      got=value)
    pure = PurePosixPath(value)
    if pure.is_absolute() or ".." in pure.parts or "\\" in value or "\0" in value:
        raise FormatError(f"{what}: path leaves the AEROSET folder", path=path,
                          expected="a relative path without '..'", got=value)
    return value


def _uint(value: Any, what: str, path: str) -> int:
    if type(value) is not int or value < 0:
        raise FormatError(f"{what} must be a non-negative integer", path=path, got=value)
    return value


def _sha(value: Any, what: str, path: str) -> str:
    if not (isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef")):
        raise FormatError(f"{what}: sha256 must be 64 lowercase hex digits", path=path, got=value)
    return value


def parse_set(data: bytes, path: str) -> dict:
    """Validate ``model.aeroset.json``; returns it with parts/global_tidx normalised."""
    if len(data) > MAX_SET_JSON:
        raise LimitError("AEROSET index too large", path=path,
                         expected=f"<= {MAX_SET_JSON} bytes", got=len(data))
    doc = _decode.load_json(data, chunk=SET_NAME)
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if not isinstance(fmt, dict) or fmt.get("name") != "AEROSET":
        raise FormatError("not an AEROSET index", path=path,
                          expected="format.name 'AEROSET'", got=fmt)
    if fmt.get("version") not in ([0, 1], [0, 2]):
        raise UnsupportedVersionError("unsupported AEROSET version", path=path,
                                      expected="[0, 1] or [0, 2]", got=fmt.get("version"))
    parts, gt = doc.get("parts"), doc.get("global_tidx")
    if not isinstance(parts, list) or not isinstance(gt, dict):
        raise FormatError("AEROSET index needs 'parts' (list) and 'global_tidx' (map)",
                          path=path, got=sorted(doc))
    out_parts, owner = [], {}
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("shards"), list):
            raise FormatError(f"parts[{i}] must be a map with a 'shards' list", path=path,
                              got=part)
        rel = _relative(part.get("path"), f"parts[{i}]", path)
        shards = [_uint(s, f"parts[{i}].shards", path) for s in part["shards"]]
        for s in shards:
            if s in owner:
                raise FormatError(f"shard {s} is listed by two parts", path=path,
                                  got=(owner[s], rel))
            owner[s] = rel
        out_parts.append({"path": rel, "sha256": _sha(part.get("sha256"), rel, path),
                          "size_bytes": _uint(part.get("size_bytes"), f"{rel} size_bytes", path),
                          "shards": shards})
    index = {"path": _relative(gt.get("path"), "global_tidx", path),
             "sha256": _sha(gt.get("sha256"), "global_tidx", path),
             "size_bytes": _uint(gt.get("size_bytes"), "global_tidx size_bytes", path)}
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    return {"format": fmt, "model": model, "parts": out_parts, "global_tidx": index,
            "owner": owner}


class AeroSet(ArrayMapping):
    """An open AEROSET: the global TIDX from ``index.aero``; parts are opened on first use."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.folder, self.json_path = _paths(path)
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
    folder, json_path = _paths(path)
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
