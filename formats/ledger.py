"""The merkle-chained snapshot ledger: one append-only ASCII line per generation.

A ledger (``ledger/<run>.ledger`` in the snapshot repository) records, for each generation, the
values that seal its snapshot, so that history can be checked without the files and the files can
be checked against history. Each line is self-contained: its ``merkle_this`` re-derives from the
other fields, and its ``chain`` field commits to every line before it.

Grammar (ABNF; ASCII only, fields separated by exactly one space, every line ends with LF)::

    ledger   = *line
    line     = body " chain=" hex64 LF            ; at most MAX_LINE (2048) bytes with the LF
    body     = "gen=" gen " ts=" ts " sha256_all=" hex64 " merkle_prev=" hex64
               " merkle_this=" hex64 " path=" path " format=" fmt " keyid=" keyid
               " build=" build
    gen      = 6*20DIGIT        ; the snapshot header's gen text, verbatim (zero-padded)
    ts       = 4DIGIT "-" 2DIGIT "-" 2DIGIT "T" 2DIGIT ":" 2DIGIT ":" 2DIGIT "Z"
    hex64    = 64hexlow          ; hexlow = DIGIT / %x61-66
    path     = segment *("/" segment)                ; relative POSIX, at most 1024 bytes
    segment  = 1*(ALPHA / DIGIT / "." / "_" / "+" / "@" / "," / "~" / "-")  ; not "." or ".."
    fmt      = 1*32(%x61-7A / DIGIT / "_")           ; e.g. "wtxt"
    keyid    = 16hexlow / "-"                        ; "-" when the snapshot is unsigned
    build    = 1*255(ALPHA / DIGIT / "." / "_" / "/" / "+" / "-")

Derived values (hex digests of SHA-256)::

    chain(n)         = SHA256(bytes.fromhex(chain(n-1)) || body(n))    chain(0) = 64 zeros
    merkle_this(n)   = merkle_link(merkle_prev, sha256_all, ts, gen, build)   (formats.integrity)

Invariants checked by :meth:`Ledger.verify`: gen strictly increases; ``merkle_prev`` of line n is
``merkle_this`` of line n-1; each ``chain`` follows from the previous line's; each
``merkle_this`` re-derives; and (with files) each snapshot's header (or WSUM) carries the same
gen, ts, build, sha256_all, merkle_prev, merkle_this and keyid. Paths are resolved against a root
folder (default: the ledger's folder) and are never absolute and never contain ``..``.

Example line (one line in the file; wrapped here)::

    gen=000001 ts=2026-01-02T03:04:05Z sha256_all=6755...f67a merkle_prev=0000...0000
    merkle_this=1ae8...804a path=snapshots/run1/s.wtxt format=wtxt keyid=- build=unknown
    chain=<64 hex>

Appends are crash-safe without a temp file: under an exclusive ``flock``, the last line is read
and checked, then one whole line is written with ``O_APPEND`` and fsynced (the folder too when the
file is new); a failed write is truncated away. A reader rejects a trailing partial line.

The chain makes any edit, deletion or reordering visible unless every later line is rewritten
too; pin the ledger's head (``Ledger.head()``, the last chain value) in a signed tag or pass it to
``verify(head=...)`` to also catch a rewritten or truncated tail.

Example::

    ledger = Ledger("ledger/run1.ledger", root=".")
    ledger.append_snapshot("snapshots/run1/s.wtxt")
    ledger.verify().ok
    # -> True
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from snapops.formats.atomic import fsync_dir
from snapops.formats.errors import FormatError, LedgerError, LimitError, TruncatedError
from snapops.formats.iosafe import open_input
from snapops.formats.integrity import ZERO_HASH, merkle_link
from snapops.formats.report import Report

from .generation.source import FolderSource
from .ledger_values import check_values, wtxt_values

MAX_LINE = 2048
MAX_PATH = 1024
MAX_PROBLEMS = 100
_COUNT_CHUNK = 1 << 20

_HEX64 = rb"[0-9a-f]{64}"
_FIELDS = (  # (name, value pattern, what the grammar expects) in line order
    ("gen", rb"[0-9]{6,20}", "6 to 20 digits"),
    ("ts", rb"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z", "YYYY-MM-DDTHH:MM:SSZ"),
    ("sha256_all", _HEX64, "64 lowercase hex"),
    ("merkle_prev", _HEX64, "64 lowercase hex"),
    ("merkle_this", _HEX64, "64 lowercase hex"),
    ("path", rb"[A-Za-z0-9._+@,~/-]{1,%d}" % MAX_PATH, "a relative POSIX path"),
    ("format", rb"[a-z0-9_]{1,32}", "a format name"),
    ("keyid", rb"[0-9a-f]{16}|-", "16 lowercase hex or -"),
    ("build", rb"[A-Za-z0-9._/+-]{1,255}", "a build token"),
    ("chain", _HEX64, "64 lowercase hex"),
)
_FIELD_RES = {name: re.compile(pat) for name, pat, _ in _FIELDS}
BODY_RE = re.compile(b" ".join(b"%s=(%s)" % (n.encode(), p) for n, p, _ in _FIELDS[:-1]))
LINE_RE = re.compile(BODY_RE.pattern + b" chain=(" + _HEX64 + b")\n")
GRAMMAR = " ".join(f"{n}=" for n, _, _ in _FIELDS) + "LF"


@dataclass(frozen=True)
class LedgerEntry:
    """One generation's sealing values. ``gen_text`` defaults to ``gen`` zero-padded to 6."""

    gen: int
    ts: str
    sha256_all: str
    merkle_prev: str
    merkle_this: str
    path: str
    format: str = "wtxt"
    keyid: str | None = None
    build: str = "unknown"
    gen_text: str = ""

    def __post_init__(self) -> None:
        if not self.gen_text:
            object.__setattr__(self, "gen_text", f"{self.gen:06d}")

    def derived_merkle(self) -> str:
        """``merkle_this`` as re-derived from the entry's other fields."""
        return merkle_link(self.merkle_prev, self.sha256_all, self.ts, self.gen_text, self.build)

    def body(self) -> bytes:
        """The line's bytes before `` chain=`` (raises FormatError if a field breaks the grammar)."""
        text = (f"gen={self.gen_text} ts={self.ts} sha256_all={self.sha256_all} "
                f"merkle_prev={self.merkle_prev} merkle_this={self.merkle_this} path={self.path} "
                f"format={self.format} keyid={self.keyid or '-'} build={self.build}")
        data = text.encode("ascii", "backslashreplace")
        if not BODY_RE.fullmatch(data):
            raise _grammar_error(data + b" chain=" + b"0" * 64 + b"\n", None, None)
        if int(self.gen_text) != self.gen:
            raise FormatError(check="grammar", expected=f"gen_text for gen {self.gen}",
                              got=self.gen_text)
        check_rel_path(self.path)
        return data

    def to_dict(self) -> dict:
        return {"gen": self.gen, "gen_text": self.gen_text, "ts": self.ts,
                "sha256_all": self.sha256_all, "merkle_prev": self.merkle_prev,
                "merkle_this": self.merkle_this, "path": self.path, "format": self.format,
                "keyid": self.keyid, "build": self.build}


