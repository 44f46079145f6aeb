"""The write-ahead log: append-only, one line per lifecycle record, shared by the training
process (REQ, SPOOLED, DROPPED) and the daemon (SERIALIZED, COMMITTED, PUSHED, DROPPED).

Line grammar (ASCII): ``<EVENT> gen=<int> [<key>=<token> ...] crc=<crc32c hex8>`` + LF, where
the CRC covers the bytes before `` crc=``. ``w=`` names the writer of every record: training
rank ``r`` is writer ``r`` (a single trainer is ``0``), the daemon is ``daemon``; REQ records
also carry the writer's ``pid=`` (and ``world=`` in a multi-rank run); records the daemon writes
about one rank's part say which (``part=``), and ``node=`` for parts other daemons delivered.
:data:`FIELDS` bounds every value.

Records are whole or absent. An append takes an exclusive ``flock`` on the WAL (bounded wait)
and, under it:

1. if the file does not end in LF (a writer was killed in the middle of a record), writes the
   missing LF first, so the torn fragment stays a line of its own (replayed as corrupt) and
   never glues itself to the next record;
2. writes the record, continuing after short writes (EINTR is retried by Python);
3. if a write fails part way (ENOSPC, EIO), truncates the file back to where it began.

Readers skip (and report) corrupt lines and resynchronise: a corrupt line with a record start
(``<EVENT> gen=``) after some garbage yields the record found there. The training thread never
waits for fsync: ``sync()`` (fdatasync) is called by the spool thread after each spooled
generation and by the daemon after its own records. Files are opened without following
symlinks and without blocking (a FIFO or a device is refused, never waited on).
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from snapops.formats.errors import SnapopsError
from snapops.formats.integrity import crc32c

from .lifecycle import (
    DROP_REASONS, DROPPED, EVENTS, PART_EVENTS, PUSHED, REQ, SPOOLED, Generation,
    IllegalTransition,
)
from .redact import redact_url
from .safeio import open_regular

log = logging.getLogger("snapops.wal")
TOKEN = re.compile(r"[A-Za-z0-9._:/+@-]+")
LINE = re.compile(rb"([A-Z]+) gen=(0|[1-9][0-9]{0,17})((?: [a-z_]+=[A-Za-z0-9._:/+@-]+)*) "
                  rb"crc=([0-9a-f]{8})")
RECORD_START = re.compile(rb"(?:%s) gen=" % b"|".join(e.encode() for e in EVENTS))
MAX_LINE = 4096
READ_CHUNK = 1 << 20
LOCK_TIMEOUT = 10.0           # seconds an append waits for the WAL lock
MAX_ERROR_TOKEN = 300         # characters of an error kept in a DROPPED record
DAEMON_WRITER = "daemon"
DEFAULT_RANK = "0"
KEPT_REJECTIONS = 200

_UINT = r"0|[1-9][0-9]{0,17}"
RANK = r"0|[1-9][0-9]{0,5}"
NODE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# key -> (value pattern, what it must be): every field any record may carry
FIELDS: dict[str, tuple[re.Pattern, str]] = {k: (re.compile(v), what) for k, (v, what) in {
    "t": (r"[0-9]{1,11}(?:\.[0-9]{1,9})?", "unix seconds"),
    "w": (RANK + "|" + DAEMON_WRITER, "a writer id (rank or daemon)"),
    "world": (r"[1-9][0-9]{0,5}", "a world size"),
    "part": (RANK, "a rank"),
    "node": (NODE, "a node name"),
    "missing": (rf"(?:{RANK})(?:\+(?:{RANK})){{0,999}}", "ranks joined by +"),
    "ref": (rf"refs/snapops/parts/[A-Za-z0-9._-]{{1,128}}/[0-9]{{6,18}}/{NODE}", "a part ref"),
    "pid": (r"[1-9][0-9]{0,9}", "a process id"),
    "writer_pid": (r"[1-9][0-9]{0,9}", "a process id"),
    "arrays": (r"0|[1-9][0-9]{0,6}", "an array count"),
    "bytes": (_UINT, "a byte count"),
    "by": (_UINT, "a generation"),
    "file": (r"gen-[0-9]{12,18}(?:-[a-z0-9]{1,16})?\.spool", "a spool file name"),
    "reason": ("|".join(DROP_REASONS), "a drop reason"),
    "error": (r"[A-Za-z0-9._:/+@-]{1,%d}" % MAX_ERROR_TOKEN, "an error token"),
    "merkle": (r"[0-9a-f]{64}", "a merkle hex digest"),
    "commit": (r"[0-9a-f]{40}|[0-9a-f]{64}", "a commit id"),
    "tag": (r"[A-Za-z0-9._-]{1,100}/gen-[0-9]{6,18}", "a generation tag"),
    "remote": (r"[A-Za-z0-9._-]{1,100}", "a remote name"),
    "recovered": (r"1", "1"),
}.items()}
REQUIRED = {SPOOLED: ("file", "commit"), PUSHED: ("remote",)}   # (at least one of)


class WalError(SnapopsError, OSError):
    """The WAL cannot be opened or appended to (not a regular file, lock timeout, disk full)."""


@dataclass(frozen=True)
class Record:
    event: str
    gen: int
    fields: dict[str, str]
    line_no: int


def format_record(event: str, gen: int, fields: dict[str, object]) -> bytes:
    if event not in EVENTS:
        raise ValueError(f"unknown WAL event {event!r}")
    parts = [f"{event} gen={int(gen)}"]
    for key, value in fields.items():
        text = str(value)
        if not re.fullmatch(r"[a-z_]+", key) or not TOKEN.fullmatch(text):
            raise ValueError(f"WAL field {key}={text!r} is not a token")
        parts.append(f"{key}={text}")
    body = " ".join(parts).encode("ascii")
    return body + b" crc=%08x\n" % crc32c(body)


def error_token(exc: BaseException | str) -> str:
    """An error message as one WAL token: URLs redacted, runs of other characters made
    ``_``, bounded.

    >>> error_token("[order] gen 3 <= 5")
    'order_gen_3_5'
    """
    text = re.sub(r"[^A-Za-z0-9._:/+@-]+", "_", redact_url(str(exc))).strip("_")
    return (text or "unknown")[:MAX_ERROR_TOKEN]


def check_fields(event: str, fields: dict[str, str]) -> str | None:
    """Why a record's fields are malformed, or None; every key known, every value bounded."""
    for key, value in fields.items():
        rule = FIELDS.get(key)
        if rule is None:
            return f"unknown field {key}="
        if not rule[0].fullmatch(value):
            return f"{key}={value[:40]} is not {rule[1]}"
    required = REQUIRED.get(event, ())
    if required and not any(key in fields for key in required):
        return f"{event} without {'= or '.join(required)}="
    return None


