"""``.npz`` (numpy's zip of ``.npy`` members), read and written without pickle.

Written deterministically (members in byte-wise name order, stored, fixed timestamps) and in
file order, so the file's SHA-256 comes from the write itself. numpy has no bf16 or float8:
those arrays are stored as the unsigned integer of their width, and a ``snapops.json`` member
records the logical dtypes (and ``gen``/``ts``/``build`` and other metadata), so ``load``
restores them; ``np.load`` sees the raw integers and that member. Every member's CRC-32 is
checked on read (accidental corruption; it is no seal). Sizes are bounded before allocation.

>>> import ml_dtypes
>>> _ = FORMAT.save({"w": np.ones(3, ml_dtypes.bfloat16), "n": np.arange(2)}, "s.npz", gen=2)
>>> snap = FORMAT.load("s.npz")
>>> snap["w"].dtype.name, snap.meta["gen"], np.load("s.npz")["w"].dtype
('bfloat16', 2, dtype('uint16'))
"""

from __future__ import annotations

import json
import os
import tokenize
import zipfile
import zlib
from typing import Any, BinaryIO

import numpy as np

from .atomic import atomic_write_digest
from .contract import Capabilities, SnapshotFormat, VerifyOptions, WriteResult
from .dtypes import DTYPES
from .errors import DataError, FormatError, LimitError, TruncatedError
from .iosafe import open_input
from .limits import DEFAULT_LIMITS, DeclaredLimits, check_member, check_shape
from .model import ArrayMapping, Snapshot, little_endian, little_endian_dtype
from .report import Report

META_MEMBER = "snapops.json"
MAX_META = 1 << 20
MAX_HEADER = 1 << 16
# What zipfile and numpy raise on damaged archives: every reader of zip members catches
# these (NotImplementedError: a compression method or zip version a flipped bit invented;
# zlib.error: a damaged deflate stream; RuntimeError: an encrypted member).
ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, TypeError, SyntaxError,
              NotImplementedError, zipfile.LargeZipFile, zlib.error, RuntimeError)
# numpy's header parser (ast.literal_eval via tokenize) on hostile text
NPY_HEADER_ERRORS = ZIP_ERRORS + (tokenize.TokenError, RecursionError, MemoryError)
_EPOCH = (1980, 1, 1, 0, 0, 0)


class _OwnedZipFile(zipfile.ZipFile):
    """A ZipFile on a file it was handed and closes with itself."""

    def close(self) -> None:
        owned = self.fp
        try:
            super().close()
        finally:
            if owned is not None:
                owned.close()


def open_zip(path: str) -> zipfile.ZipFile:
    """``path`` as a zip archive read through ``open_input``: a regular file only (a FIFO
    would block, ``/dev/zero`` would be read without end while looking for the central
    directory); FormatError (``io``) otherwise, and for an archive with an encrypted member;
    the archive's own errors as zipfile raises them. Closing the archive closes the file."""
    handle = open_input(path)
    try:
        archive = _OwnedZipFile(handle)
    except BaseException:
        handle.close()
        raise
    try:
        _refuse_encrypted(archive, path)
        _check_directory(archive, path)
    except BaseException:
        archive.close()
        raise
    return archive


def _check_directory(archive: zipfile.ZipFile, path: str) -> None:
    """The central directory holds as many entries as its end record declares, each name
    once. zipfile checks neither: one flipped bit in an entry's comment length makes it read
    the entries after it as that comment, one in a name makes two members of one name, and
    the archive silently loses members (arrays, snapops.json)."""
    archive.fp.seek(0)
    end = zipfile._EndRecData(archive.fp)     # the reader zipfile itself used (zip64 too)
    declared = end[zipfile._ECD_ENTRIES_TOTAL] if end else None
    entries = archive.infolist()
    if declared != len(entries):
        raise FormatError("zip central directory does not hold the entries its end record "
                          "declares", path=path, check="structure",
                          expected=f"{declared} entries", got=len(entries))
    names: set[str] = set()
    for info in entries:
        if info.filename in names:
            raise FormatError("zip member name appears twice", path=path, check="structure",
                              expected="each name once", got=info.filename[:200])
        names.add(info.filename)


def first_member_name(head: bytes) -> str | None:
    """The name of the first member of a zip archive whose first bytes are ``head`` (None: not
    a zip's local header, or the name runs past ``head``). npz and torch's ``.pt`` are both zip
    archives: their first member (``x.npy``, ``<name>/data.pkl``) tells them apart."""
    if head[:4] != b"PK\x03\x04" or len(head) < 30:
        return None
    length = int.from_bytes(head[26:28], "little")
    name = head[30:30 + length]
    return name.decode("utf-8", "replace") if len(name) == length else None


