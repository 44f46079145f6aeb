"""A generation in the snapshot repository: shard plan, MANIFEST, writing and loading.

Layout (DESIGN.md): ``snapshots/<run>/MANIFEST`` and ``snapshots/<run>/shards/NNNN.<ext>``.
Arrays are packed in name order into shards of at most ``shard_max`` raw bytes; an array
larger than that is split by row ranges into parts (one shard each). Paths are stable while
the state's layout is. A shard whose content did not change is not rewritten: the MANIFEST
keeps its older gen. Each WTXT shard chains on its own path (merkle_prev = that path's
previous merkle_this).

MANIFEST grammar (ASCII, LF, deterministic)::

    SNAPOPS-MANIFEST 1
    run=<run> gen=<gen6> ts=<ts> build=<build> format=<format>
    shard path=<rel> gen=<gen6> digest=<hex64> merkle_this=<hex64|-> content=<hex64> arrays=<a,b>
    split name=<name> dtype=<wtxt/np dtype> shape=<d0,d1,..> parts=<path>:<start>:<stop>,...
    end

``digest`` is a WTXT shard's sha256_all, or the SHA-256 of a binary shard's bytes;
``content`` is BLAKE3 over the shard's arrays (name, dtype, shape, bytes) and decides reuse.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import blake3
import numpy as np

from snapops.formats.errors import DataError, FormatError

MAGIC = "SNAPOPS-MANIFEST 1"
NAME_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
EXTENSIONS = {"wtxt": ".wtxt", "fold": ".fold", "aero": ".aero", "pycauset": ".pycauset",
              "finf": ".finf"}


@dataclass(frozen=True)
class Piece:
    name: str
    start: int | None = None   # row range for a part of a split array
    stop: int | None = None


@dataclass
class ShardEntry:
    path: str
    gen: str
    digest: str
    merkle_this: str
    content: str
    arrays: tuple[str, ...]


@dataclass
class Manifest:
    run: str
    gen: str
    ts: str
    build: str
    format: str
    shards: list[ShardEntry] = field(default_factory=list)
    splits: dict[str, tuple[str, tuple[int, ...], list[tuple[str, int, int]]]] = \
        field(default_factory=dict)

    def render(self) -> bytes:
        lines = [MAGIC, f"run={self.run} gen={self.gen} ts={self.ts} build={self.build} "
                        f"format={self.format}"]
        for s in self.shards:
            lines.append(f"shard path={s.path} gen={s.gen} digest={s.digest} "
                         f"merkle_this={s.merkle_this} content={s.content} "
                         f"arrays={','.join(s.arrays)}")
        for name, (dtype, shape, parts) in sorted(self.splits.items()):
            joined = ",".join(f"{p}:{a}:{b}" for p, a, b in parts)
            lines.append(f"split name={name} dtype={dtype} shape={','.join(map(str, shape))} "
                         f"parts={joined}")
        lines.append("end")
        return ("\n".join(lines) + "\n").encode("ascii")

    def by_path(self) -> dict[str, ShardEntry]:
        return {s.path: s for s in self.shards}


_SHARD = re.compile(r"shard path=(\S+) gen=(\d+) digest=([0-9a-f]{64}) merkle_this=([0-9a-f]{64}|-)"
                    r" content=([0-9a-f]{64}) arrays=(\S*)")
_SPLIT = re.compile(r"split name=(\S+) dtype=(\S+) shape=([0-9,]*) parts=(\S+)")
_HEAD = re.compile(r"run=(\S+) gen=(\d+) ts=(\S+) build=(\S+) format=([a-z]+)")


def parse_manifest(data: bytes, path: str = "MANIFEST") -> Manifest:
    try:
        lines = data.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise FormatError(path=path, expected="ASCII", got="non-ASCII bytes") from None
    if len(lines) < 4 or lines[0] != MAGIC or lines[-1] != "" or lines[-2] != "end":
        raise FormatError(path=path, line=1, expected=f"{MAGIC} ... end", got=lines[0][:40])
    head = _HEAD.fullmatch(lines[1])
    if not head:
        raise FormatError(path=path, line=2, expected="run= gen= ts= build= format=",
                          got=lines[1][:80])
    manifest = Manifest(*head.groups())
    for no, line in enumerate(lines[2:-2], start=3):
        if m := _SHARD.fullmatch(line):
            p, g, d, mt, c, arrays = m.groups()
            manifest.shards.append(ShardEntry(p, g, d, mt, c, tuple(arrays.split(",")) if arrays
                                              else ()))
        elif m := _SPLIT.fullmatch(line):
            parts = []
            for item in m.group(4).split(","):
                p, a, b = item.rsplit(":", 2)
                parts.append((p, int(a), int(b)))
            shape = tuple(int(d) for d in m.group(3).split(",")) if m.group(3) else ()
            manifest.splits[m.group(1)] = (m.group(2), shape, parts)
        else:
            raise FormatError(path=path, line=no, expected="a shard or split line",
                              got=line[:80])
    return manifest


def plan_shards(arrays: dict[str, np.ndarray], shard_max: int, ext: str):
    """[(path, [Piece...])] in name order, and the split arrays' parts."""
    shards: list[tuple[str, list[Piece]]] = []
    splits: dict[str, list[tuple[str, int, int]]] = {}
    current: list[Piece] = []
    size = 0

    def path() -> str:
        return f"shards/{len(shards):04d}{ext}"

    for name in sorted(arrays):
        if not NAME_RE.fullmatch(name):
            raise DataError(f"array {name!r}: names must match [A-Za-z0-9_.:/-]+ in the daemon")
        array = arrays[name]
        if array.nbytes > shard_max and array.ndim >= 1 and array.shape[0] > 1:
            if current:
                shards.append((path(), current))
                current, size = [], 0
            row = max(1, array.nbytes // array.shape[0])
            per = max(1, shard_max // row)
            for start in range(0, array.shape[0], per):
                stop = min(start + per, array.shape[0])
                splits.setdefault(name, []).append((path(), start, stop))
                shards.append((path(), [Piece(name, start, stop)]))
            continue
        if current and size + array.nbytes > shard_max:
            shards.append((path(), current))
            current, size = [], 0
        current.append(Piece(name))
        size += array.nbytes
    if current:
        shards.append((path(), current))
    return shards, splits


def shard_arrays(arrays: dict[str, np.ndarray], pieces: list[Piece]) -> dict[str, np.ndarray]:
    return {p.name: arrays[p.name] if p.start is None else arrays[p.name][p.start:p.stop]
            for p in pieces}


def content_digest(arrays: dict[str, np.ndarray]) -> str:
    """BLAKE3 over names, dtypes, shapes and bytes (multithreaded for large arrays)."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        h.update(array.reshape(-1).view(np.uint8) if array.size else b"")
    return h.hexdigest()


def manifest_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