@dataclass(frozen=True)
class LedgerLine:
    """A parsed line: where it is, its entry, its stored chain value and the chained bytes."""

    line_no: int
    entry: LedgerEntry
    chain: str
    body: bytes


def chain_next(prev_chain: str, body: bytes) -> str:
    """``SHA256(prev_chain as 32 bytes || body)`` as hex: the value of this line's chain field."""
    return hashlib.sha256(bytes.fromhex(prev_chain) + body).hexdigest()


def format_line(entry: LedgerEntry, prev_chain: str = ZERO_HASH) -> bytes:
    """The exact bytes of the ledger line for ``entry`` after a line whose chain is ``prev_chain``.

    Example::

        format_line(entry).endswith(b"\\n")
        # -> True
    """
    body = entry.body()
    return body + b" chain=" + chain_next(prev_chain, body).encode() + b"\n"


def check_rel_path(path: str, *, where: str | None = None, line: int | None = None) -> str:
    """Return ``path`` if it is relative, POSIX, without empty, ``.`` or ``..`` segments."""
    problem = None
    if path.startswith("/"):
        problem = "an absolute path"
    elif "\\" in path or ":" in path:
        problem = "a non-POSIX path"
    elif any(part in ("", ".", "..") for part in path.split("/")):
        problem = "a path with an empty, '.' or '..' segment"
    elif len(path) > MAX_PATH:
        problem = f"a path longer than {MAX_PATH} bytes"
    if problem:
        raise LedgerError(f"refused {problem}", path=where, line=line, check="path",
                          expected="a relative POSIX path inside the root", got=path)
    return path


