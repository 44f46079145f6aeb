"""The generation MANIFEST, version 2: grammar, model, render and strict parse.

A generation is ``snapshots/<run>/MANIFEST`` plus the shard files it lists. The MANIFEST is the
sealed unit: it binds the run, gen, ts, build, store, world size and signer, the previous
generation's MANIFEST digest, every file of the generation (path, declared format, size, SHA-256
of the exact bytes, and of the plaintext for age-armored shards), and every array (original
name, logical dtype, shape, statistics, where each part lives). The last line seals everything
before it (Ed25519 signature and HMAC). Grammar, limits and examples: ``docs/formats/manifest.md``.

Rendering is canonical (fixed line kinds in a fixed order, fixed field order, shortest integers,
lowercase hex), so the same generation always gives the same bytes, and parsing accepts only
canonical text: ``render(parse(data)) == data`` for every accepted ``data``.

>>> m = Manifest(Header("run1", 1, "2026-01-02T03:04:05Z", "b1", "wtxt"), Prev())
>>> m.arrays.append(ArrayRecord("w", "f32", (2,), parts=(Part("shards/0000.wtxt", "w", ((0, 2),)),)))
>>> m.shards.append(ShardRecord("shards/0000.wtxt", "wtxt", 10, "0" * 64, 1, "1" * 64))
>>> parse_manifest(m.render()) == m
True
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

from snapops.formats.errors import FormatError, LimitError
from snapops.formats.iosafe import NAME_MAX, PATH_MAX

MAGIC = "SNAPOPS-MANIFEST 2"
MAX_BYTES = 256 << 20          # a MANIFEST larger than this is refused before parsing
MAX_LINE = 1 << 16
MAX_DIMS = 64
MAX_PARTS = 1 << 20
GEN_MAX = 10 ** 18 - 1

HEX64 = r"[0-9a-f]{64}"
HEX16 = r"[0-9a-f]{16}"
TOKEN = r"[A-Za-z0-9._/+-]+"                     # build (as in WTXT meta)
RUN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"        # run names appear in paths and tag names
FORMAT = r"[a-z][a-z0-9]{0,15}"
DTYPE = r"[a-z][a-z0-9]{0,15}"
STORE = r"git|lfs"
TS = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"
PATH_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
NAME_SAFE = re.compile(r"[A-Za-z0-9_.:/-]")
_ALL_SAFE = re.compile(r"[A-Za-z0-9_.:/-]*")
NAME_RE = re.compile(r"(?:[A-Za-z0-9_.:/-]|%[0-9A-F]{2}){1,4096}")
FILE_ROLES = ("wsum", "delta")
ENCODINGS = ("key", "res")


def valid_run(run: str) -> bool:
    """A run name that is safe as a path component and inside a tag name (``run/gen-N``)."""
    return bool(re.fullmatch(RUN, run)) and ".." not in run and not run.endswith((".", ".lock"))


def gen_text(gen: int) -> str:
    """The canonical gen spelling shared with WTXT and the ledger (``000042``)."""
    return f"{gen:06d}"


def parse_gen_text(text: str) -> int | None:
    """The gen ``text`` spells canonically (``000042``), else None. Only ASCII digits:
    ``int`` also reads other scripts' digits and fails on ``²``, which ``str.isdigit``
    accepts (ref names come from whoever can push)."""
    if not _GEN_TEXT.fullmatch(text):
        return None
    value = int(text)
    return value if gen_text(value) == text and value <= GEN_MAX else None


def fmt_float(value: float) -> str:
    """Statistics as text: 9 significant digits, ``nan``/``inf``/``-inf`` spelled out."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = f"{value:.9g}"
    return "0" if text == "-0" else text


def quote_name(name: str) -> str:
    """Percent-encode an array name into ``[A-Za-z0-9_.:/-]`` + ``%XX`` (UTF-8 bytes).

    >>> quote_name("blocks.0.attn w")
    'blocks.0.attn%20w'
    """
    if _ALL_SAFE.fullmatch(name):
        return name              # the usual case (torch names): no character to encode
    out = []
    for ch in name:
        if NAME_SAFE.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def unquote_name(text: str) -> str:
    if "%" not in text:
        return text
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            raw.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            raw.append(ord(text[i]))
            i += 1
    return raw.decode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Header:
    run: str
    gen: int
    ts: str
    build: str
    format: str
    store: str = "git"
    world: int = 1
    keyid: str | None = None        # the signer's keyid; None: unsigned


