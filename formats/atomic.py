"""Crash-safe file writing: temp file in the same folder, fsync, rename, fsync folder; and the
SHA-256 of what was written, computed on the way to the file."""

from __future__ import annotations

import contextlib
import hashlib
import io
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
    ...     _ = f.write(b"...")
    >>> Path("x.wtxt").read_bytes()
    b'...'
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    tmp = folder / f".{target.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
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


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> str:
    """Write ``data`` atomically; returns its SHA-256 (hex)."""
    with atomic_write(path, mode=mode) as handle:
        handle.write(data)
    return hashlib.sha256(data).hexdigest()


class DigestingFile:
    """A binary file wrapper that SHA-256s the bytes in file order as they are written.

    Sequential writers get the digest for free (no second read). With ``seekable=True`` a
    writer may go back and patch bytes it wrote (a header finished last); the digest then
    costs one read of the file at the end, from the page cache. ``seekable=False`` makes
    writers that can (WTXT) produce their bytes strictly in order.

    >>> with atomic_write_digest("x.bin") as f:
    ...     _ = f.write(b"abc")
    >>> f.size, f.hexdigest()[:16]
    (3, 'ba7816bf8f01cfea')
    """

    def __init__(self, raw: BinaryIO, *, seekable: bool = False) -> None:
        self._raw = raw
        self._sha = hashlib.sha256()
        self._seekable = seekable
        self._pos = self._hashed = 0
        self._patched = False
        self.size = 0
        self._digest: str | None = None

    def write(self, data) -> int:
        written = self._raw.write(data)
        if self._pos == self._hashed:
            self._sha.update(data)
            self._hashed += written
        else:
            self._patched = True
        self._pos += written
        self.size = max(self.size, self._pos)
        return written

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("seek")
        self._pos = self._raw.seek(offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return self._seekable

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def finish(self) -> str:
        """The digest of the file's bytes (called once the writer is done, file still open)."""
        if self._patched or self._hashed != self.size:
            self._raw.flush()
            self._sha = hashlib.sha256()
            fd = self._raw.fileno()
            for at in range(0, self.size, 8 << 20):
                self._sha.update(os.pread(fd, min(8 << 20, self.size - at), at))
        self._digest = self._sha.hexdigest()
        return self._digest

    def hexdigest(self) -> str:
        if self._digest is None:
            raise RuntimeError("hexdigest() before the file was finished")
        return self._digest


@contextlib.contextmanager
def atomic_write_digest(path: str | os.PathLike, *, seekable: bool = False,
                        mode: int = 0o644) -> Iterator[DigestingFile]:
    """``atomic_write`` yielding a :class:`DigestingFile`; ``f.hexdigest()`` and ``f.size``
    are set once the file is in place."""
    with atomic_write(path, mode=mode) as handle:
        digesting = DigestingFile(handle, seekable=seekable)
        yield digesting
        digesting.finish()


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
