"""One daemon per state folder and per spool folder: an exclusive ``flock`` on a
``daemon.lock`` in each. Two daemons on one spool would both commit each generation and write
conflicting records into the shared WAL; two on one state folder would share a push queue.
The lock files hold the owner's pid, for humans only."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from snapops.formats.errors import SnapopsError

LOCK_NAME = "daemon.lock"


class DaemonLocked(SnapopsError):
    """Another daemon already serves this state folder or this spool folder."""


def lock_folders(state_dir: Path, spool_dir: Path) -> list[int]:
    """Hold both locks (one when the spool folder is the state folder); DaemonLocked naming
    the folder another daemon holds. Their descriptors: close them to release."""
    held = [_lock(state_dir, f"another snapops daemon holds {state_dir}/{LOCK_NAME}")]
    try:
        spool = _open(spool_dir)
        mine, theirs = os.fstat(held[0]), os.fstat(spool)
        if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
            os.close(spool)
            return held
        os.close(spool)
        held.append(_lock(spool_dir, f"another snapops daemon serves the spool {spool_dir} "
                                     f"(it holds {spool_dir}/{LOCK_NAME})"))
    except BaseException:
        release(held)
        raise
    return held


def release(held: list[int]) -> None:
    for fd in reversed(held):
        os.close(fd)


def _lock(folder: Path, taken: str) -> int:
    fd = _open(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DaemonLocked(taken) from None
    try:  # for humans only: a full disk must not fail the lock
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    return fd


def _open(folder: Path) -> int:
    path = folder / LOCK_NAME
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise DaemonLocked(f"cannot open the daemon lock {path}: {exc.strerror or exc}") from exc