def _refuse_encrypted(archive: zipfile.ZipFile, path: str) -> None:
    """No member may be encrypted: zipfile would raise a bare RuntimeError asking for a
    password the moment one is opened (npz, .pt and the review all open archives here)."""
    for info in archive.infolist():
        if info.flag_bits & 0x1:
            raise FormatError("encrypted zip member", path=path, check="structure",
                              expected="unencrypted members only", got=info.filename[:200])


class NpzArrays(ArrayMapping):
    """An open ``.npz``: member headers parsed; ``[name]`` reads one member (CRC checked)."""

    def __init__(self, path: str, limits: DeclaredLimits = DEFAULT_LIMITS) -> None:
        self.path, self.limits = path, limits
        try:
            self.zip = open_zip(path)
        except FormatError:
            raise
        except ZIP_ERRORS as exc:
            raise FormatError("not a readable .npz archive", path=path, got=str(exc)) from exc
        try:
            self.size = os.fstat(self.zip.fp.fileno()).st_size
            self.members = {i.filename[:-4]: i for i in self.zip.infolist()
                            if i.filename.endswith(".npy")}
            stray = next((i.filename for i in self.zip.infolist()
                          if not i.filename.endswith(".npy") and i.filename != META_MEMBER), None)
            if stray is not None:     # a torch .pt named .npz would read as "0 arrays, OK"
                raise FormatError("npz member that is neither an array (.npy) nor "
                                  f"{META_MEMBER}", path=path, check="structure",
                                  expected="NAME.npy members", got=stray[:200])
            self.names = sorted(self.members)
            self._specs: dict[str, tuple[np.dtype, tuple[int, ...], int, bool]] = {}
            self.meta = read_meta(self.zip, path)
        except BaseException:
            self.zip.close()
            raise

    def _read(self, info: zipfile.ZipInfo, limit: int, skip: int = 0) -> bytes:
        try:
            with self.zip.open(info) as member:
                member.read(skip)
                data = member.read(limit + 1)
        except ZIP_ERRORS as exc:
            raise FormatError("damaged member", path=self.path, array=info.filename,
                              check="crc32", expected="a member zipfile can read",
                              got=str(exc)) from exc
        return data

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        dtype, shape, _, _ = self._spec(name)
        return little_endian_dtype(dtype), shape

    def _spec(self, name: str) -> tuple[np.dtype, tuple[int, ...], int, bool]:
        if name not in self.members:
            raise FormatError("no such array", path=self.path, array=name)
        if name not in self._specs:
            self._specs[name] = self._parse_header(name)
        return self._specs[name]

    def _parse_header(self, name: str) -> tuple[np.dtype, tuple[int, ...], int, bool]:
        """dtype, shape, data offset and Fortran order of member ``name``, checked against
        the member's size before any data is read."""
        info = self.members[name]
        _check_declared(info, name, self.path, self.size, self.limits)
        try:
            with self.zip.open(info) as member:
                shape, fortran, dtype, offset = read_npy_header(member, self.path, name)
        except FormatError:      # a ValueError too: already names the member and the fault
            raise
        except ZIP_ERRORS as exc:
            raise FormatError("damaged member", path=self.path, array=name,
                              expected="a member zipfile can read", got=str(exc)) from exc
        if dtype.hasobject:
            raise FormatError("npz member needs pickle; refused", path=self.path, array=name,
                              got=str(dtype))
        nbytes = check_shape(name, shape, dtype.itemsize, available=info.file_size - offset,
                             limits=self.limits, path=self.path)
        if nbytes + offset != info.file_size:
            raise FormatError("member size disagrees with its .npy header", path=self.path,
                              array=name, expected=str(nbytes + offset), got=info.file_size)
        return dtype, tuple(shape), offset, bool(fortran)

    def array(self, name: str) -> np.ndarray:
        if name not in self.members:
            raise FormatError("no such array", path=self.path, array=name)
        dtype, shape, offset, fortran = self._spec(name)
        nbytes = self.members[name].file_size - offset
        data = self._read(self.members[name], nbytes, skip=offset)
        if len(data) != nbytes:
            raise TruncatedError(path=self.path, array=name, expected=f"{nbytes} bytes",
                                 got=len(data))
        # as every reader: C order, little-endian (numpy writes big-endian arrays as they are,
        # which torch cannot take)
        array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
        if fortran:     # np.savez of a transposed array: the same values, in C order
            array = array.copy(order="C")
        return little_endian(array)

    def close(self) -> None:
        self.zip.close()