def _grammar_error(data: bytes, path: str | None, line: int | None) -> FormatError:
    """Name the first field that breaks the grammar."""
    tokens = data.rstrip(b"\n").split(b" ")
    if not data.endswith(b"\n") or data.endswith(b"\r\n"):
        return FormatError(path=path, line=line, expected="a line ending in LF (no CR)",
                           got=data[-20:].decode("ascii", "backslashreplace"))
    for i, (name, _, want) in enumerate(_FIELDS):
        token = tokens[i] if i < len(tokens) else b"<end of line>"
        key, sep, value = token.partition(b"=")
        if key != name.encode() or not sep or not _FIELD_RES[name].fullmatch(value):
            return FormatError(f"field {i + 1} of the line", path=path, line=line,
                               expected=f"{name}=<{want}>",
                               got=token[:100].decode("ascii", "backslashreplace"))
    return FormatError(path=path, line=line, expected=f"exactly the fields {GRAMMAR}",
                       got=" ".join(t.decode("ascii", "backslashreplace") for t in tokens[10:12]))


def parse_line(data: bytes, line_no: int | None = None, path: str | None = None) -> LedgerLine:
    """Parse one complete line (LF included); a pure function of its bytes."""
    m = LINE_RE.fullmatch(data)
    if not m:
        raise _grammar_error(data, path, line_no)
    g = [v.decode("ascii") for v in m.groups()]
    check_rel_path(g[5], where=path, line=line_no)
    entry = LedgerEntry(gen=int(g[0]), gen_text=g[0], ts=g[1], sha256_all=g[2], merkle_prev=g[3],
                        merkle_this=g[4], path=g[5], format=g[6],
                        keyid=None if g[7] == "-" else g[7], build=g[8])
    return LedgerLine(line_no or 0, entry, g[9], data[:m.start(10) - len(b" chain=")])


def iter_lines(stream: BinaryIO, path: str = "<ledger>") -> Iterator[LedgerLine]:
    """Parse a ledger stream line by line; lines are bounded by MAX_LINE before parsing."""
    line_no = 0
    while True:
        data = stream.readline(MAX_LINE + 1)
        if not data:
            return
        line_no += 1
        if not data.endswith(b"\n"):
            if len(data) > MAX_LINE:
                raise LimitError(path=path, line=line_no,
                                 expected=f"a line of at most {MAX_LINE} bytes",
                                 got=f"more than {MAX_LINE} bytes")
            raise TruncatedError("partial last line (an interrupted append?)", path=path,
                                 line=line_no, expected="a complete line ending in LF",
                                 got=f"{len(data)} bytes and end of file")
        yield parse_line(data, line_no, path)


def entry_for_snapshot(snapshot: str | os.PathLike, root: str | os.PathLike) -> LedgerEntry:
    """The ledger entry of a WTXT snapshot file that lives under ``root``."""
    snap, base = Path(snapshot).resolve(), Path(root).resolve()
    try:
        rel = snap.relative_to(base).as_posix()
    except ValueError:
        raise LedgerError(path=os.fspath(snapshot), check="path",
                          expected=f"a snapshot under the root {base}", got=str(snap)) from None
    values = wtxt_values(FolderSource(base), rel)
    return LedgerEntry(gen=int(values["gen"]), gen_text=values["gen"], ts=values["ts"],
                       sha256_all=values["sha256_all"], merkle_prev=values["merkle_prev"],
                       merkle_this=values["merkle_this"], path=check_rel_path(rel),
                       format="wtxt", keyid=values["keyid"], build=values["build"])


