"""A loose git blob stored without compression, copied out of the object store directly.

A snapops repository and a remote set up by ``snapops hooks install`` keep their loose objects
at zlib level 0 (``core.looseCompression 0``): such an object file is a zlib stream of *stored*
deflate blocks, i.e. ``blob <size>\\0`` and the content, cut into blocks of at most 64 KiB, each
behind a 5-byte header, then the Adler-32 of the whole. Reading those blocks into one buffer
and writing them out costs half of what ``git cat-file blob`` into the same file does (git
inflates them, computes Adler-32 with the system zlib and copies twice; the 1.4 GB of shards
of a 1 GiB WTXT generation: 1.05 CPU-s against 2.1), and the SHA-256 a MANIFEST seals is
computed on the way.

:func:`copy_stored_blob` takes this path only when everything about the file is what git
itself would read the same way: a regular file at ``objects/xx/yyyy...``, a zlib header without
preset dictionary, only stored blocks (each ``LEN``/``NLEN`` consistent, inside the file), a
``blob`` header whose size is the content's, at most one block per KiB on average, and the
Adler-32 git would check (zlib-ng's, 9 GB/s: the system zlib's runs at 2.5). Anything else
(a packed or deflated object, a symlink, a damaged stream) returns None with nothing written,
and the caller asks ``git cat-file``, which answers or fails as git does. Like ``cat-file``,
this does not rehash the object id: the SHA-256 a sealed MANIFEST lists for each shard is what
proves its bytes.

Example::

    with open("scratch/0000.wtxt", "xb") as out:
        copy_stored_blob(Path(".git/objects"), oid, out, size=40_881_691)
    # -> '9f86d08...' (its SHA-256; or None: ask git)
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from pathlib import Path
from typing import BinaryIO

from zlib_ng import zlib_ng

from snapops.formats._kernels import join_stored_blocks

__all__ = ["copy_stored_blob"]

_OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_WINDOW = 1 << 20                # bytes read at a time (a stored block is at most 64 KiB)
# git's loose writer emits blocks of 32 KiB and more; a stream of far smaller ones is not git's
_MIN_AVERAGE_BLOCK = 1024


def copy_stored_blob(objects: Path, oid: str, out: BinaryIO, *, size: int,
                     sha256: bool = True) -> str | None:
    """Write the content of blob ``oid`` (``size`` bytes, as the tree lists it) from the loose
    object under ``objects`` into ``out`` (an empty binary file opened for writing) and return
    the content's SHA-256 (hex), computed on the way (the copy is not read again to check it
    against a MANIFEST); ``sha256=False``: not computed, "" returned. None, with ``out`` left
    empty, when the object is not a loose blob stored without compression that reads back
    whole (see the module text): then ask git."""
    if not _OID.fullmatch(oid):
        return None
    try:
        fd = os.open(objects / oid[:2] / oid[2:], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _zlib_header(fd):
            return None
        out.flush()
        try:
            digest = _copy(fd, info.st_size, out.fileno(), size, sha256)
        except _Unreadable:    # git reads it again, and says what is wrong in its own words
            digest = None
        if digest is None:
            os.ftruncate(out.fileno(), 0)
            os.lseek(out.fileno(), 0, os.SEEK_SET)
        return digest
    finally:
        os.close(fd)


class _Unreadable(Exception):
    """The object file could not be read (an I/O error): a matter for git, not the copy."""


def _read_at(fd: int, into: bytearray | memoryview, pos: int) -> memoryview:
    """``into`` (a writable buffer) filled from ``pos`` as far as the file goes: its filled
    part."""
    try:
        got = os.preadv(fd, [into], pos)
    except OSError:
        raise _Unreadable from None
    return memoryview(into)[:got]


def _zlib_header(fd: int) -> bool:
    """The file starts a zlib stream of deflate data without a preset dictionary."""
    try:
        two = _read_at(fd, bytearray(2), 0)
    except _Unreadable:
        return False
    if len(two) != 2:
        return False
    cmf, flg = two
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and not flg & 0x20 and ((cmf << 8) | flg) % 31 == 0


def _copy(fd: int, file_size: int, out: int, size: int, sha256: bool) -> str | None:
    """Read the stored blocks of the object ``fd`` a window at a time (``pread`` into one
    buffer: no page faults on a map, which two threads copying at once would contend for),
    check them, and write their content after the ``blob <size>`` header to ``out``. None when
    anything is not as git writes it (``out`` may then hold a part: the caller empties it).

    Each window's block contents are joined at its front (``join_stored_blocks``, in C with
    the GIL released: the 5-byte block headers cut out), then checked, hashed and written in
    one call each. Block by block in Python, three copying threads waited for the GIL half
    the time."""
    header = b"blob %d\x00" % size
    expected, stream_end = len(header) + size, file_size - 4
    limit = stream_end // _MIN_AVERAGE_BLOCK + 8
    buf = bytearray(_WINDOW)
    view = memoryview(buf)
    checksum, digest = 1, hashlib.sha256() if sha256 else None
    pos, seen, blocks, final = 2, 0, 0, False
    while not final:
        got = len(_read_at(fd, view[:min(_WINDOW, stream_end - pos)], pos)) \
            if pos < stream_end else 0
        joined = join_stored_blocks(buf, got)
        if joined is None:
            return None
        at, filled, count, final = joined
        first = seen == 0
        seen += filled
        blocks += count
        if at == 0 or seen > expected or blocks > limit:
            return None                  # at 0: a block runs past the end of the object
        content = view[:filled]
        checksum = zlib_ng.adler32(content, checksum)
        if first:
            if content[:len(header)] != header:
                return None
            content = content[len(header):]
        if digest is not None:
            digest.update(content)
        _write_all(out, [content])
        pos += at
    trailer = _read_at(fd, bytearray(4), pos)   # 4 bytes unless the file shrank meanwhile
    if seen != expected or pos != stream_end or len(trailer) != 4 \
            or checksum != struct.unpack(">I", trailer)[0]:
        return None
    return digest.hexdigest() if digest is not None else ""


def _write_all(fd: int, views: list[memoryview]) -> None:
    """Every byte of ``views`` to ``fd`` (``writev`` may write less than asked)."""
    pending = [v for v in views if len(v)]
    while pending:
        done = os.writev(fd, pending)
        while pending and done >= len(pending[0]):
            done -= len(pending[0])
            pending.pop(0)
        if done:
            pending[0] = pending[0][done:]
