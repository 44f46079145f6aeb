"""Crash-safe file writing: temp file in the same folder, fsync, rename, fsync folder."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


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
    tmp = folder / f".{target.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
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
    fsync_dir(folder)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    with atomic_write(path, mode=mode) as handle:
        handle.write(data)


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