class Wal:
    """Appender for writer ``writer`` (see the module docstring). Thread-safe; safe to share
    the file with other processes that append through this class."""

    def __init__(self, path: str | os.PathLike, *, writer: str = "0") -> None:
        self.path = Path(path)
        self.writer = writer
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise WalError(f"cannot open the WAL {self.path}: {exc.strerror or exc}") from exc
        self._lock = threading.Lock()

    def append(self, event: str, gen: int, **fields: object) -> None:
        """Append one record, whole or not at all; raises WalError if it cannot."""
        line = format_record(event, gen, {"t": f"{time.time():.6f}", "w": self.writer,
                                          **fields})
        with self._lock:
            if self._fd < 0:
                raise WalError(f"the WAL {self.path} is closed")
            self._lock_file()
            try:
                self._append_locked(line)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _lock_file(self) -> None:
        deadline, pause = time.monotonic() + LOCK_TIMEOUT, 0.0005
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise WalError(f"the WAL {self.path} stayed locked for {LOCK_TIMEOUT:.0f}s")
                time.sleep(pause)
                pause = min(pause * 2, 0.02)

    def _append_locked(self, line: bytes) -> None:
        start = os.fstat(self._fd).st_size
        if start and os.pread(self._fd, 1, start - 1) != b"\n":
            line = b"\n" + line  # seal a torn tail left by a killed writer
        view, written = memoryview(line), 0
        try:
            while written < len(line):
                n = os.write(self._fd, view[written:])
                if n <= 0:
                    raise OSError(f"write returned {n}")
                written += n
        except OSError as exc:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # the next appender seals the fragment (step 1)
            raise WalError(f"cannot append to the WAL {self.path}: {exc.strerror or exc}") \
                from exc

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def parse_line(line: bytes, line_no: int) -> Record | None:
    m = LINE.fullmatch(line)
    if not m:
        return None
    body = line[:line.rindex(b" crc=")]
    if crc32c(body) != int(m.group(4), 16):
        return None
    fields = dict(item.split("=", 1) for item in m.group(3).decode("ascii").split())
    if len(fields) != m.group(3).count(b" "):  # a key given twice
        return None
    return Record(m.group(1).decode("ascii"), int(m.group(2)), fields, line_no)


