"""Opening files that someone else controls: never block, never follow a symlink.

A FIFO in the spool folder would block ``open()`` until a writer appears (and the daemon then
ignores SIGTERM); a symlink would lead the daemon to read or write outside its folders. Both
are refused with an OSError before any byte is read.
"""

from __future__ import annotations

import errno
import os
import stat


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """``os.open`` with O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC that refuses anything but a
    regular file; returns the descriptor. Raises OSError (``ELOOP`` for a symlink).

    Example::

        fd = open_regular("spool/wal.log", os.O_RDONLY)
    """
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise OSError(errno.EINVAL, "not a regular file "
                          f"({_KINDS.get(stat.S_IFMT(kind), 'a special file')})", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


StatKey = tuple[int, int, int, int, int, int]   # mode, size, mtime_ns, ctime_ns, inode, device


def stat_key(st: os.stat_result) -> StatKey:
    """What changes whenever anyone writes or replaces a file: a rename gives a new inode, a
    write in place a new ctime (set by the kernel, not by the writer)."""
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}
