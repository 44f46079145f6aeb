"""The one way snapops opens a file it is given, and checks a path it is given.

Every path is untrusted. A FIFO would block ``open()`` until a writer appears (forever), a
character device (``/dev/zero``, ``/dev/urandom``) never ends, a socket or a folder is no
snapshot: :func:`open_regular` opens with ``O_NONBLOCK`` (so nothing blocks), checks with
``fstat`` that what it opened is a regular file, and only then clears ``O_NONBLOCK``.
:func:`open_input` is the readers' form (a binary file object, a typed one-line error);
:func:`user_path` turns a caller's path argument into a ``str`` or says, in one line, why
it cannot be one.

>>> import os
>>> os.mkfifo("pipe.wtxt")
>>> open_input("pipe.wtxt")
Traceback (most recent call last):
snapops.formats.errors.FormatError: pipe.wtxt: [io] not a regular file (a FIFO)
>>> user_path(42)
Traceback (most recent call last):
snapops.formats.errors.ConfigError: path: expected a str or os.PathLike, got int
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from .errors import ConfigError, DataError, FormatError

NAME_MAX = 255          # bytes of one path component (Linux, and what every filesystem takes)
PATH_MAX = 4095         # bytes of a whole path
SHOWN = 120             # characters of a hostile path shown in a message

KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder", stat.S_IFCHR: "a device",
         stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symlink"}


def kind_of(mode: int) -> str:
    """What a non-regular file is, for messages: ``a FIFO``, ``a folder``, ``a device``..."""
    return KINDS.get(stat.S_IFMT(mode), "a special file")


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o644, *,
                 follow: bool = False) -> int:
    """``os.open`` that never blocks and refuses anything but a regular file; returns the
    descriptor (``O_CLOEXEC``, blocking again). ``follow=False`` (the default, for folders
    someone else controls) also refuses a symlink (``ELOOP``); ``follow=True`` (a path a user
    named) follows one, to a regular file only. Raises OSError (``EINVAL`` "not a regular
    file (a FIFO)" for the wrong kind).

    Example::

        fd = open_regular("spool/wal.log", os.O_RDONLY)
    """
    flags |= os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags, mode)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise OSError(errno.EINVAL, f"not a regular file ({kind_of(kind)})",
                          os.fspath(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_beneath(root: str | os.PathLike, rel: str, flags: int = os.O_RDONLY) -> int:
    """``os.open`` of ``root/rel`` (``rel`` a validated relative path) without following a
    symlink anywhere below ``root``: each folder of ``rel`` is opened relative to the one
    before it with ``O_NOFOLLOW``, so a folder planted as a symlink (``snapshots/run1 -> /``)
    cannot take the read outside ``root``. The last component must be a regular file, as
    :func:`open_regular` checks. OSError ``ELOOP`` naming the symlinked component otherwise.
    """
    parts = rel.split("/")
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, part in enumerate(parts[:-1]):
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                                os.O_CLOEXEC, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, folder):
                    raise OSError(errno.ELOOP, "a folder on the path is a symlink (not "
                                  "followed)", "/".join(parts[:depth + 1])) from None
                raise
            os.close(folder)
            folder = inner
        fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    finally:
        os.close(folder)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise OSError(errno.EINVAL, f"not a regular file ({kind_of(kind)})", rel)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def symlinked_folder(root: str | os.PathLike, rel: str) -> str | None:
    """The first folder of ``rel`` (a validated relative path, itself included) that is a
    symlink below ``root``, or None."""
    parts = rel.split("/") if rel else []
    for depth in range(len(parts)):
        prefix = "/".join(parts[:depth + 1])
        try:
            if stat.S_ISLNK(os.lstat(os.path.join(root, prefix)).st_mode):
                return prefix
        except OSError:
            return None
    return None


def refuse_symlinked(root: str | os.PathLike, rel: str, *, last: bool = True) -> None:
    """DataError unless no component of ``rel`` (a relative path below ``root``; folders and,
    with ``last``, the file itself) is a symlink: a work tree checked out from a remote may
    hold one where snapops writes (``ledger -> /home/me``), and a write or a removal would
    then land outside ``root``."""
    link = symlinked_folder(root, rel if last else os.path.dirname(rel))
    if link is not None:
        raise DataError(f"{os.path.join(root, link)}: a symlink where snapops writes "
                        f"{rel}; refusing to write or delete through it (expected plain "
                        "folders and files, as snapops writes them)")


def _is_link(name: str, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=folder).st_mode)
    except OSError:
        return False


def open_input(path: str | os.PathLike, *, buffering: int = -1,
               follow: bool = True) -> BinaryIO:
    """``path`` opened for reading as a binary file, a regular file only (a symlink to one
    too, unless ``follow=False``); FormatError (check ``io``) naming the file otherwise:
    ``x.wtxt: [io] not a regular file (a FIFO)``, ``x.wtxt: [io] cannot read: No such file
    or directory``."""
    name = user_path(path)
    try:
        fd = open_regular(name, os.O_RDONLY, follow=follow)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ELOOP):   # a socket; a symlink not followed
            try:
                mode = (os.stat if follow else os.lstat)(name).st_mode
            except OSError:
                mode = stat.S_IFREG
            if not stat.S_ISREG(mode):
                exc = OSError(exc.errno, f"not a regular file ({kind_of(mode)})")
        raise read_error(name, exc) from None
    return os.fdopen(fd, "rb", buffering=buffering)


def read_small_text(path: str | os.PathLike, limit: int = 1 << 20, *,
                    follow: bool = False) -> str | None:
    """The UTF-8 text of a small file (a tree's ``.gitattributes``, a config, the daemon's
    status), read as any input: a regular file of at most ``limit`` bytes, never through a
    symlink unless ``follow`` (a cloned tree may plant one pointing anywhere). None when there
    is no such file; FormatError naming the file (and the byte, for bad UTF-8) otherwise."""
    name = user_path(path)
    if not os.path.lexists(name):
        return None
    try:
        with open_input(name, follow=follow) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise read_error(name, exc) from None
    if len(data) > limit:
        raise FormatError(f"larger than {limit} bytes", path=shown(name), check="io")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"not UTF-8 text (byte {exc.start})", path=shown(name),
                          offset=exc.start, check="io") from None


def read_error(path: str, exc: OSError) -> FormatError:
    """The one-line FormatError for an OSError met opening or reading ``path``."""
    why = exc.strerror or str(exc)
    message = why if why.startswith("not a regular file") else f"cannot read: {why}"
    return FormatError(message, path=shown(path), check="io")


def user_path(value: object, what: str = "path") -> str:
    """A caller's path argument as a ``str``: a ``str`` or an ``os.PathLike`` giving one,
    not empty, without NUL, encodable, within the system's name lengths. ConfigError naming
    ``what`` (or the path) otherwise, in one line.

    >>> user_path(b"x.wtxt")
    Traceback (most recent call last):
    snapops.formats.errors.ConfigError: path: expected a str or os.PathLike, got bytes
    """
    text = value
    if isinstance(value, os.PathLike):
        try:
            text = os.fspath(value)
        except Exception as exc:     # a hostile __fspath__
            raise ConfigError(f"{what}: its __fspath__ failed ({type(exc).__name__})") from None
    if not isinstance(text, str):
        raise ConfigError(f"{what}: expected a str or os.PathLike, got {type(text).__name__}")
    if not text:
        raise ConfigError(f"{what}: expected a file name, got an empty string")
    if "\0" in text:
        raise ConfigError(f"{shown(text)}: a {what} cannot hold a NUL byte")
    try:
        encoded = os.fsencode(text)
    except UnicodeEncodeError:
        raise ConfigError(f"{shown(text)}: a {what} must be encodable as a file name "
                          "(it holds a lone surrogate)") from None
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > NAME_MAX or len(encoded) > PATH_MAX:
        raise ConfigError(f"{shown(text)}: {what} too long (at most {NAME_MAX} bytes a name, "
                          f"{PATH_MAX} in all), got {len(encoded)} bytes")
    return text


def shown(path: str) -> str:
    """``path`` as a message shows it: as it is when it is short and printable, else its
    ``repr`` cut to a bounded length (so a message stays one line)."""
    if len(path) <= SHOWN and path.isprintable():
        return path
    text = repr(path)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def write_error(path: str, exc: OSError) -> DataError:
    """The one-line DataError for an OSError met writing ``path`` (its folder missing, a
    file where a folder should be, the disk full or read-only...)."""
    folder = os.path.dirname(path) or "."
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(folder):
        why = f"folder {shown(folder)} does not exist" if not os.path.lexists(folder) \
            else f"{shown(folder)} is not a folder"
    else:
        why = exc.strerror or str(exc)
        if exc.filename is not None and os.path.dirname(os.fsdecode(exc.filename)) != \
                os.path.dirname(path):     # not the target or its temp file: say which
            why += f" ({shown(os.fsdecode(exc.filename))})"
    return DataError(f"{shown(path)}: cannot write: {why}")