def parse_resync(line: bytes, line_no: int) -> tuple[Record | None, bytes]:
    """The record in ``line`` (also after leading garbage) and the garbage skipped."""
    if len(line) > MAX_LINE:
        return None, line
    record = parse_line(line, line_no)
    if record is not None:
        return record, b""
    for m in RECORD_START.finditer(line, 1):
        record = parse_line(line[m.start():], line_no)
        if record is not None:
            return record, line[:m.start()]
    return None, line


class WalReader:
    """Incremental reader: ``read_new()`` returns the complete records added since last time.

    ``bad`` lists (line number, start of the text) of corrupt lines; ``problem`` says why the
    WAL could not be read at all (not a regular file, ...), or is None.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.offset = 0
        self.line_no = 0
        self.bad: list[tuple[int, str]] = []
        self.problem: str | None = None

    def read_new(self) -> list[Record]:
        try:
            fd = open_regular(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return []
        except OSError as exc:
            self._report_problem(f"cannot read the WAL {self.path}: {exc.strerror or exc}")
            return []
        self._report_problem(None)
        records: list[Record] = []
        try:
            while self._read_chunk(fd, records):
                pass
        finally:
            os.close(fd)
        return records

    def _read_chunk(self, fd: int, records: list[Record]) -> bool:
        """Parse the complete lines of the next chunk; False when nothing more is complete."""
        data = os.pread(fd, READ_CHUNK, self.offset)
        end = data.rfind(b"\n") + 1
        if end == 0:
            if len(data) <= MAX_LINE:
                return False  # a torn last line waits for its LF
            end = len(data)   # no record is that long: skip the garbage
        lines = data[:end].split(b"\n")
        if data[end - 1:end] == b"\n":
            lines.pop()
        for raw in lines:
            self.line_no += 1
            record, garbage = parse_resync(raw, self.line_no)
            if garbage:
                self._bad(garbage)
            if record is not None:
                records.append(record)
        self.offset += end
        return True

    def _bad(self, raw: bytes) -> None:
        self.bad.append((self.line_no, raw[:80].decode("ascii", "replace")))
        del self.bad[:-KEPT_REJECTIONS]
        log.error("wal %s:%d: skipping corrupt record %r", self.path, self.line_no, raw[:80])

    def _report_problem(self, problem: str | None) -> None:
        if problem is not None and problem != self.problem:
            log.error("%s", problem)
        self.problem = problem


class WalState:
    """Generations folded from records through the transition table.

    ``writers``: the ranks that write to this spool (the daemon always may); ``expect``: the
    ranks whose parts make a generation whole (default ``writers``; a committer node also
    expects the ranks other nodes serve, recorded by the daemon with ``part=``); ``world``: the
    world size a REQ must declare (None: not checked). REQ and SPOOLED records, and DROPPED
    records of a rank or naming a ``part=``, concern one rank's part
    (:meth:`Generation.apply_part`).

    Records of writers not in ``writers``, parts of ranks not expected, and illegal transitions
    are rejected: logged, counted and kept (the last few) in ``rejected``. A record with a
    malformed field still moves its generation, which is marked with ``problem`` (the daemon
    then drops it as ``bad_record``); its fields are not merged.
    """

    def __init__(self, writers: frozenset[str] = frozenset({"0"}), *,
                 expect: frozenset[str] | None = None, world: int | None = None) -> None:
        self.writers = writers | {DAEMON_WRITER}
        self.expect = writers if expect is None else expect
        self.world = world
        self.gens: dict[int, Generation] = {}
        self.rejected: collections.deque[tuple[Record, str]] = collections.deque(
            maxlen=KEPT_REJECTIONS)
        self.rejected_total = 0

    def apply(self, record: Record) -> Generation | None:
        writer = record.fields.get("w")
        if writer is not None and writer not in self.writers:
            return self._reject(record, f"writer {writer[:20]} may not write to this spool")
        problem = check_fields(record.event, record.fields) or self._world_problem(record)
        fields = {} if problem else record.fields
        rank = _part_of(record.event, writer, fields)
        if rank is not None and rank not in self.expect:
            return self._reject(record, f"rank {rank} is not served here")
        gen = self.gens.get(record.gen) or Generation(record.gen)
        try:
            if rank is None:
                gen.apply(record.event, fields)
            else:
                gen.apply_part(rank, record.event, fields, self.expect)
        except IllegalTransition as exc:
            return self._reject(record, str(exc))
        if problem and gen.problem is None:
            gen.problem = f"line {record.line_no}: {problem}"
            log.error("wal line %d: gen %d: %s", record.line_no, record.gen, problem)
        self.gens[record.gen] = gen
        return gen

    def _world_problem(self, record: Record) -> str | None:
        world = record.fields.get("world")
        if record.event == REQ and self.world is not None and \
                world != (None if self.world == 1 else str(self.world)):
            return f"world={world or '-'} but this spool serves a world of {self.world}"
        return None

    def _reject(self, record: Record, why: str) -> None:
        self.rejected.append((record, why))
        self.rejected_total += 1
        log.error("wal line %d: %s; record ignored", record.line_no, why)
        return None

    def in_state(self, *states: str) -> list[Generation]:
        return sorted((g for g in self.gens.values() if g.state in states), key=lambda g: g.gen)

    def last_gen(self, rank: str) -> int:
        """The newest generation rank ``rank`` has a part in (-1: none)."""
        return max((g.gen for g in self.gens.values() if rank in g.parts), default=-1)


def _part_of(event: str, writer: str | None, fields: dict[str, str]) -> str | None:
    """The rank whose part a record concerns, or None for a record about the generation."""
    if event not in PART_EVENTS:
        return None
    if "part" in fields:
        return fields["part"]
    if writer is not None and writer != DAEMON_WRITER:
        return writer
    # the daemon's own DROPPED is about the generation; its SPOOLED (recovered=1, written
    # before ranks existed) about the single trainer's part
    return None if event == DROPPED else DEFAULT_RANK


def replay(path: str | os.PathLike, writers: frozenset[str] = frozenset({"0"}), **scope
           ) -> tuple[WalState, WalReader]:
    """The state of the WAL at ``path`` and a reader positioned after it (``scope``: the
    ``expect``/``world`` of :class:`WalState`)."""
    reader = WalReader(path)
    state = WalState(writers, **scope)
    for record in reader.read_new():
        state.apply(record)
    return state, reader