def read_meta(archive: zipfile.ZipFile, path: str) -> dict:
    """The ``snapops.json`` member's object ({} without one), bounded by MAX_META."""
    info = next((i for i in archive.infolist() if i.filename == META_MEMBER), None)
    if info is None:
        return {}
    if info.file_size > MAX_META:
        raise LimitError(f"{META_MEMBER} too large", path=path, expected=f"<= {MAX_META} bytes",
                         got=info.file_size)
    try:
        with archive.open(info) as member:
            meta = json.loads(member.read(MAX_META + 1))
    except ZIP_ERRORS as exc:
        raise FormatError(f"{META_MEMBER} is not readable JSON", path=path,
                          got=str(exc)) from exc
    except RecursionError as exc:
        raise LimitError(f"{META_MEMBER} nests too deeply", path=path) from exc
    if not isinstance(meta, dict):
        raise FormatError(f"{META_MEMBER} must hold an object", path=path,
                          got=type(meta).__name__)
    return meta


def read_npy_header(member: BinaryIO, path: str, name: str
                    ) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Shape, Fortran order, dtype and data offset of the ``.npy`` stream ``member``, read
    by numpy's header parser under a size bound; any malformed header is a FormatError."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(member)
        reader = {(1, 0): fmt.read_array_header_1_0,
                  (2, 0): fmt.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f".npy version {version} (1.0 and 2.0 are read)")
        shape, fortran, dtype = reader(member, max_header_size=MAX_HEADER)
        return shape, fortran, dtype, member.tell()
    except NPY_HEADER_ERRORS as exc:
        raise FormatError(path=path, array=name,
                          expected="a member starting with a readable .npy header",
                          got=str(exc) or type(exc).__name__) from exc


def _check_declared(info: zipfile.ZipInfo, name: str, path: str, archive_size: int,
                    limits: DeclaredLimits) -> None:
    """A stored member holds what it stores; a compressed one may not claim more than
    ``limits`` allow (see :mod:`.limits`), checked before a byte is decompressed."""
    compressed = min(info.compress_size, archive_size)
    if info.compress_type == zipfile.ZIP_STORED and info.file_size > compressed:
        raise LimitError("stored member claims more bytes than it holds", path=path,
                         array=name, expected=f"<= {compressed}", got=info.file_size)
    check_member(name, declared=info.file_size, compressed=compressed, limits=limits,
                 path=path)


def write_npz(out: BinaryIO, snapshot: Snapshot) -> None:
    """Members in byte-wise name order, stored, with fixed timestamps (equal input, equal
    bytes); ``out`` may be unseekable (zip data descriptors)."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name in snapshot.sorted_names():
            info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
            array = little_endian(np.asarray(snapshot.arrays[name]))   # equal values, equal bytes
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array if array.flags.c_contiguous
                                          else array.copy(order="C"), allow_pickle=False)
        if snapshot.meta:
            archive.writestr(zipfile.ZipInfo(META_MEMBER, date_time=_EPOCH),
                             json.dumps(snapshot.meta, sort_keys=True).encode())


class Npz(SnapshotFormat):
    name = "npz"
    load_verifies = True     # every member's CRC-32 (its only integrity data) is checked on read
    title = "npz"
    suffixes = (".npz",)
    capabilities = Capabilities(
        native_dtypes=frozenset(n for n in DTYPES if n != "bf16" and not n.startswith("f8")),
        integrity=frozenset({"structure", "data"}))

    def sniff(self, head: bytes) -> bool:
        first = first_member_name(head)
        return first is not None and (first.endswith(".npy") or first == META_MEMBER)

    def _save(self, snapshot: Snapshot, path: str, options: Any) -> WriteResult:
        _json_meta(snapshot.meta)
        for name in snapshot.arrays:
            if "\x00" in name:     # zip cuts a member name at NUL: the array would vanish
                raise DataError(f"npz: array name {name!r} holds a NUL byte, which zip "
                                "member names cannot")
        with atomic_write_digest(path, stable=True) as out:
            write_npz(out, snapshot)
        return self.result(path, snapshot, out.size, out.hexdigest())

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        with NpzArrays(path, options.limits or DEFAULT_LIMITS) as archive:
            return Snapshot({n: archive[n] for n in archive.names}, dict(archive.meta))

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        archive = NpzArrays(path)
        return archive, dict(archive.meta)

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        def read_all() -> tuple[int, int]:
            snap = self._load(path, options)
            return len(snap), snap.nbytes

        return self.checked(path, read_all, ("structure", "crc32"),
                            "npz members carry a CRC-32 (accidental damage), no seal")

    def _inspect(self, path: str) -> dict:
        with NpzArrays(path) as archive:
            return {"file_size": archive.size, "meta": dict(archive.meta),
                    "header": {"members": len(archive.zip.infolist()),
                               "arrays": len(archive.names)},
                    "arrays": [{"name": n, "stored_bytes": archive.members[n].compress_size}
                               for n in archive.names]}


def _json_meta(meta: dict) -> None:
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DataError(f"npz: snapshot meta is not JSON-serialisable: {exc}") from None


FORMAT = Npz()