@dataclass(frozen=True)
class Prev:
    """The previous generation of this run, or none (the first generation)."""

    gen: int | None = None
    sha256: str | None = None       # SHA-256 of the previous MANIFEST's exact bytes


@dataclass(frozen=True)
class ShardRecord:
    """One shard file. ``size``/``sha256`` are over the exact bytes of the file as the user sees
    it (the ciphertext for ``.age``; the reconstructed file in the LFS store)."""

    path: str                       # relative to snapshots/<run>/
    format: str                     # declared format (also implied by the suffix)
    size: int
    sha256: str
    gen: int                        # generation that last wrote this shard (reuse keeps it)
    content: str                    # BLAKE3 over the shard's arrays: decides reuse
    merkle_this: str | None = None  # WTXT: the shard's own per-path chain value
    plain_size: int | None = None   # age-armored shards: the plaintext file
    plain_sha256: str | None = None
    object: str | None = None       # LFS store: the stored object's oid (SHA-256)
    object_size: int | None = None
    encoding: str | None = None     # LFS store: key (whole file) | res (residual)
    base: int | None = None         # residual: the gen of the shard it applies to


@dataclass(frozen=True)
class FileRecord:
    """A companion file that travels with a shard (WSUM, DELTA v2)."""

    path: str
    role: str
    of: str                         # the shard's path
    size: int
    sha256: str


@dataclass(frozen=True)
class Stats:
    """Per-array statistics over the finite values (float64 arithmetic)."""

    norm: float
    min: float
    max: float
    mean: float
    nan: int = 0
    inf: int = 0


@dataclass(frozen=True)
class Part:
    """Where (part of) an array lives: ``key`` in shard ``shard`` holds the box ``box``
    (``(start, stop)`` per dimension of the global array) written by ``rank``."""

    shard: str
    key: str
    box: tuple[tuple[int, int], ...]
    rank: int | None = None


@dataclass(frozen=True)
class ArrayRecord:
    name: str                       # the original name (torch dotted names included)
    dtype: str                      # the logical dtype (bf16 stays bf16 whatever is stored)
    shape: tuple[int, ...]
    stored: str | None = None       # the stored dtype when it differs from the logical one
    stats: Stats | None = None
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class Seal:
    ed25519: str | None = None      # base64 of the 64-byte signature
    hmac: str | None = None         # hex of HMAC-SHA256


@dataclass
class Manifest:
    header: Header
    prev: Prev = field(default_factory=Prev)
    shards: list[ShardRecord] = field(default_factory=list)
    files: list[FileRecord] = field(default_factory=list)
    arrays: list[ArrayRecord] = field(default_factory=list)
    seal: Seal = field(default_factory=Seal)

    def body(self) -> bytes:
        """Every line before the seal line: what the signature and the HMAC cover."""
        return render_body(self)

    def render(self) -> bytes:
        return self.body() + render_seal(self.seal)

    def digest(self) -> str:
        """SHA-256 of the exact MANIFEST bytes (what the ledger and the next ``prev`` name)."""
        return hashlib.sha256(self.render()).hexdigest()

    def shard(self, path: str) -> ShardRecord | None:
        return next((s for s in self.shards if s.path == path), None)

    def paths(self) -> list[str]:
        """Every file of the generation besides the MANIFEST, relative to the run folder."""
        return [s.path for s in self.shards] + [f.path for f in self.files]


# --- rendering ---------------------------------------------------------------------------------

def _opt(value) -> str:
    return "-" if value is None else str(value)


def _dims(shape: tuple[int, ...]) -> str:
    return ",".join(str(d) for d in shape)


def _box(box: tuple[tuple[int, int], ...]) -> str:
    return ",".join(f"{a}:{b}" for a, b in box)


