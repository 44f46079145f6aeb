"""Streaming access to the arrays of an ``.npz`` for review, bounded before anything is read.

``snapops textconv`` runs on untrusted pull-request content, so every size a member declares
is checked before a byte is decompressed: the zip directory's uncompressed size against an
absolute bound and an expansion ratio (``snapops.formats.limits``), the npy header (at most
64 KiB, read by ``snapops.formats.npz.read_npy_header``; no pickled dtypes) and its shape,
whose bytes must tile the member exactly.
Elements are then streamed in the order review asks for them, through a look-back window of
a few MiB (two worker threads may ask for neighbouring blocks out of order), so a diff holds
a bounded amount of memory whatever the member's size.
"""

from __future__ import annotations

import collections
import os
import threading
import zipfile

import numpy as np

from snapops.formats.errors import FormatError
from snapops.formats.limits import DEFAULT_LIMITS, DeclaredLimits, check_declared, check_member
from snapops.formats.npz import META_MEMBER, ZIP_ERRORS, open_zip, read_npy_header

READ_BYTES = 1 << 20
KEEP_BYTES = 16 << 20            # look-back window per member


def npz_members(path: str, limits: DeclaredLimits = DEFAULT_LIMITS
                ) -> tuple[zipfile.ZipFile, dict[str, "NpzMember"]]:
    """The open archive and its arrays by name (member name without ``.npy``)."""
    try:
        archive = open_zip(path)    # a regular file only (never a FIFO, never /dev/zero)
    except FormatError:
        raise
    except ZIP_ERRORS as exc:
        raise FormatError(path=path, expected="a readable .npz (zip) archive",
                          got=str(exc)) from exc
    try:
        size = os.fstat(archive.fp.fileno()).st_size
        members = {}
        for info in archive.infolist():
            if info.filename == META_MEMBER:        # snapops' metadata: see read_meta
                continue
            if not info.filename.endswith(".npy"):
                raise FormatError(path=path, expected="only .npy members", got=info.filename)
            member = NpzMember(archive, info, path, size, limits)
            members[member.name] = member
    except BaseException:
        archive.close()
        raise
    return archive, members


class NpzMember:
    """One ``.npy`` member: ``dtype`` (native byte order), ``shape`` and ``read(start, stop)``
    of elements in C order."""

    def __init__(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str,
                 archive_size: int, limits: DeclaredLimits) -> None:
        self.archive, self.info, self.path = archive, info, path
        self.name = info.filename[:-len(".npy")]
        check_member(self.name, declared=info.file_size,
                     compressed=min(info.compress_size, archive_size), limits=limits, path=path)
        shape, fortran, dtype, self.header_len = self._header()
        if dtype.hasobject:
            raise FormatError("npz member needs pickle (object array); refused", path=path,
                              array=self.name)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        check_declared(self.name, nbytes, limits, path)
        if nbytes != info.file_size - self.header_len:
            raise FormatError(path=path, array=self.name, expected=f"{nbytes} bytes of data "
                              f"for shape {shape} {dtype}", got=info.file_size - self.header_len)
        if fortran and len(shape) > 1:
            raise FormatError("Fortran-ordered npz members are not supported by review",
                              path=path, array=self.name)
        self.file_dtype, self.shape = dtype, tuple(int(d) for d in shape)
        self.dtype = dtype.newbyteorder("=")
        self._lock = threading.Lock()
        self._stream = None
        self._blocks: collections.deque = collections.deque()   # (offset, bytes), kept
        self._base = self._end = 0

    def _header(self):
        try:
            with self.archive.open(self.info) as f:
                return read_npy_header(f, self.path, self.name)
        except FormatError:      # a ValueError too: already names the member and the fault
            raise
        except ZIP_ERRORS as exc:
            raise FormatError(path=self.path, array=self.name,
                              expected="a member starting with a readable .npy header",
                              got=str(exc)) from exc

    def read(self, start: int, stop: int) -> np.ndarray:
        size = self.dtype.itemsize
        with self._lock:
            raw = self._bytes(start * size, stop * size)
        return np.frombuffer(raw, self.file_dtype).astype(self.dtype, copy=False)

    def _bytes(self, lo: int, hi: int) -> bytes:
        if lo < self._base or self._stream is None:
            self._restart()
        while self._end < hi:
            self._advance(lo)
        parts = [data[max(lo - at, 0):hi - at] for at, data in self._blocks
                 if at < hi and at + len(data) > lo]
        return b"".join(parts)

    def _restart(self) -> None:
        self.release()
        try:
            self._stream = self.archive.open(self.info)
            self._stream.read(self.header_len)
        except ZIP_ERRORS as exc:
            raise self._unreadable(exc) from exc

    def _advance(self, wanted_from: int) -> None:
        try:
            data = self._stream.read(READ_BYTES)
        except ZIP_ERRORS as exc:
            raise self._unreadable(exc) from exc
        if not data:
            raise self._unreadable(EOFError(f"member ends after {self._end} data bytes"))
        self._blocks.append((self._end, data))
        self._end += len(data)
        while self._blocks and self._end - self._blocks[0][0] > KEEP_BYTES and \
                self._blocks[0][0] + len(self._blocks[0][1]) <= wanted_from:
            at, dropped = self._blocks.popleft()
            self._base = at + len(dropped)

    def _unreadable(self, exc: BaseException) -> FormatError:
        return FormatError(path=self.path, array=self.name, expected="readable member data",
                           got=str(exc))

    def release(self) -> None:
        """Drop the stream and the window (the next read starts over)."""
        if self._stream is not None:
            self._stream.close()
        self._stream = None
        self._blocks.clear()
        self._base = self._end = 0
