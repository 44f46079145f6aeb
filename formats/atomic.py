"""Crash-safe file writing: temp file in the same folder, fsync, rename, fsync folder; and the
SHA-256 of what was written, computed on the way to the file.

A temp file is ``.<target name>.<12 hex>.tmp`` and its writer holds an ``flock`` on it until
the rename, so a temp nobody holds belongs to a writer that died (SIGKILL, power loss): the
next atomic write of the same target removes such leftovers, and
:func:`remove_leftover_temps` sweeps a whole folder (the daemon does at start).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import functools
import hashlib
import io
import mmap
import os
import queue
import re
import secrets
import stat
import time
from concurrent.futures import Future
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from .iosafe import open_input
from .libc import libc_function
from .workers import give_back, lend_helper

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
                 before_replace: Callable[[Path], None] | None = None,
                 durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it replaces ``path`` atomically and durably.

    On any error the temp file is removed and ``path`` is untouched, so a reader never sees a
    half-written file. ``before_replace(temp_path)`` runs after the fsync and may raise to
    abort (e.g. to verify the content before it becomes visible). ``durable=False`` leaves out
    the fsyncs: still whole or absent for every reader, but not across a crash; only for
    files that go with their private folder when the process ends (a throw-away cache).

    >>> with atomic_write("x.wtxt") as f:
    ...     _ = f.write(b"...")
    >>> Path("x.wtxt").read_bytes()
    b'...'
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    remove_leftover_temps(folder, target=target.name)
    tmp = folder / f".{target.name}.{secrets.token_hex(6)}.tmp"
    # A signal handler (Ctrl-C) runs between any two calls, even as a call returns before its
    # result is stored: each step is covered so that an interrupt leaves no temp file behind.
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _naming(target, exc) from None
    except BaseException:  # interrupted as the open returned: the file is ours (O_EXCL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    owner = handle = None
    wrapping = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        owner = os.dup(fd)  # keeps the lock after the handle closes, until the rename
        wrapping = True
        handle = os.fdopen(fd, "wb", buffering=1 << 20)
        with handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        if before_replace is not None:
            before_replace(tmp)
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise _naming(target, exc) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if not wrapping:
            os.close(fd)
        # (a file object lost midway through fdopen closes fd when collected: never twice)
        elif handle is not None and not handle.closed:
            with contextlib.suppress(OSError):
                handle.close()
        raise
    finally:
        if owner is not None:
            os.close(owner)
    if durable:
        fsync_dir(folder)


def _naming(target: Path, exc: OSError) -> OSError:
    """``exc`` naming the file the caller asked for, not the temp file (a name nobody gave)."""
    return type(exc)(exc.errno, exc.strerror, os.fspath(target))


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> str:
    """Write ``data`` atomically; returns its SHA-256 (hex)."""
    with atomic_write(path, mode=mode) as handle:
        handle.write(data)
    return hashlib.sha256(data).hexdigest()


class DigestingFile:
    """A binary file wrapper that SHA-256s the bytes in file order as they are written.

    Sequential writers (``seekable=False``) get the digest without a second read: large pieces
    are hashed on a helper thread while they are copied to the file (hashlib and the write
    both release the GIL). By default ``write`` returns once its piece is hashed, so callers
    may reuse their buffer; with ``stable=True`` the caller promises not to change a buffer it
    wrote until the file is finished, and hashing runs behind the writes (at most
    ``BACKLOG`` bytes behind), overlapping the final fsync too. A writer that must go back and
    patch what it wrote (a header finished last) asks for ``seekable=True``: nothing is hashed
    on the way and ``finish`` reads the file once, from the page cache. ``seekable=False`` also
    makes writers that can (WTXT) produce their bytes strictly in order. ``writeback=True``
    (sequential writers of a durable file): see :class:`Writeback`.

    >>> with atomic_write_digest("x.bin") as f:
    ...     _ = f.write(b"abc")
    >>> f.size, f.hexdigest()[:16]
    (3, 'ba7816bf8f01cfea')
    """

    PARALLEL_MIN = 256 << 10       # smaller pieces are hashed inline (no handoff)
    BACKLOG = 256 << 20            # stable=True: bytes written but not hashed yet, at most

    def __init__(self, raw: BinaryIO, *, seekable: bool = False, stable: bool = False,
                 writeback: bool = False) -> None:
        self._raw = raw
        self._writeback = Writeback(raw.fileno(), flush=raw.flush) \
            if writeback and not seekable else None
        self._sha = hashlib.sha256()
        self._seekable, self._stable = seekable, stable
        self._pos = 0
        self._behind: _HashBehind | None = None
        self.size = 0
        self._digest: str | None = None
        self._readback = None

    def write(self, data) -> int:
        if self._seekable:
            written = self._raw.write(data)
        elif memoryview(data).nbytes < self.PARALLEL_MIN and not (
                self._behind is not None and self._behind.bytes):
            written = self._raw.write(data)
            self._sha.update(data)
        else:
            written = self._write_hashing(data)
        self._pos += written
        self.size = max(self.size, self._pos)
        if self._writeback is not None:
            self._writeback.up_to(self._pos)
        return written

    def _write_hashing(self, data) -> int:
        if self._behind is None:
            self._behind = _HashBehind(self._sha)
        self._behind.put(data)
        try:
            written = self._raw.write(data)
        finally:
            self._behind.catch_up(self.BACKLOG if self._stable else 0)
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

    def start_readback(self) -> None:
        """Seekable mode, the writer done: hash the file from the page cache on a helper
        thread, so the read overlaps the fsync that follows; ``finish`` waits for it."""
        self._raw.flush()
        self.size = os.fstat(self._raw.fileno()).st_size
        self._readback = TrailingDigest(self._raw.fileno(), self.size)
        self._readback.start()
        self._readback.advance(self.size)

    def finish(self) -> str:
        """The digest of the file's bytes, once the writer is done."""
        if self._behind is not None:
            self._behind.catch_up(0)
        digest = self._readback.future.result() if self._readback is not None \
            else self._sha.hexdigest()
        self.close()
        self._digest = digest
        return digest

    def close(self) -> None:
        """Wait for the hashing behind and give its helper back (also on errors: the file is
        being abandoned)."""
        if self._behind is not None:
            self._behind.stop()
            self._behind = None

    def hexdigest(self) -> str:
        if self._digest is None:
            raise RuntimeError("hexdigest() before the file was finished")
        return self._digest