def render_body(m: Manifest) -> bytes:
    h, p = m.header, m.prev
    lines = [
        MAGIC,
        f"generation run={h.run} gen={gen_text(h.gen)} ts={h.ts} build={h.build} "
        f"format={h.format} store={h.store} world={h.world} keyid={_opt(h.keyid)}",
        f"prev gen={'-' if p.gen is None else gen_text(p.gen)} sha256={_opt(p.sha256)}",
    ]
    for s in m.shards:
        lines.append(
            f"shard path={s.path} format={s.format} size={s.size} sha256={s.sha256} "
            f"gen={gen_text(s.gen)} content={s.content} merkle_this={_opt(s.merkle_this)} "
            f"plain_size={_opt(s.plain_size)} plain_sha256={_opt(s.plain_sha256)} "
            f"object={_opt(s.object)} object_size={_opt(s.object_size)} "
            f"encoding={_opt(s.encoding)} "
            f"base={'-' if s.base is None else gen_text(s.base)}")
    for f in m.files:
        lines.append(f"file path={f.path} role={f.role} of={f.of} size={f.size} sha256={f.sha256}")
    for a in m.arrays:
        st = a.stats
        stats = ("norm=- min=- max=- mean=- nan=- inf=-" if st is None else
                 f"norm={fmt_float(st.norm)} min={fmt_float(st.min)} max={fmt_float(st.max)} "
                 f"mean={fmt_float(st.mean)} nan={st.nan} inf={st.inf}")
        lines.append(f"array name={quote_name(a.name)} dtype={a.dtype} stored={_opt(a.stored)} "
                     f"shape={_dims(a.shape)} {stats} parts={len(a.parts)}")
        for part in a.parts:
            lines.append(f"part shard={part.shard} key={quote_name(part.key)} box={_box(part.box)}"
                         f" rank={_opt(part.rank)}")
    lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


def render_seal(seal: Seal) -> bytes:
    return f"seal ed25519={_opt(seal.ed25519)} hmac={_opt(seal.hmac)}\n".encode("ascii")


# --- parsing -----------------------------------------------------------------------------------

def _line_re(kind: str, *fields: tuple[str, str]) -> re.Pattern:
    return re.compile(kind + "".join(f" {key}=(?P<{key}>{pattern})" for key, pattern in fields))


_N = r"0|[1-9][0-9]{0,17}"
_GEN = r"[0-9]{6,18}"
_GEN_TEXT = re.compile(_GEN)
_FLOAT = r"-?(?:nan|inf|[0-9][0-9.e+-]{0,30})"
_HEAD = _line_re("generation", ("run", RUN), ("gen", _GEN), ("ts", TS), ("build", TOKEN),
                 ("format", FORMAT), ("store", STORE), ("world", r"[1-9][0-9]{0,5}"),
                 ("keyid", f"{HEX16}|-"))
_PREV = _line_re("prev", ("gen", f"{_GEN}|-"), ("sha256", f"{HEX64}|-"))
_SHARD = _line_re("shard", ("path", r"\S+"), ("format", FORMAT), ("size", _N),
                  ("sha256", HEX64), ("gen", _GEN), ("content", HEX64),
                  ("merkle_this", f"{HEX64}|-"), ("plain_size", f"{_N}|-"),
                  ("plain_sha256", f"{HEX64}|-"), ("object", f"{HEX64}|-"),
                  ("object_size", f"{_N}|-"), ("encoding", "key|res|-"), ("base", f"{_GEN}|-"))
_FILE = _line_re("file", ("path", r"\S+"), ("role", "|".join(FILE_ROLES)), ("of", r"\S+"),
                 ("size", _N), ("sha256", HEX64))
_ARRAY = _line_re("array", ("name", r"\S+"), ("dtype", DTYPE), ("stored", f"{DTYPE}|-"),
                  ("shape", r"[0-9,]*"), ("norm", f"{_FLOAT}|-"), ("min", f"{_FLOAT}|-"),
                  ("max", f"{_FLOAT}|-"), ("mean", f"{_FLOAT}|-"), ("nan", f"{_N}|-"),
                  ("inf", f"{_N}|-"), ("parts", r"[1-9][0-9]{0,6}"))
