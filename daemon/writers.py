"""Who writes a spool: one lock per writer id, and retiring what a dead writer left unfinished.

Every WAL record names its writer (``w=``). Training rank ``r`` is writer ``r`` (a single
trainer is ``0``) and holds its own lock, so the N ranks of a machine share one spool; the
spool accepts the ranks its daemon serves (``cluster.ranks``). A writer holds an
exclusive ``flock`` on ``<spool>/writer-<id>.lock`` (its pid written inside, for humans) for
as long as it lives: a second one is refused with :class:`WriterBusy`. The kernel drops the
lock with its process, SIGKILL included, so holding the lock also proves that no live process
writes as that id, across containers sharing the spool volume too, where pids mean nothing.

Whoever holds a writer's lock may retire that writer's unfinished requests (parts in REQ
without SPOOLED): a new Snapshotter at start, or the daemon after ``daemon.abandon_after``
seconds (:func:`retire_unfinished`). A request whose spool file is complete (spool files
appear by atomic rename) is recorded SPOOLED with ``recovered=1``; any other is DROPPED with
``reason=abandoned``. Both records name the rank (``part=``): the daemon writes them too.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from pathlib import Path

from snapops.formats.errors import SnapopsError

from .lifecycle import DROPPED, REQ, SPOOLED
from .safeio import open_regular
from .spool import spool_name
from .wal import DEFAULT_RANK, Wal, WalState

log = logging.getLogger("snapops.writers")
DEFAULT_WRITER = DEFAULT_RANK


class WriterBusy(SnapopsError):
    """Another live process already writes to this spool as the same writer id."""


def lock_path(spool_dir: str | os.PathLike, writer: str) -> Path:
    return Path(spool_dir) / f"writer-{writer}.lock"


class WriterLock:
    """The exclusive lock of writer ``writer`` on ``spool_dir``; waits up to ``wait`` seconds
    (a daemon retiring a dead writer holds it for a moment), then raises WriterBusy.

    Example::

        lock = WriterLock("spool", "0")
        lock.release()
    """

    def __init__(self, spool_dir: str | os.PathLike, writer: str = DEFAULT_WRITER, *,
                 wait: float = 2.0) -> None:
        self.path = lock_path(spool_dir, writer)
        try:
            self._fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise WriterBusy(f"cannot open the writer lock {self.path}: "
                             f"{exc.strerror or exc}") from exc
        deadline = time.monotonic() + wait
        while not self._try_lock():
            if time.monotonic() >= deadline:
                holder = os.pread(self._fd, 32, 0).decode("ascii", "replace").strip()
                os.close(self._fd)
                raise WriterBusy(
                    f"spool {self.path.parent} already has a live writer {writer} "
                    f"(pid {holder or '?'} holds {self.path.name}); one process per spool "
                    f"unless the spool is set up for ranks")
            time.sleep(0.01)
        try:  # for humans only: a full disk must not fail the lock
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass

    def _try_lock(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def try_writer_lock(spool_dir: str | os.PathLike, writer: str) -> WriterLock | None:
    """The writer's lock if nobody holds it (the writer is gone), else None; never waits."""
    try:
        return WriterLock(spool_dir, writer, wait=0.0)
    except WriterBusy:
        return None


def retire_unfinished(wal: Wal, state: WalState, spool_dir: str | os.PathLike,
                      writer: str, gens: list[int] | None = None) -> dict[int, str]:
    """Record SPOOLED (spool file complete) or DROPPED ``reason=abandoned`` for every part of
    ``writer`` still in REQ (only those in ``gens`` if given). Call it holding the writer's
    lock and after bringing ``state`` up to date. Returns {gen: "recovered" | "abandoned"}.
    """
    done = {}
    for gen in sorted(state.gens.values(), key=lambda g: g.gen):
        part = gen.parts.get(writer)
        if part is None or part.state != REQ or gen.problem or \
                (gens is not None and gen.gen not in gens):
            continue
        # a rank of a multi-rank run (its REQ says world=) names its spool files by rank
        name = spool_name(gen.gen, int(writer) if "world" in part.fields else None)
        size = _regular_size(Path(spool_dir) / name)
        if size is not None:
            wal.append(SPOOLED, gen.gen, part=writer, file=name, bytes=size, recovered=1)
            done[gen.gen] = "recovered"
        else:
            pid = part.fields.get("pid")
            wal.append(DROPPED, gen.gen, part=writer, reason="abandoned",
                       **({"writer_pid": pid} if pid else {}))
            done[gen.gen] = "abandoned"
        log.warning("gen %d of writer %s (pid %s, gone): %s", gen.gen, writer,
                    part.fields.get("pid", "?"), done[gen.gen])
    return done


def _regular_size(path: Path) -> int | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
