"""Opening files that someone else controls: never block, never follow a symlink.

A FIFO in the spool folder would block ``open()`` until a writer appears (and the daemon then
ignores SIGTERM); a symlink would lead the daemon to read or write outside its folders. Both
are refused with an OSError before any byte is read.
"""

from __future__ import annotations

import os

# the one opener of files someone else controls lives with the readers' (formats/iosafe.py)
from snapops.formats.iosafe import open_regular  # noqa: F401

StatKey = tuple[int, int, int, int, int, int]   # mode, size, mtime_ns, ctime_ns, inode, device


def stat_key(st: os.stat_result) -> StatKey:
    """What changes whenever anyone writes or replaces a file: a rename gives a new inode, a
    write in place a new ctime (set by the kernel, not by the writer)."""
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
