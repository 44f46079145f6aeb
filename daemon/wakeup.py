"""How the daemon sleeps: a wake-up pipe, and a watch that rings it only when the WAL changes.

An idle daemon blocks in one ``select()`` until something can be new: a record appended to the
WAL (by a training process, or by the daemon itself), a push queue change, a signal, a due
retry or the long safety interval. The watch asks the kernel (inotify, through watchdog) only
for writes, creations and renames, and keeps those that name the WAL: the daemon reading the
WAL or the spool, or writing its status file, wakes nothing.

Example::

    waker = Waker()
    observer = watch_file(spool_dir, "wal.log", waker.set)
    waker.wait(60.0)      # True when rung, False after 60 s
    # -> True
"""

from __future__ import annotations

import contextlib
import os
import select
from pathlib import Path
from typing import Callable

__all__ = ["Waker", "watch_file"]


class Waker:
    """A set/wait flag on a pipe: :meth:`set` is one ``write()``, safe from any thread and
    from a signal handler (no lock to deadlock on); :meth:`wait` sleeps in ``select()``."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        if self._write < 0:
            return  # closed: never write into a descriptor number reused since
        with contextlib.suppress(BlockingIOError, OSError):  # full: it is rung already
            os.write(self._write, b"!")

    def wait(self, timeout: float | None) -> bool:
        """Sleep until rung (True, and the flag is cleared) or ``timeout`` seconds pass."""
        ready, _, _ = select.select([self._read], [], [], timeout)
        if ready:
            self.clear()
        return bool(ready)

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        fds, self._read, self._write = (self._read, self._write), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def watch_file(folder: str | os.PathLike, name: str, ring: Callable[[], None]):
    """A started watchdog observer calling ``ring()`` when ``folder/name`` is written,
    created or renamed into place; stop it with ``observer.stop(); observer.join()``."""
    from watchdog.events import (
        FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileSystemEventHandler,
    )
    from watchdog.observers import Observer

    class Ring(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            paths = (event.src_path, getattr(event, "dest_path", "") or "")
            if any(Path(os.fsdecode(p)).name == name for p in paths if p):
                ring()

    observer = Observer()
    observer.schedule(Ring(), os.fspath(folder), recursive=False,
                      event_filter=[FileModifiedEvent, FileCreatedEvent, FileMovedEvent])
    observer.daemon = True
    observer.start()
    return observer