_PART = _line_re("part", ("shard", r"\S+"), ("key", r"\S+"), ("box", r"[0-9:,]*"),
                 ("rank", r"0|[1-9][0-9]{0,5}|-"))
_SEAL = re.compile(r"seal ed25519=(?P<ed25519>[A-Za-z0-9+/]{86}==|-) hmac=(?P<hmac>"
                   + HEX64 + r"|-)")


class _Lines:
    """The MANIFEST's lines with their numbers, for error messages."""

    def __init__(self, data: bytes, path: str) -> None:
        if len(data) > MAX_BYTES:
            raise LimitError("MANIFEST too large", path=path, offset=0,
                             expected=f"at most {MAX_BYTES} bytes", got=f"{len(data)} bytes")
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise FormatError(path=path, offset=exc.start, expected="ASCII",
                              got="a non-ASCII byte") from None
        if not text.endswith("\n"):
            raise FormatError(path=path, offset=len(data), expected="LF at the end of the file",
                              got="no final LF")
        self.lines = text[:-1].split("\n")
        self.path = path
        self.no = 0
        for no, line in enumerate(self.lines, start=1):
            if len(line) > MAX_LINE:
                raise LimitError(path=path, line=no, expected=f"lines under {MAX_LINE} bytes",
                                 got=f"{len(line)} bytes")
            if "\r" in line or "\t" in line:
                raise FormatError(path=path, line=no, expected="printable ASCII and LF only",
                                  got="CR or TAB")

    def peek(self) -> str | None:
        return self.lines[self.no] if self.no < len(self.lines) else None

    def take(self, pattern: re.Pattern, what: str) -> re.Match:
        line = self.peek()
        m = pattern.fullmatch(line) if line is not None else None
        if m is None:
            self.fail(what, line if line is not None else "end of file")
        self.no += 1
        return m

    def fail(self, expected: str, got: str, line: int | None = None):
        raise FormatError(path=self.path, line=line or self.no + 1, expected=expected,
                          got=got[:80])


def parse_manifest(data: bytes, path: str = "MANIFEST") -> Manifest:
    """Parse canonical MANIFEST v2 text; anything else raises FormatError naming the line."""
    lines = _Lines(data, path)
    if lines.peek() != MAGIC:
        lines.fail(MAGIC, lines.peek() or "")
    lines.no = 1
    head = lines.take(_HEAD, "generation run= gen= ts= build= format= store= world= keyid=")
    if not valid_run(head["run"]):
        lines.fail("a run name usable in paths and tags", head["run"], line=lines.no)
    header = Header(head["run"], _gen(lines, head["gen"]), head["ts"], head["build"],
                    head["format"], head["store"], int(head["world"]), _none(head["keyid"]))
    prev_m = lines.take(_PREV, "prev gen= sha256=")
    prev = Prev(None if prev_m["gen"] == "-" else _gen(lines, prev_m["gen"]),
                _none(prev_m["sha256"]))
    if (prev.gen is None) != (prev.sha256 is None):
        lines.fail("prev gen and sha256 both given or both '-'", lines.lines[lines.no - 1])
    manifest = Manifest(header, prev)
    while (line := lines.peek()) is not None and line.startswith("shard "):
        manifest.shards.append(_shard(lines, lines.take(_SHARD, "a shard line")))
    while (line := lines.peek()) is not None and line.startswith("file "):
        manifest.files.append(_file(lines, lines.take(_FILE, "a file line")))
    while (line := lines.peek()) is not None and line.startswith("array "):
        manifest.arrays.append(_array(lines, lines.take(_ARRAY, "an array line")))
    lines.take(re.compile("end"), "a shard, file or array line in that order, or end")
    seal = lines.take(_SEAL, "seal ed25519=<base64|-> hmac=<hex64|->")
    manifest.seal = Seal(_none(seal["ed25519"]), _none(seal["hmac"]))
    if lines.peek() is not None:
        lines.fail("nothing after the seal line", lines.peek())
    if manifest.render() != data:
        raise FormatError("not in canonical form (numbers, statistics or names spelled "
                          "differently from how snapops writes them)", path=path,
                          check="canonical")
    check_structure(manifest, path)
    return manifest


