"""What ends a running git call besides its wall clock and a cancel: a stall, and a disk
running low (:mod:`snapops.formats.gitcmd` watches both while git runs):

* a ``stall``: for that many seconds no byte on stdout or stderr, and no byte read, written or
  drained from a socket by any process of the group: ``git push --progress`` prints a line
  every second while it writes, and the kernel draining a send buffer to a slow link counts
  too (:class:`Silence`, :func:`group_activity`);
* ``keep_free``: the disk git writes to runs low (a fetch from a remote that sends far more
  than asked would otherwise fill it, and whatever else writes there with it): git is stopped
  and :class:`DiskLow` raised (:class:`DiskFloor`, :func:`fetch_floor`).
"""

from __future__ import annotations

import os
import time

from .errors import GitError
from .procgroup import group_members

__all__ = ["DISK_POLL", "FETCH_KEEPS_FREE", "DiskFloor", "DiskLow", "Silence", "fetch_floor",
           "group_activity"]

DISK_POLL = 0.5                 # seconds between looks at the free space of a keep_free disk
FETCH_KEEPS_FREE = 1 << 30      # bytes a fetch leaves free on its disk (fetch_floor)


def _io_and_sockets(pid: int) -> tuple[int, set[str]]:
    moved, inodes = 0, set()
    try:
        with open(f"/proc/{pid}/io") as f:
            moved = sum(int(line.split()[1]) for line in f if line.startswith(("rchar", "wchar")))
        with os.scandir(f"/proc/{pid}/fd") as fds:
            for fd in fds:
                try:
                    target = os.readlink(fd.path)
                except OSError:     # closed since it was listed
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except (OSError, ValueError):
        pass
    return moved, inodes


def _queued(inodes: set[str]) -> int:
    """Bytes waiting in the send and receive queues of these TCP sockets."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > 9 and row[9] in inodes:
                tx, _, rx = row[4].partition(":")
                total += int(tx, 16) + int(rx, 16)
    return total


def group_activity(pgid: int) -> tuple[int, int]:
    """What the processes of group ``pgid`` have moved: bytes read and written, and bytes
    still queued in their TCP sockets. Any change means the work goes on, printed or not
    (a kernel draining a send buffer to a slow link, a remote hook writing objects)."""
    moved, inodes = 0, set()
    for pid in group_members(pgid, live=False):
        done, found = _io_and_sockets(pid)
        moved, inodes = moved + done, inodes | found
    return moved, _queued(inodes) if inodes else 0


class Silence:
    """The stall clock: restarted by output, and, while git is silent, by any change in
    :func:`group_activity` (looked at every ``every`` seconds)."""

    def __init__(self, pgid: int, stall: float) -> None:
        self.pgid, self.stall = pgid, stall
        self.every = min(1.0, stall / 4)
        self.last = self.probed = time.monotonic()
        self.seen: tuple[int, int] | None = None

    def heard(self) -> None:
        self.last = time.monotonic()

    def left(self, now: float) -> float:
        """Seconds until the group counts as stalled."""
        if now - self.probed >= self.every:
            self.probed = now
            activity = group_activity(self.pgid)
            if self.seen is not None and activity != self.seen:
                self.last = now
            self.seen = activity
        return self.last + self.stall - now


def _free_bytes(folder: str | os.PathLike) -> int:
    info = os.statvfs(folder)
    return info.f_bavail * info.f_frsize


def fetch_floor(folder: str | os.PathLike) -> tuple[str, int]:
    """``keep_free`` for a fetch into the repository at ``folder``: it must leave
    :data:`FETCH_KEEPS_FREE` free on that disk, or half of what is free now when that is less
    (a nearly full disk still takes a small fetch)."""
    folder = os.fspath(folder)
    try:
        free = _free_bytes(folder)
    except OSError:
        free = 2 * FETCH_KEEPS_FREE
    return folder, min(FETCH_KEEPS_FREE, free // 2)


class DiskLow(GitError):
    """git was stopped because the disk it wrote to ran low (``keep_free``): not a fault of
    what was asked for, so a caller that takes a failed fetch for "not there" must not."""


class DiskFloor:
    """The bytes a call must leave free on the disk holding ``folder``."""

    def __init__(self, folder: str | os.PathLike, least: int) -> None:
        self.folder, self.least = os.fspath(folder), least
        self.probed = 0.0
        self.tripped = False

    def low(self, now: float) -> str | None:
        """Why the call must end (the disk is low), looked at every DISK_POLL seconds."""
        if now - self.probed < DISK_POLL:
            return None
        self.probed = now
        try:
            free = _free_bytes(self.folder)
        except OSError:
            return None
        if free >= self.least:
            return None
        self.tripped = True
        least = f"{self.least >> 20} MiB" if self.least >= 1 << 20 else f"{self.least} bytes"
        return (f"stopped: less than {least} left free on the disk holding {self.folder} "
                "(a remote sending far more than asked, or a disk too small for it)")