# The digest helpers share no Python-level lock with the writer: see formats/workers.py.


class _HashBehind:
    """Hashes pieces into ``sha`` in the order given, on a helper thread; :meth:`catch_up`
    waits until at most ``allowed`` bytes are still to hash and raises what hashing raised."""

    _FLUSHED = "flushed"

    def __init__(self, sha) -> None:
        self._sha, self._helper = sha, lend_helper()
        self._done: queue.SimpleQueue = queue.SimpleQueue()    # None, or what update raised
        self._sizes: collections.deque[int] = collections.deque()
        self.bytes = 0                                          # handed over, not collected

    def _hash(self, piece) -> None:
        try:
            self._sha.update(piece)
        except BaseException as exc:            # handed to the writer, which raises it
            self._done.put(exc)
        else:
            self._done.put(None)

    def put(self, piece) -> None:
        nbytes = memoryview(piece).nbytes
        self._helper.calls.put(functools.partial(self._hash, piece))   # counted once queued
        self._sizes.append(nbytes)
        self.bytes += nbytes

    def catch_up(self, allowed: int) -> None:
        while self._sizes and (self.bytes > allowed or not self._done.empty()):
            failure = self._done.get()
            self.bytes -= self._sizes.popleft()
            if failure is not None:
                raise failure

    def stop(self) -> None:
        """Wait until the pieces handed over are hashed (the writer's buffers are then free;
        at most a backlog), failed or not, and give the helper back."""
        self._helper.calls.put(functools.partial(self._done.put, self._FLUSHED))
        while self._done.get() is not self._FLUSHED:
            pass
        self._sizes.clear()
        self.bytes = 0
        give_back(self._helper, now=True)