@dataclass
class LedgerReport(Report):
    """Outcome of :meth:`Ledger.verify`: ``failure`` is the first problem, ``problems`` all of
    them (at most MAX_PROBLEMS kept), each naming its line."""

    problems: list[FormatError] = field(default_factory=list)
    dropped: int = 0
    entries: int = 0
    head: str = ZERO_HASH
    last_gen: int | None = None

    def problem(self, error: FormatError) -> None:
        error = error.located(self.path)
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(error)
        else:
            self.dropped += 1
        if self.ok:
            self.fail(error)

    def to_dict(self) -> dict:
        return super().to_dict() | {
            "entries": self.entries, "head": self.head, "last_gen": self.last_gen,
            "problems": [p.to_dict() for p in self.problems], "problems_dropped": self.dropped}

    def summary(self) -> str:
        if self.ok:
            read = ("each snapshot's header matches its entry (their data: snapops verify)"
                    if "file" in self.checks else "snapshot files not read")
            text = (f"OK {self.path}: {self.entries} entries, last gen {self.last_gen}, "
                    f"head {self.head}; {read}")
        else:
            more = [f"... and {self.dropped} more"] if self.dropped else []
            text = "\n".join([f"FAIL {self.path}: {len(self.problems) + self.dropped} problem(s)",
                              *(f"  {p}" for p in self.problems), *more])
        return "\n".join([text, *(f"  note: {n}" for n in self.notes)])


def check_link(rec: LedgerLine, prev: LedgerLine | None,
               contiguous: bool = False) -> LedgerError | None:
    """The first chain problem of ``rec`` given the line before it (None when it is sound)."""
    e, n = rec.entry, rec.line_no
    after = f"line {prev.line_no} (gen {prev.entry.gen_text})" if prev else "the start"
    if prev and e.gen <= prev.entry.gen:
        return LedgerError("lines reordered or duplicated", line=n, check="order",
                           expected=f"gen greater than {prev.entry.gen_text} of {after}",
                           got=e.gen_text)
    expected_prev = prev.entry.merkle_this if prev else ZERO_HASH
    linked = e.merkle_prev == expected_prev
    derived = e.derived_merkle()
    chain = chain_next(prev.chain if prev else ZERO_HASH, rec.body)
    if chain != rec.chain:
        if not linked and derived == e.merkle_this:
            return LedgerError(f"gen {e.gen_text} does not follow {after}: a line before it is "
                               "missing (deleted) or lines were moved", line=n, check="gap",
                               expected=f"merkle_prev={expected_prev}", got=e.merkle_prev)
        cause = f"this line (or the chain of {after}) was edited" if prev else (
            "this line was edited (the first line chains from 64 zeros)")
        return LedgerError(f"chain mismatch: {cause}",
                           line=n, check="chain", expected=f"chain={chain}", got=rec.chain)
    if prev and not linked:
        return LedgerError(f"merkle_prev does not match merkle_this of {after}", line=n,
                           check="merkle", expected=f"merkle_prev={expected_prev}",
                           got=e.merkle_prev)
    if derived != e.merkle_this:
        return LedgerError("merkle_this does not re-derive from merkle_prev, sha256_all, ts, "
                           "gen, build", line=n, check="merkle",
                           expected=f"merkle_this={derived}", got=e.merkle_this)
    if contiguous and prev and e.gen != prev.entry.gen + 1:
        return LedgerError(f"generations missing after {after}", line=n, check="gap",
                           expected=f"gen {prev.entry.gen + 1}", got=e.gen_text)
    return None