def _none(text: str) -> str | None:
    return None if text == "-" else text


def _gen(lines: _Lines, text: str) -> int:
    value = int(text)
    if gen_text(value) != text or value > GEN_MAX:
        lines.fail("a canonical gen (6+ digits, no extra zeros)", text, line=lines.no)
    return value


def _int(text: str) -> int | None:
    return None if text == "-" else int(text)


def safe_path(text: str) -> bool:
    """A relative path of ``[A-Za-z0-9_.-]`` components, none ``.`` or ``..``, that every
    file system holds (components of at most 255 bytes, 4095 in all).

    >>> safe_path("shards/0000.wtxt"), safe_path("a/../b"), safe_path("x" * 256)
    (True, False, False)
    """
    parts = text.split("/")
    return bool(PATH_RE.fullmatch(text)) and len(text) <= PATH_MAX and all(
        p not in (".", "..") and len(p) <= NAME_MAX for p in parts)


def _path(lines: _Lines, text: str) -> str:
    if not safe_path(text):
        lines.fail("a relative path of [A-Za-z0-9_.-] components (no '.', '..', or leading /; "
                   "at most 255 characters each, 4095 in all)", text[:80], line=lines.no)
    return text


def _shard(lines: _Lines, m: re.Match) -> ShardRecord:
    return ShardRecord(
        _path(lines, m["path"]), m["format"], int(m["size"]), m["sha256"], _gen(lines, m["gen"]),
        m["content"], _none(m["merkle_this"]), _int(m["plain_size"]), _none(m["plain_sha256"]),
        _none(m["object"]), _int(m["object_size"]), _none(m["encoding"]),
        None if m["base"] == "-" else _gen(lines, m["base"]))


def _file(lines: _Lines, m: re.Match) -> FileRecord:
    return FileRecord(_path(lines, m["path"]), m["role"], _path(lines, m["of"]), int(m["size"]),
                      m["sha256"])


def _name(lines: _Lines, text: str) -> str:
    if not NAME_RE.fullmatch(text):
        lines.fail("a percent-encoded name ([A-Za-z0-9_.:/-] and %XX)", text, line=lines.no)
    try:
        return unquote_name(text)
    except UnicodeDecodeError:
        lines.fail("a name that is UTF-8 once decoded", text, line=lines.no)


def _shape(lines: _Lines, text: str) -> tuple[int, ...]:
    if not text:
        return ()
    dims = text.split(",")
    if len(dims) > MAX_DIMS or any(not re.fullmatch(_N, d) for d in dims):
        lines.fail(f"at most {MAX_DIMS} comma-separated dimensions", text, line=lines.no)
    return tuple(int(d) for d in dims)


def _array(lines: _Lines, m: re.Match) -> ArrayRecord:
    at = lines.no
    stats_text = [m[k] for k in ("norm", "min", "max", "mean", "nan", "inf")]
    if all(t == "-" for t in stats_text):
        stats = None
    elif "-" in stats_text:
        lines.fail("all statistics or none", lines.lines[at - 1], line=at)
    else:
        try:
            floats = [float(t) for t in stats_text[:4]]
        except ValueError:
            lines.fail("statistics as decimal numbers", lines.lines[at - 1], line=at)
        stats = Stats(*floats, int(stats_text[4]), int(stats_text[5]))
    count = int(m["parts"])
    if count > MAX_PARTS:
        lines.fail(f"at most {MAX_PARTS} parts", m["parts"], line=at)
    parts = tuple(_part(lines, lines.take(_PART, "a part line")) for _ in range(count))
    return ArrayRecord(_name(lines, m["name"]), m["dtype"], _shape(lines, m["shape"]),
                       _none(m["stored"]), stats, parts)