class TrailingDigest:
    """The SHA-256 of the first ``size`` bytes of a file that positional writers fill out of
    order, read back from the page cache (a read-only map: no copy) on a helper thread while
    they work: it starts at :meth:`start` (the writer's word that everything before its
    frontier is final, e.g. once a header computed last is in place) and follows
    :meth:`advance` (the end of the finished prefix); for a finished file, both at once. The
    file must already be ``size`` bytes long. ``future`` resolves to the hex digest; the thread
    keeps its own descriptor, so it may finish during the fsync.
    """

    STEP = 8 << 20      # bytes hashed per look at the frontier
    _START, _ABORT = "start", "abort"

    def __init__(self, fd: int, size: int) -> None:
        self._fd, self._size = os.dup(fd), size
        self._news: queue.SimpleQueue = queue.SimpleQueue()   # _START, _ABORT or a frontier
        self.future: Future = Future()
        helper = lend_helper()
        helper.calls.put(self._run)
        give_back(helper)

    def start(self) -> None:
        self._news.put(self._START)

    def advance(self, end: int) -> None:
        self._news.put(end)

    def abort(self) -> None:
        """The write failed: stop reading (``future`` then raises)."""
        self._news.put(self._ABORT)

    def _run(self) -> None:
        try:
            self.future.set_result(self._hash())
        except BaseException as exc:
            self.future.set_exception(exc)
        finally:
            os.close(self._fd)

    def _hash(self) -> str:
        sha, pos = hashlib.sha256(), 0
        if not self._size:
            return sha.hexdigest()
        started, frontier = False, 0
        with mmap.mmap(self._fd, self._size, access=mmap.ACCESS_READ) as whole, \
                memoryview(whole) as view:
            while pos < self._size:
                # wait while there is nothing to hash; then take all news without waiting
                while not self._news.empty() or not (started and frontier > pos):
                    news = self._news.get()
                    if news == self._ABORT:
                        raise RuntimeError("the write was abandoned before its digest")
                    started = started or news == self._START
                    frontier = news if isinstance(news, int) and news > frontier else frontier
                end = min(frontier, self._size, pos + self.STEP)
                sha.update(view[pos:end])
                pos = end
        return sha.hexdigest()


@contextlib.contextmanager
def atomic_write_digest(path: str | os.PathLike, *, seekable: bool = False,
                        stable: bool = False, mode: int = 0o644,
                        durable: bool = True) -> Iterator[DigestingFile]:
    """``atomic_write`` yielding a :class:`DigestingFile`; ``f.hexdigest()`` and ``f.size``
    are set once the file is in place (the hashing still behind finishes during the fsync).
    ``durable=False``: no fsyncs, as for :func:`atomic_write`."""
    digesting = None

    def finish(_tmp: Path) -> None:
        digesting.finish()

    try:
        with atomic_write(path, mode=mode, before_replace=finish, durable=durable) as handle:
            digesting = DigestingFile(handle, seekable=seekable, stable=stable,
                                      writeback=durable)
            yield digesting
            if seekable:
                digesting.start_readback()
    finally:
        if digesting is not None:
            digesting.close()


@contextlib.contextmanager
def mapped(source: str | os.PathLike | BinaryIO) -> Iterator[bytes | memoryview]:
    """The bytes of a file (a path, or an open binary file such as an unlinked temp file)
    without a copy: a read-only map (an empty file cannot be mapped: ``b""``). No view of it
    may outlive the block.

    Example::

        with mapped("shard.aero") as data:
            head = bytes(data[:8])
    """
    with (open_input(source) if isinstance(source, (str, os.PathLike))
          else contextlib.nullcontext(source)) as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as whole:
            view = memoryview(whole)
            try:
                yield view
            finally:
                view.release()


def remove_leftover_temps(folder: str | os.PathLike, *, target: str | None = None,
                          recursive: bool = False) -> list[Path]:
    """Remove the temp files that killed writers left in ``folder`` (of ``target`` only, if
    given; in sub-folders too with ``recursive``, never inside ``.git``); returns them.

    A temp is removed only if it is a regular file, a few seconds old and no writer holds
    its lock. Errors are ignored: this is housekeeping, never a reason to fail a write.

    Example::

        remove_leftover_temps("spool")
        # -> [PosixPath('spool/.gen-000000000007.spool.3f2a9c1b0d4e.tmp')]
    """
    removed = []
    try:
        with os.scandir(folder) as listing:   # closed even when a signal ends the listing
            entries = list(listing)
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
    fn = libc_function("sync_file_range", (ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                           ctypes.c_uint))
    if fn is None:
        return None

    def start(fd: int, offset: int, length: int) -> None:
        fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE

    return start


class Writeback:
    """Asks the kernel to start writing a file's finished prefix to disk every ``STEP`` bytes
    (from ``base``), so the final fsync has little left to wait for; ``flush`` (a buffered
    file's) runs first. Advisory: nothing happens where sync_file_range does not exist."""

    STEP = 16 << 20

    def __init__(self, fd: int, base: int = 0, flush: Callable[[], None] | None = None) -> None:
        self._fd, self._base, self._flush = fd, base, flush
        self._start = writeback_starter()
        self._done = 0

    def up_to(self, end: int) -> None:
        """The first ``end`` bytes after ``base`` are written."""
        if self._start is None or end - self._done < self.STEP:
            return
        if self._flush is not None:
            self._flush()
        self._start(self._fd, self._base + self._done, end - self._done)
        self._done = end