def check_file(rec: LedgerLine, root: Path, allow_missing: bool,
               notes: list[str]) -> LedgerError | None:
    """Compare the snapshot file of ``rec`` with its entry (None when they agree)."""
    e, n = rec.entry, rec.line_no
    target = root / e.path
    try:
        exists = target.exists()
    except OSError as exc:          # a name too long for the file system, a loop...
        return LedgerError(f"snapshot {e.path} cannot be looked up", line=n, check="path",
                           expected="a file path this file system can hold",
                           got=exc.strerror or str(exc))
    if not exists:
        if allow_missing:
            notes.append(f"line {n}: {e.path} is missing (allowed)")
            return None
        return LedgerError(f"snapshot {e.path} is missing", line=n, check="missing",
                           expected="an existing file (or --allow-missing)", got="no such file")
    try:
        target.resolve().relative_to(root.resolve())
    except ValueError:
        return LedgerError(f"{e.path} resolves outside the root", line=n, check="path",
                           expected=f"a file under {root}", got=str(target.resolve()))
    return check_values(rec, FolderSource(root), "in the file", notes)


class Ledger:
    """An append-only ledger file. ``root`` (default: the ledger's folder) anchors entry paths.

    Example::

        ledger = Ledger("ledger/run1.ledger", root=".")
        [e.gen for e in ledger.entries()]
        # -> [1, 2, 3]
    """

    def __init__(self, path: str | os.PathLike, *, root: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.root = Path(root) if root is not None else self.path.parent

    def _name(self) -> str:
        return os.fspath(self.path)

    def _io_error(self, exc: OSError, expected: str) -> FormatError:
        return FormatError(path=self._name(), check="io", expected=expected, got=exc.strerror)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[BinaryIO]:
        try:
            stream = open_input(self.path)
        except FormatError as exc:
            raise FormatError(path=self._name(), check="io", expected="a readable ledger file",
                              got=exc.message) from None
        with stream:
            yield stream

    def lines(self) -> Iterator[LedgerLine]:
        """Stream the parsed lines; a bad line raises a typed error naming it."""
        with self._reading() as stream:
            yield from iter_lines(stream, self._name())

    def entries(self) -> Iterator[LedgerEntry]:
        """Stream the entries (parsing only; :meth:`verify` checks the chain)."""
        for rec in self.lines():
            yield rec.entry

    def last(self) -> LedgerLine | None:
        """The last line (read from the end of the file), or None for an empty ledger."""
        with self._reading() as stream:
            return self._tail(stream.fileno())

    def head(self) -> str:
        """The chain value of the last line (64 zeros when empty): a commitment to the ledger."""
        last = self.last()
        return last.chain if last else ZERO_HASH

    def _tail(self, fd: int) -> LedgerLine | None:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        start = max(0, size - (MAX_LINE + 1))
        tail = os.pread(fd, size - start, start)
        lines = sum(os.pread(fd, _COUNT_CHUNK, at).count(b"\n")
                    for at in range(0, size, _COUNT_CHUNK))
        if not tail.endswith(b"\n"):
            raise TruncatedError("partial last line (an interrupted append?); remove it before "
                                 "appending", path=self._name(), line=lines + 1,
                                 expected="a ledger ending in LF", got="a line without LF")
        cut = tail.rfind(b"\n", 0, len(tail) - 1)
        if cut < 0 and start > 0:
            raise LimitError(path=self._name(), line=lines,
                             expected=f"a line of at most {MAX_LINE} bytes",
                             got=f"more than {MAX_LINE} bytes")
        return parse_line(tail[cut + 1:], lines, self._name())

    def append(self, entry: LedgerEntry) -> LedgerLine:
        """Append ``entry`` if it extends the chain; refuse it with a LedgerError otherwise.

        Example::

            Ledger("run1.ledger").append(entry).line_no
            # -> 4
        """
        body = entry.body()
        if entry.derived_merkle() != entry.merkle_this:
            raise LedgerError("refused: merkle_this does not re-derive", path=self._name(),
                              check="merkle", expected=f"merkle_this={entry.derived_merkle()}",
                              got=entry.merkle_this)
        existed = self.path.exists()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise self._io_error(exc, "a writable ledger file") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one appender at a time: read-check-write is atomic
            last = self._tail(fd)
            self._refuse_unchained(entry, last)
            chain = chain_next(last.chain if last else ZERO_HASH, body)
            self._write_line(fd, body + b" chain=" + chain.encode() + b"\n")
        finally:
            os.close(fd)
        if not existed:
            fsync_dir(self.path.parent)
        return LedgerLine((last.line_no if last else 0) + 1, entry, chain, body)

    def _refuse_unchained(self, entry: LedgerEntry, last: LedgerLine | None) -> None:
        if last is None:
            return
        n, prev = last.line_no, last.entry
        if entry.gen <= prev.gen:
            raise LedgerError("refused: gen must increase", path=self._name(), line=n + 1,
                              check="order", expected=f"gen greater than {prev.gen_text} "
                              f"(line {n})", got=entry.gen_text)
        if entry.merkle_prev != prev.merkle_this:
            raise LedgerError(f"refused: {entry.path} does not chain on the last entry",
                              path=self._name(), line=n + 1, check="merkle",
                              expected=f"merkle_prev={prev.merkle_this} (merkle_this of line "
                              f"{n}, gen {prev.gen_text})", got=entry.merkle_prev)

    def _write_line(self, fd: int, data: bytes) -> None:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):  # never leave a partial line behind
                os.ftruncate(fd, size)
                os.fsync(fd)
            raise self._io_error(exc, "a durable append") from exc

    def append_snapshot(self, snapshot: str | os.PathLike,
                        root: str | os.PathLike | None = None) -> LedgerLine:
        """Append the entry of a WTXT snapshot (header, or WSUM for a streaming file).

        Example::

            Ledger("ledger/run1.ledger", root=".").append_snapshot("snapshots/run1/s.wtxt")
        """
        return self.append(entry_for_snapshot(snapshot, self.root if root is None else root))

    def verify(self, *, check_files: bool = True, allow_missing: bool = False,
               contiguous: bool = False, head: str | None = None,
               root: str | os.PathLike | None = None) -> LedgerReport:
        """Check every line; never raises for bad content (see ``report.problems``).

        ``allow_missing`` accepts pruned snapshot files (noted, not failed); ``contiguous``
        demands gen n+1 after gen n; ``head`` is the chain value the last line must carry.

        Example::

            report = Ledger("ledger/run1.ledger", root=".").verify()
            report.ok, [str(p) for p in report.problems]
        """
        report = LedgerReport(path=self._name(), format="ledger")
        report.checks = ["grammar", "order", "chain", "merkle"] + (["file"] if check_files else [])
        base = self.root if root is None else Path(root)
        prev = None
        latest: dict[str, LedgerLine] = {}   # a stable path holds only its newest snapshot
        try:
            for rec in self.lines():
                report.entries += 1
                problem = check_link(rec, prev, contiguous)
                if problem is not None:
                    report.problem(problem)
                latest[rec.entry.path] = rec
                prev = rec
        except FormatError as exc:  # unparsable: the lines after it cannot be placed
            report.problem(exc)
        if check_files:
            superseded = report.entries - len(latest)
            if superseded:
                report.notes.append(f"{superseded} line(s) name a path a later line names "
                                    "again; their files are in history, not in this tree")
            for rec in sorted(latest.values(), key=lambda r: r.line_no):
                problem = check_file(rec, base, allow_missing, report.notes)
                if problem is not None:
                    report.problem(problem)
        report.head = prev.chain if prev else ZERO_HASH
        report.last_gen = prev.entry.gen if prev else None
        if head is not None and head != report.head:
            report.problem(LedgerError("the ledger's head moved (tail rewritten or removed?)",
                                       line=prev.line_no if prev else None, check="head",
                                       expected=f"last chain={head}", got=report.head))
        return report
