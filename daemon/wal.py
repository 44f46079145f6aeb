"""The write-ahead log: append-only, one line per lifecycle record, shared by the training
process (REQ, SPOOLED, DROPPED) and the daemon (SERIALIZED, COMMITTED, PUSHED).

Line grammar (ASCII): ``<EVENT> gen=<int> [<key>=<token> ...] crc=<crc32c hex8>`` + LF, where
the CRC covers the bytes before `` crc=``. Each record is one ``write()`` on an O_APPEND
descriptor, so writers in two processes never interleave. The training thread never waits for
fsync: ``sync()`` (fdatasync) is called by the spool thread after each spooled generation and
by the daemon after its own records. Replay skips (and reports) torn or corrupt lines.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from snapops.formats.integrity import crc32c

from .lifecycle import EVENTS, Generation, IllegalTransition

log = logging.getLogger("snapops.wal")
TOKEN = re.compile(r"[A-Za-z0-9._:/+@-]+")
LINE = re.compile(rb"([A-Z]+) gen=(0|[1-9][0-9]{0,17})((?: [a-z_]+=[A-Za-z0-9._:/+@-]+)*) "
                  rb"crc=([0-9a-f]{8})")
MAX_LINE = 4096


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


class Wal:
    """Appender. Thread-safe; safe to share the file with another process."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def append(self, event: str, gen: int, **fields: object) -> None:
        line = format_record(event, gen, {"t": f"{time.time():.6f}", **fields})
        with self._lock:
            os.write(self._fd, line)

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
    return Record(m.group(1).decode("ascii"), int(m.group(2)), fields, line_no)


class WalReader:
    """Incremental reader: ``read_new()`` returns the complete records added since last time."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.offset = 0
        self.line_no = 0
        self.bad: list[tuple[int, str]] = []

    def read_new(self) -> list[Record]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1      # a torn last line waits for its LF
        records = []
        for raw in data[:end].split(b"\n")[:-1]:
            self.line_no += 1
            record = parse_line(raw, self.line_no) if len(raw) <= MAX_LINE else None
            if record is None:
                self.bad.append((self.line_no, raw[:80].decode("ascii", "replace")))
                log.error("wal %s:%d: skipping corrupt record %r", self.path, self.line_no,
                          raw[:80])
                continue
            records.append(record)
        self.offset += end
        return records


class WalState:
    """Generations folded from records through the transition table."""

    def __init__(self) -> None:
        self.gens: dict[int, Generation] = {}
        self.rejected: list[tuple[Record, str]] = []

    def apply(self, record: Record) -> Generation | None:
        gen = self.gens.setdefault(record.gen, Generation(record.gen))
        try:
            gen.apply(record.event, record.fields)
        except IllegalTransition as exc:
            self.rejected.append((record, str(exc)))
            log.error("wal line %d: %s; record ignored", record.line_no, exc)
            return None
        return gen

    def in_state(self, *states: str) -> list[Generation]:
        return sorted((g for g in self.gens.values() if g.state in states), key=lambda g: g.gen)


def replay(path: str | os.PathLike) -> tuple[WalState, WalReader]:
    reader = WalReader(path)
    state = WalState()
    for record in reader.read_new():
        state.apply(record)
    return state, reader
