"""The part-manifest (``PART``, version 2): what one node contributes to a multi-node generation.

A node's daemon writes the shards of its ranks' pieces (``shards/r<rank>/NNNN.<ext>``, exactly
as they will lie in ``snapshots/<run>/``) and one ``PART`` file describing them; the committer
reads it to place those files and to build the generation's MANIFEST without opening a shard.
Canonical text, one record per line, parsed strictly (re-rendered and compared), bounded:

    SNAPOPS-PART 2
    part run=<run> gen=<gen> node=<node> world=<n> ranks=<r>[+<r>...] ts=<ts> format=<fmt> store=<git|lfs>
    shard path=<path> format=<fmt> size=<n> sha256=<hex64> content=<hex64> merkle_this=<hex64|-> plain_size=<n|-> plain_sha256=<hex64|-> object=<hex64|-> object_size=<n|->
    file path=<path> role=<wsum|delta> of=<path> size=<n> sha256=<hex64>
    piece name=<name> rank=<r> dtype=<dtype> stored=<dtype|-> shape=<dims> total=<f|-> squares=<f|-> min=<f|-> max=<f|-> count=<n|-> nan=<n|-> inf=<n|-> boxes=<k>
    box shard=<path> key=<name> box=<box>          (k lines after each piece line)
    end
    seal hmac=<hex64|->

With ``store=lfs`` every shard names its LFS object (``object``, ``object_size``: a keyframe, the
shard itself, uploaded before the part is published) and the part commit holds the pointer
files; with ``store=git`` both are ``-`` and it holds the shards. Names, dims, boxes and paths
are spelled as in the MANIFEST (``docs/formats/manifest.md``);
``<f>`` is Python's ``repr`` of a float (exact: partial statistics combine bit for bit). The
seal is HMAC-SHA256 under the run's HMAC key over every byte before the seal line; a committer
that has the key requires it. Every path lies under ``shards/r<rank>/`` of one of the part's
ranks, so parts of different nodes can never name the same file, nor the MANIFEST.

Example::

    data = render_part(part, hmac_key=None)
    parse_part(data, "PART", hmac_key=None) == part
    # -> True
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass

from snapops.formats.errors import FormatError, LimitError
from snapops.formats.generation.manifest import (  # one line reader for both formats
    _FLOAT, _GEN, _N, FILE_ROLES, FileRecord, Part, ShardRecord, _line_re, _Lines,
    gen_text, quote_name, safe_path, unquote_name, valid_run,
)
from snapops.formats.generation.stats import Partial
from snapops.formats.generation.write import PartWritten, RankPiece, rank_prefix

from .wal import NODE

MAGIC = "SNAPOPS-PART 2"
MAX_BYTES = 64 << 20
MAX_DIMS = 64

_HEX = r"[0-9a-f]{64}"
_RANK = r"0|[1-9][0-9]{0,5}"
_NAME = r"(?:[A-Za-z0-9_.:/-]|%[0-9A-F]{2}){1,4096}"


_HEAD = _line_re("part", ("run", r"\S+"), ("gen", _GEN), ("node", NODE),
              ("world", r"[1-9][0-9]{0,5}"),
              ("ranks", rf"(?:{_RANK})(?:\+(?:{_RANK}))*"),
              ("ts", r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"),
              ("format", r"[a-z][a-z0-9]{0,15}"), ("store", "git|lfs"))
_SHARD = _line_re("shard", ("path", r"\S+"), ("format", r"[a-z][a-z0-9]{0,15}"), ("size", _N),
               ("sha256", _HEX), ("content", _HEX), ("merkle_this", f"{_HEX}|-"),
               ("plain_size", f"{_N}|-"), ("plain_sha256", f"{_HEX}|-"),
               ("object", f"{_HEX}|-"), ("object_size", f"{_N}|-"))
_FILE = _line_re("file", ("path", r"\S+"), ("role", "|".join(FILE_ROLES)), ("of", r"\S+"),
              ("size", _N), ("sha256", _HEX))
_STATS = ("total", "squares", "min", "max", "count", "nan", "inf")
_PIECE = _line_re("piece", ("name", _NAME), ("rank", _RANK), ("dtype", r"[a-z][a-z0-9]{0,15}"),
               ("stored", r"[a-z][a-z0-9]{0,15}|-"), ("shape", r"[0-9,]{0,1300}"),
               *((k, f"{_FLOAT}|-") for k in _STATS[:4]), *((k, f"{_N}|-") for k in _STATS[4:]),
               ("boxes", r"[1-9][0-9]{0,6}"))
_BOX = _line_re("box", ("shard", r"\S+"), ("key", _NAME), ("box", r"[0-9:,]{0,2600}"))
_SEAL = re.compile(rf"seal hmac=(?P<hmac>{_HEX}|-)")


@dataclass(frozen=True)
class PartHeader:
    run: str
    gen: int
    node: str
    world: int
    ranks: tuple[int, ...]
    ts: str
    format: str
    store: str = "git"


@dataclass
class PartFile:
    header: PartHeader
    written: PartWritten          # shard and file records, pieces with their boxes

    def paths(self) -> list[str]:
        """Every file the part brings (run-relative), besides PART itself."""
        return [s.path for s in self.written.shards] + [f.path for f in self.written.files]


def _opt(value) -> str:
    return "-" if value is None else str(value)


def _box(box) -> str:
    return ",".join(f"{lo}:{hi}" for lo, hi in box)


def _stats(partial: Partial | None) -> str:
    if partial is None:
        return " ".join(f"{k}=-" for k in _STATS)
    return " ".join(f"{k}={getattr(partial, k)!r}" for k in _STATS)


def render_body(part: PartFile) -> bytes:
    h, w = part.header, part.written
    lines = [MAGIC, f"part run={h.run} gen={gen_text(h.gen)} node={h.node} world={h.world} "
                    f"ranks={'+'.join(map(str, h.ranks))} ts={h.ts} format={h.format} "
                    f"store={h.store}"]
    lines += [f"shard path={s.path} format={s.format} size={s.size} sha256={s.sha256} "
              f"content={s.content} merkle_this={_opt(s.merkle_this)} "
              f"plain_size={_opt(s.plain_size)} plain_sha256={_opt(s.plain_sha256)} "
              f"object={_opt(s.object)} object_size={_opt(s.object_size)}"
              for s in w.shards]
    lines += [f"file path={f.path} role={f.role} of={f.of} size={f.size} sha256={f.sha256}"
              for f in w.files]
    for p in w.pieces:
        lines.append(f"piece name={quote_name(p.name)} rank={p.rank} dtype={p.dtype} "
                     f"stored={_opt(p.stored)} shape={','.join(map(str, p.shape))} "
                     f"{_stats(p.partial)} boxes={len(p.parts)}")
        lines += [f"box shard={b.shard} key={quote_name(b.key)} box={_box(b.box)}"
                  for b in p.parts]
    lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


def render_part(part: PartFile, hmac_key: bytes | None) -> bytes:
    body = render_body(part)
    mac = hmac.new(hmac_key, body, hashlib.sha256).hexdigest() if hmac_key else "-"
    return body + f"seal hmac={mac}\n".encode("ascii")


def _many(r: _Lines, kind: str, pattern: re.Pattern) -> list[re.Match]:
    found = []
    while (line := r.peek()) is not None and line.startswith(kind + " "):
        found.append(r.take(pattern, f"a {kind} line"))
    return found


def parse_part(data: bytes, path: str, hmac_key: bytes | None) -> PartFile:
    """Parse and check a PART (see the module docstring); FormatError naming the line or the
    rule on anything else (``[hmac]`` when ``hmac_key`` is given and the seal is not its)."""
    if len(data) > MAX_BYTES:
        raise LimitError(path=path, expected=f"a PART of at most {MAX_BYTES} bytes",
                         got=f"{len(data)} bytes")
    r = _Lines(data, path)
    r.take(re.compile(re.escape(MAGIC)), MAGIC)
    head = r.take(_HEAD, "part run= gen= node= world= ranks= ts= format= store=")
    ranks = tuple(int(x) for x in head["ranks"].split("+"))
    header = PartHeader(head["run"], int(head["gen"]), head["node"], int(head["world"]), ranks,
                        head["ts"], head["format"], head["store"])
    written = PartWritten(ranks)
    written.shards = [_shard(m, header.gen) for m in _many(r, "shard", _SHARD)]
    written.files = [FileRecord(m["path"], m["role"], m["of"], int(m["size"]), m["sha256"])
                     for m in _many(r, "file", _FILE)]
    while (line := r.peek()) is not None and line.startswith("piece "):
        written.pieces.append(_piece(r, r.take(_PIECE, "a piece line")))
    r.take(re.compile("end"), "a shard, file or piece line in that order, or end")
    body_end = sum(len(line) + 1 for line in r.lines[:r.no])
    seal = r.take(_SEAL, "seal hmac=<hex64|->")["hmac"]
    if r.peek() is not None:
        r.fail("nothing after the seal line", r.peek())
    part = PartFile(header, written)
    if render_body(part) != data[:body_end]:
        raise FormatError("PART not in canonical form", path=path, check="canonical")
    _check_seal(data[:body_end], seal, hmac_key, path)
    check_part(part, path)
    written.paths = part.paths()   # every file of a part is new in its generation
    return part


def _shard(m: re.Match, gen: int) -> ShardRecord:
    lfs = m["object"] != "-" or m["object_size"] != "-"
    return ShardRecord(m["path"], m["format"], int(m["size"]), m["sha256"], gen, m["content"],
                       None if m["merkle_this"] == "-" else m["merkle_this"],
                       None if m["plain_size"] == "-" else int(m["plain_size"]),
                       None if m["plain_sha256"] == "-" else m["plain_sha256"],
                       object=None if m["object"] == "-" else m["object"],
                       object_size=None if m["object_size"] == "-" else int(m["object_size"]),
                       encoding="key" if lfs else None)


def _piece(r: _Lines, m: re.Match) -> RankPiece:
    values = [m[k] for k in _STATS]
    if all(v == "-" for v in values):
        partial = None
    elif "-" in values:
        r.fail("all partial statistics or none", m.group(0), line=r.no)
    else:
        try:
            floats = [float(v) for v in values[:4]]
        except ValueError:
            floats = []
        if [repr(f) for f in floats] != values[:4] or any(math.isnan(f) for f in floats):
            r.fail("partial statistics as Python writes floats (no nan)", m.group(0), line=r.no)
        partial = Partial(*floats, *(int(v) for v in values[4:]))
        if not _possible(partial):
            r.fail("partial statistics some values can have (squares >= 0; with count 0: "
                   "total=0.0 squares=0.0 min=inf max=-inf; else finite min <= max)",
                   m.group(0), line=r.no)
    try:
        shape = tuple(int(d) for d in m["shape"].split(",")) if m["shape"] else ()
    except ValueError:
        shape = None
    if shape is None or len(shape) > MAX_DIMS or \
            any(str(d) != t for d, t in zip(shape, m["shape"].split(","))):
        r.fail(f"at most {MAX_DIMS} canonical dimensions", m["shape"], line=r.no)
    boxes = []
    for _ in range(int(m["boxes"])):
        b = r.take(_BOX, "a box line")
        boxes.append(Part(b["shard"], _unquote(r, b["key"]), _parse_box(r, b["box"], len(shape)),
                          int(m["rank"])))
    return RankPiece(_unquote(r, m["name"]), int(m["rank"]), m["dtype"],
                     None if m["stored"] == "-" else m["stored"], shape, tuple(boxes), partial)


def _possible(p: Partial) -> bool:
    """What ``partial_stats`` can return: ``finish`` takes the root of ``squares``."""
    if not p.count:
        return (p.total, p.squares, p.min, p.max) == (0.0, 0.0, math.inf, -math.inf)
    return p.squares >= 0 and math.isfinite(p.min) and math.isfinite(p.max) and p.min <= p.max


def _unquote(r: _Lines, text: str) -> str:
    try:
        return unquote_name(text)
    except UnicodeDecodeError:
        r.fail("a name that is UTF-8 once decoded", text, line=r.no)


def _parse_box(r: _Lines, text: str, dims: int):
    if not text:
        box = ()
    else:
        try:
            box = tuple(tuple(int(v) for v in d.split(":")) for d in text.split(","))
        except ValueError:
            r.fail("a box of start:stop per dimension", text, line=r.no)
    if len(box) != dims or any(len(d) != 2 or d[0] > d[1] for d in box):
        r.fail(f"a box of start:stop for each of {dims} dimensions", text, line=r.no)
    return box


def _check_seal(body: bytes, seal: str, hmac_key: bytes | None, path: str) -> None:
    if hmac_key is None:
        return
    want = hmac.new(hmac_key, body, hashlib.sha256).hexdigest()
    if seal == "-" or not hmac.compare_digest(want, seal):
        raise FormatError("the PART is not sealed under this run's HMAC key", path=path,
                          check="hmac", expected="the HMAC of the PART under the run's key",
                          got="no HMAC" if seal == "-" else "another HMAC")


def check_part(part: PartFile, path: str) -> None:
    """What the grammar cannot say: a usable run, distinct sorted ranks below the world size,
    every path safe and under one of the part's ranks' folders, listed once, each box in a
    listed shard, each (array, rank) once."""
    h, w = part.header, part.written

    def fail(message: str, got: object) -> None:
        raise FormatError(message, path=path, check="structure", got=str(got)[:80])

    if not valid_run(h.run):
        fail("a run name usable in paths and tags", h.run)
    if list(h.ranks) != sorted(set(h.ranks)) or h.ranks[-1] >= h.world:
        fail(f"distinct ranks in ascending order below the world size {h.world}", h.ranks)
    prefixes = tuple(rank_prefix(rank) for rank in h.ranks)
    paths = part.paths()
    if len(set(paths)) != len(paths):
        fail("a path listed twice", paths)
    for p in paths:
        _safe(p, path)
        if not p.startswith(prefixes):
            fail("a path under the folder of one of the part's ranks", p)
    for s in w.shards:
        ok = (s.object, s.object_size) == (s.sha256, s.size) if h.store == "lfs" else \
            (s.object, s.object_size) == (None, None)
        if not ok:
            fail("with store=lfs every shard's object is the shard itself (a keyframe), with "
                 "store=git none", s.path)
    shards = {s.path for s in w.shards}
    for f in w.files:
        if f.of not in shards:
            fail("a file of a shard the part does not list", f.of)
    seen = set()
    for piece in w.pieces:
        if piece.rank not in h.ranks or (piece.name, piece.rank) in seen:
            fail("each array once per rank, of the part's ranks", (piece.name, piece.rank))
        seen.add((piece.name, piece.rank))
        for box in piece.parts:
            if box.shard not in shards or not box.shard.startswith(rank_prefix(piece.rank)):
                fail("a box in a listed shard of its own rank", box.shard)


def _safe(rel: str, path: str) -> None:
    if not safe_path(rel):
        raise FormatError("an unsafe path", path=path, check="path",
                          expected="a relative path of [A-Za-z0-9_.-] components of at most "
                          "255 characters", got=rel[:80])