def _part(lines: _Lines, m: re.Match) -> Part:
    box = ()
    if m["box"]:
        try:
            box = tuple(tuple(int(v) for v in dim.split(":")) for dim in m["box"].split(","))
        except ValueError:
            lines.fail("a box of start:stop per dimension", m["box"], line=lines.no)
        if any(len(d) != 2 for d in box) or len(box) > MAX_DIMS:
            lines.fail("a box of start:stop per dimension", m["box"], line=lines.no)
    return Part(_path(lines, m["shard"]), _name(lines, m["key"]), box, _int(m["rank"]))


# --- structure ---------------------------------------------------------------------------------

def check_structure(m: Manifest, path: str = "MANIFEST") -> None:
    """What the grammar cannot say: unique paths and names, parts naming listed shards, boxes
    inside the shape that tile it exactly, ranks below the world size."""
    def fail(message: str, got: object = None) -> None:
        raise FormatError(message, path=path, check="structure",
                          got=None if got is None else str(got)[:80])

    shards = {s.path for s in m.shards}
    if len(shards) != len(m.shards):
        fail("a shard path is listed twice")
    files = [f.path for f in m.files]
    if len(set(files)) != len(files) or shards & set(files):
        fail("a file path is listed twice")
    for f in m.files:
        if f.of not in shards:
            fail(f"file {f.path} belongs to a shard that is not listed", f.of)
    for s in m.shards:
        _check_store_fields(m.header.store, s, fail)
    names = [a.name for a in m.arrays]
    if names != sorted(names, key=lambda n: n.encode("utf-8", "surrogatepass")):
        fail("arrays must be listed once each, in byte-wise name order")
    if len(set(names)) != len(names):
        fail("an array is listed twice")
    for a in m.arrays:
        _check_parts(a, shards, m.header.world, fail)
    if m.prev.gen is not None and m.prev.gen >= m.header.gen:
        fail("prev gen must be lower than this gen", m.prev.gen)


def _check_store_fields(store: str, s: ShardRecord, fail) -> None:
    """Git store: no LFS fields. LFS store: the stored object, a base exactly for residuals,
    and a keyframe's object is the shard itself."""
    fields = (s.object, s.object_size, s.encoding)
    if store == "git":
        if any(v is not None for v in fields) or s.base is not None:
            fail(f"shard {s.path}: LFS fields in a git-store generation")
    elif None in fields or (s.base is not None) != (s.encoding == "res"):
        fail(f"shard {s.path}: an LFS-store shard needs object, object_size, encoding, and "
             "a base exactly when encoding=res")
    elif s.encoding == "key" and (s.object, s.object_size) != (s.sha256, s.size):
        fail(f"shard {s.path}: a keyframe's object is the shard itself", s.object)


def _check_parts(a: ArrayRecord, shards: set[str], world: int, fail) -> None:
    total = math.prod(a.shape)
    covered = 0
    for part in a.parts:
        if part.shard not in shards:
            fail(f"array {a.name}: part in unlisted shard", part.shard)
        if len(part.box) != len(a.shape) or any(
                not 0 <= lo <= hi <= dim for (lo, hi), dim in zip(part.box, a.shape)):
            fail(f"array {a.name}: part box outside the shape {a.shape}", part.box)
        if part.rank is not None and part.rank >= world:
            fail(f"array {a.name}: rank {part.rank} not below world size {world}")
        covered += math.prod(hi - lo for lo, hi in part.box)
    if covered != total or not _disjoint([p.box for p in a.parts]):
        fail(f"array {a.name}: parts must tile its shape exactly (no overlap, no hole)",
             f"{covered} of {total} elements")


def _disjoint(boxes: list[tuple[tuple[int, int], ...]]) -> bool:
    """Pairwise disjoint: a sweep over the first dimension (row splits cost O(n log n))."""
    solid = sorted(b for b in boxes if b and all(lo < hi for lo, hi in b))
    active: list[tuple[tuple[int, int], ...]] = []
    for box in solid:
        active = [a for a in active if a[0][1] > box[0][0]]
        if any(_overlap(a, box) for a in active):
            return False
        active.append(box)
    return True


def _overlap(a, b) -> bool:
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))
