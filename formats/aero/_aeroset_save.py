"""Saving an AEROSET: members written at staged names, renamed, then the JSON published.

A save over an existing set writes each member at a staged name, then renames it to the name
the old set gives the same bytes or to a name tagged with its SHA-256 (``part-000.<hex16>.aero``),
so no file the old set needs is replaced; the JSON is then replaced in one atomic step and the
old set's files it no longer lists are removed (docs/formats/aero.md, section 9).

The JSON names its files, so several sets can share a folder: a set saved as
``<name>.aeroset.json`` writes ``<name>.index.aero`` and ``<name>.part-NNN.aero`` (the default
``model.aeroset.json`` keeps the plain names ``index.aero`` and ``part-NNN.aero``). A save never
overwrites a file another set in the folder lists (DataError); readers follow the JSON, whatever
the names.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Iterator

from ..atomic import atomic_write_bytes, fsync_dir, remove_leftover_temps
from ..integrity import file_sha256
from ..contract import between
from ..errors import DataError, FormatError
from ..iosafe import open_input
from ..model import Snapshot
from ._aeroset_index import INDEX_NAME, MAX_SET_JSON, SET_NAME, parse_set, set_paths
from ._layout import ShardPlan, plan_tensors
from ._write import Options, prepare, write_file

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
    folder, json_path = set_paths(path)
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

