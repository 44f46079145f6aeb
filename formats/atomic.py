"""Crash-safe file writing: temp file in the same folder, fsync, rename, fsync folder.

A temp file is ``.<target name>.<12 hex>.tmp`` and its writer holds an ``flock`` on it until
the rename, so a temp nobody holds belongs to a writer that died (SIGKILL, power loss): the
next atomic write of the same target removes such leftovers, and
:func:`remove_leftover_temps` sweeps a whole folder (the daemon does at start).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

_TEMP = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{12}\.tmp")
# a temp this fresh may be between its creation and its writer's flock: never touched
_MIN_LEFTOVER_AGE = 2.0


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, mode: int = 0o644,
                 before_replace: Callable[[Path], None] | None = None) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it replaces ``path`` atomically and durably.

    On any error the temp file is removed and ``path`` is untouched, so a reader never sees a
    half-written file. ``before_replace(temp_path)`` runs after the fsync and may raise to
    abort (e.g. to verify the content before it becomes visible).

    >>> with atomic_write("x.wtxt") as f:
    ...     f.write(b"...")
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    remove_leftover_temps(folder, target=target.name)
    tmp = folder / f".{target.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    fcntl.flock(fd, fcntl.LOCK_EX)
    owner = os.dup(fd)  # keeps the lock after the handle closes, until the rename
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(owner)
    fsync_dir(folder)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    with atomic_write(path, mode=mode) as handle:
        handle.write(data)


def remove_leftover_temps(folder: str | os.PathLike, *, target: str | None = None,
                          recursive: bool = False) -> list[Path]:
    """Remove the temp files that killed writers left in ``folder`` (of ``target`` only, if
    given; in sub-folders too with ``recursive``, never inside ``.git``); returns them.

    A temp is removed only if it is a regular file, a few seconds old and no writer holds
    its lock. Errors are ignored: this is housekeeping, never a reason to fail a write.

    >>> remove_leftover_temps("spool")
    [PosixPath('spool/.gen-000000000007.spool.3f2a9c1b0d4e.tmp')]
    """
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if recursive and entry.name != ".git" and entry.is_dir(follow_symlinks=False):
            removed += remove_leftover_temps(entry.path, target=target, recursive=True)
            continue
        m = _TEMP.fullmatch(entry.name)
        if m and (target is None or m.group("target") == target) and _remove_if_orphan(entry):
            removed.append(Path(entry.path))
    return removed


def _remove_if_orphan(entry: os.DirEntry) -> bool:
    try:
        info = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or time.time() - info.st_mtime < _MIN_LEFTOVER_AGE:
            return False
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its writer is alive
        if os.fstat(fd).st_ino != info.st_ino:
            return False
        os.unlink(entry.path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def writeback_starter() -> Callable[[int, int, int], None] | None:
    """``start(fd, offset, length)``: ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` on Linux, which
    starts writing back what was written so the final fsync has little left to wait for;
    None where the call does not exist. Advisory: a failure only means less overlap."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def start(fd: int, offset: int, length: int) -> None:
        fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE

    return start
