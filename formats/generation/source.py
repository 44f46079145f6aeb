"""Where a generation's files come from: a folder on disk, or a commit's tree in a git repository.

Both sources answer the same questions: which entries lie under a folder (with their kind and
size, read without opening anything), the bytes of a small file (bounded), and a regular file on
disk holding exactly a given entry's bytes (for verifiers and readers that map files). Every
path is untrusted: :func:`safe_relpath` rejects absolute paths, ``..``, ``.git`` components and
anything that is not a plain relative POSIX path before a single byte is read or written, and a
git source materialises blobs only inside its scratch folder, only after checking their size.

Example::

    src = FolderSource("repo")
    sorted(src.entries("snapshots/run1"))
    # -> ['snapshots/run1/MANIFEST', 'snapshots/run1/shards/0000.wtxt']
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Protocol

from snapops.formats.atomic import mapped
from snapops.formats.errors import FormatError, LimitError
from snapops.formats.integrity import git_blob_id
from snapops.formats.iosafe import open_beneath, symlinked_folder
from snapops.formats.gitcmd import tree_records

DEFAULT_MAX_BLOB = 4 << 30
READ_BLOCK = 1 << 20
KEEP_READ_MAX = 1 << 20   # small files a git source keeps once read (MANIFEST, ledger)
# files at most this large (LFS pointers, WSUMs, a MANIFEST) are read with their folder's
# listing, all in one git process, up to PREREAD_MAX bytes: a restore of an LFS-store
# generation from its tag started a git process per pointer
PREREAD_FILE = 64 << 10
PREREAD_MAX = 1 << 20
FILE, SYMLINK, GITLINK, OTHER = "file", "symlink", "gitlink", "other"


def safe_relpath(path: str) -> str:
    """``path`` if it is a plain relative POSIX path inside its root; FormatError otherwise."""
    parts = path.split("/")
    bad = next((p for p in parts if p in ("", ".", "..") or "\\" in p or "\0" in p
                or p.lower().rstrip(". ") in (".git", "git~1")), None)
    if not path or bad is not None:
        shown = path if len(path) <= 160 else f"{path[:80]}...{path[-77:]}"
        raise FormatError("unsafe path in the tree", path=shown, check="path",
                          expected="a relative path without '', '.', '..' or .git components",
                          got=repr(bad if bad is not None else path))
    return path


@dataclass(frozen=True)
class Entry:
    path: str               # relative to the repository root
    kind: str               # file | symlink | gitlink | other
    size: int | None = None
    oid: str | None = None  # git blob id (git sources)


class Source(Protocol):
    """Optional attributes the verifier reads: ``resolves_lfs`` (the LFS store's shards come
    as their rebuilt files) and ``shards_at_once`` (at most this many shards handed out at
    once: a source that rebuilds each on helpers of its own)."""

    label: str

    def entries(self, folder: str) -> dict[str, Entry]: ...

    def read(self, path: str, limit: int) -> bytes: ...

    # digest=False: the caller will not ask for this copy's SHA-256 (a source that computes
    # it while copying, see GitTreeSource.hashed, may skip that)
    def file(self, path: str, *, digest: bool = True
             ) -> contextlib.AbstractContextManager[Path]: ...


class FolderSource:
    """A work tree (or any folder) on disk. Symlinks are reported, never followed."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.label = f"folder {self.root}"

    def entries(self, folder: str) -> dict[str, Entry]:
        base = self.root / safe_relpath(folder)
        found: dict[str, Entry] = {}
        if not base.is_dir() or symlinked_folder(self.root, folder) is not None:
            return found
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
                rel = f"{rel_dir}/{name}"
                info = os.lstat(self.root / rel)
                kind = FILE if stat.S_ISREG(info.st_mode) else \
                    SYMLINK if stat.S_ISLNK(info.st_mode) else OTHER
                found[rel] = Entry(rel, kind, info.st_size if kind == FILE else None)
        return found

    def _open(self, path: str, missing_ok: bool = False) -> int:
        """A descriptor of the regular file at ``path``, reached without following any
        symlink under the root (a symlinked folder would take the read anywhere); never
        blocks (a FIFO is refused). ``missing_ok``: FileNotFoundError passes through."""
        try:
            return open_beneath(self.root, safe_relpath(path))
        except FileNotFoundError:
            if missing_ok:
                raise
            raise FormatError("cannot open: No such file or directory", path=path,
                              check="io") from None
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise FormatError(exc.strerror, path=path, check="fileset") from None
            folder = exc.filename if isinstance(exc.filename, str) else ""
            if exc.errno == errno.ELOOP and path.startswith(folder + "/"):
                raise FormatError(f"{folder} is a symlink (not followed)", path=path,
                                  check="fileset", expected="a folder", got="a symlink") from None
            if exc.errno == errno.ELOOP:
                raise FormatError("not a regular file (a symlink, not followed)", path=path,
                                  check="fileset") from None
            raise FormatError(f"cannot open: {exc.strerror}", path=path, check="io") from None

    def read(self, path: str, limit: int) -> bytes:
        return self._read(self._open(path), path, limit)

    def read_present(self, path: str, limit: int) -> bytes | None:
        """``read``, or None when there is no file at ``path`` (its folders may be missing
        too; a symlink or a special file is still an error)."""
        try:
            fd = self._open(path, missing_ok=True)
        except FileNotFoundError:
            return None
        return self._read(fd, path, limit)

    def open(self, path: str) -> BinaryIO:
        """The regular file at ``path`` as a binary file object (see ``_open``)."""
        return os.fdopen(self._open(path), "rb")

    def _read(self, fd: int, path: str, limit: int) -> bytes:
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise LimitError(path=path, expected=f"at most {limit} bytes",
                                 got=f"{size} bytes")
            return _read_all(fd, size)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def file(self, path: str, *, digest: bool = True) -> Iterator[Path]:
        os.close(self._open(path))  # regular file, not a symlink
        yield self.root / path


def _read_all(fd: int, size: int) -> bytes:
    parts, left = [], size
    while left > 0 and (block := os.read(fd, min(left, READ_BLOCK))):
        parts.append(block)
        left -= len(block)
    return b"".join(parts)


def entry_kind(mode: str) -> str:
    """The kind of a git tree entry from its mode (``160000`` is a submodule's commit)."""
    return {"100644": FILE, "100755": FILE, "120000": SYMLINK, "160000": GITLINK}.get(mode, OTHER)


class GitTreeSource:
    """A commit's tree in a repository, read with git plumbing through ``git`` (an object with
    ``run(*args) -> bytes``, ``listing(*args) -> bytes`` (bounded) and ``open_blob(oid)``,
    e.g. :class:`snapops.hooks.gitio.Git`).
    Blobs are materialised under ``scratch`` (which must exist and be private) only after their
    path was validated and their size checked against ``max_blob``. ``keep``: a materialised
    blob stays in ``scratch`` until the caller removes it, and later reads of that path use
    it (restore verifies a shard, then loads the same copy: one read from git)."""

    def __init__(self, git, commit: str, scratch: str | os.PathLike, *,
                 max_blob: int = DEFAULT_MAX_BLOB, label: str | None = None,
                 worktree: str | os.PathLike | None = None, keep: bool = False) -> None:
        self.git, self.commit = git, commit
        self.scratch = Path(scratch).resolve()
        self.max_blob = max_blob
        self.label = label or f"commit {commit[:12]}"
        self.worktree = Path(worktree) if worktree is not None else None
        self._entries: dict[str, Entry] = {}
        self._kept: dict[str, Path] | None = {} if keep else None
        self._read: dict[str, bytes] = {}   # a commit's tree never changes: read once
        self._listed: dict[str, dict[str, Entry]] = {}
        self._digests: dict[Path, str] = {}  # SHA-256 of copies hashed while copied out

    @classmethod
    def staged(cls, git, scratch: str | os.PathLike, *, max_blob: int = DEFAULT_MAX_BLOB,
               worktree: str | os.PathLike | None = None) -> "GitTreeSource":
        """What ``git commit`` is about to record: the index written as a tree object (the
        blobs are already in the object store; ``write-tree`` adds only trees). ``worktree``:
        a work-tree file that hashes to the staged blob id is read in place instead of
        inflating the blob (a local check: the file could change while it is read; the
        receiving side verifies the pushed blobs themselves)."""
        tree = git.run("write-tree").decode("ascii", "replace").strip()
        return cls(git, tree, scratch, max_blob=max_blob, label="the index", worktree=worktree)

    def entries(self, folder: str) -> dict[str, Entry]:
        """Every entry under ``folder`` with its kind and size (one ``ls-tree``, once per
        folder), its small files read with it (``PREREAD_FILE``); a path that is not
        :func:`safe_relpath` (a crafted tree with ``..`` entries) fails here."""
        spec = f"{safe_relpath(folder)}/"
        if spec not in self._listed:
            out = self.git.listing("ls-tree", "-r", "-l", "-z", "--full-tree", self.commit,
                                   "--", f":(literal){spec}")
            found = {}
            for record in tree_records(out):
                rel = safe_relpath(record.path)
                found[rel] = Entry(rel, entry_kind(record.mode), record.size, record.oid)
            self._entries.update(found)
            self._preread(found.values())
            self._listed[spec] = found
        return dict(self._listed[spec])

    def _preread(self, entries) -> None:
        small = [e for e in entries if e.kind == FILE and e.size is not None
                 and e.size <= min(PREREAD_FILE, self.max_blob) and e.path not in self._read]
        if not small or not hasattr(self.git, "small_blobs"):
            return
        found = self.git.small_blobs(list(dict.fromkeys(e.oid for e in small)), PREREAD_MAX)
        for entry in small:
            data = found.get(entry.oid)
            if data is not None and len(data) == entry.size:
                self._read[entry.path] = data

    def _blob(self, path: str) -> Entry:
        safe_relpath(path)
        entry = self._entries.get(path)
        if entry is None:
            folder = path.rsplit("/", 1)[0] if "/" in path else ""
            entry = self.entries(folder).get(path) if folder else None
        if entry is None:
            raise FormatError("no such file in the tree", path=path, check="fileset",
                              expected=f"a file in {self.label}", got="nothing")
        if entry.kind != FILE:
            raise FormatError(f"not a regular file ({entry.kind})", path=path, check="fileset")
        if entry.size is not None and entry.size > self.max_blob:
            raise LimitError("blob larger than the configured limit (snapops.maxBlobSize)",
                             path=path, expected=f"at most {self.max_blob} bytes",
                             got=f"{entry.size} bytes")
        return entry

    def read(self, path: str, limit: int) -> bytes:
        """The bytes of a small file (at most ``limit``); files up to ``KEEP_READ_MAX`` are
        read from git once (a restore reads the MANIFEST in three places)."""
        data = self._read.get(path)
        if data is None:
            entry = self._blob(path)          # lists the folder: its small files are read
            if entry.size is not None and entry.size > limit:
                raise LimitError(path=path, expected=f"at most {limit} bytes",
                                 got=f"{entry.size} bytes")
            data = self._read.get(path)
        if data is None:
            with self.git.open_blob(entry.oid) as stream:
                data = stream.read(limit + 1)
            if len(data) <= min(limit, KEEP_READ_MAX):
                self._read[path] = data
        if len(data) > limit:
            raise LimitError(path=path, expected=f"at most {limit} bytes", got="more")
        return data

    @contextlib.contextmanager
    def file(self, path: str, *, digest: bool = True) -> Iterator[Path]:
        """``path`` materialised under the scratch folder (or the kept copy, or the work-tree
        file holding the same blob); ``digest``: compute its SHA-256 while copying, for
        :meth:`hashed`."""
        entry = self._blob(path)
        if self.worktree is not None and _holds_blob(self.worktree / path, entry):
            yield self.worktree / path
            return
        if self._kept is not None and path in self._kept:
            yield self._kept[path]
            return
        target = (self.scratch / path).resolve()
        if not target.is_relative_to(self.scratch):
            raise FormatError("path leaves the scratch folder", path=path, check="path")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            out = open(target, "xb")
        except FileExistsError:  # never clobber (nor later remove) another reader's copy
            raise FormatError("the same file materialised twice", path=path,
                              check="path") from None
        try:
            try:
                with out:
                    self._materialise(entry, out, target, digest)
            except OSError as exc:  # a full scratch disk, say: typed, one line
                raise FormatError(f"cannot write to the scratch folder: {exc.strerror}",
                                  path=path, check="io") from None
            if self._kept is not None:
                self._kept[path] = target
            yield target
        finally:
            if self._kept is None or path not in self._kept:
                self._digests.pop(target, None)
                target.unlink(missing_ok=True)

    def hashed(self, local: str | os.PathLike) -> str | None:
        """The SHA-256 of a copy this source made, when it was computed while copying (a blob
        copied straight out of the object store): the verifier need not read it again."""
        return self._digests.get(Path(local))

    def release(self, path: str) -> None:
        """Remove the kept copy of ``path`` (its reader is done with it): a restore frees
        each shard's pages as it goes instead of all at once at the end (unlinking 356 MiB
        took 40-50 ms of a 256 MiB restore's 0.6 s). Arrays still mapping it stay valid."""
        target = self._kept.pop(path, None) if self._kept is not None else None
        if target is not None:
            self._digests.pop(target, None)
            target.unlink(missing_ok=True)

    def _materialise(self, entry: Entry, out, target: Path, sha256: bool) -> None:
        """The blob of ``entry`` into ``out`` (the file ``target``), at most its listed size."""
        data = self._read.get(entry.path)
        if data is not None and len(data) == entry.size:      # read with its listing
            out.write(data)
            if sha256:
                self._digests[target] = hashlib.sha256(data).hexdigest()
            return
        if entry.size is not None and hasattr(self.git, "blob_to"):
            digest = self.git.blob_to(entry.oid, out, size=entry.size, sha256=sha256)
            written = out.tell()
            if written != entry.size:
                raise FormatError("blob size differs from the tree listing", check="size",
                                  expected=f"{entry.size} bytes", got=f"{written} bytes")
            if digest:
                self._digests[target] = digest
            return
        with self.git.open_blob(entry.oid) as stream:
            _copy(stream, out, entry.size if entry.size is not None else self.max_blob)


def _holds_blob(candidate: Path, entry: Entry) -> bool:
    """``candidate`` is a regular file whose git object id is the entry's (SHA-1 or SHA-256
    of ``blob <size>\\0`` and the content, as git computes it)."""
    try:
        fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != entry.size:
            return False
        with mapped(f) as data:
            return git_blob_id(data, algorithm="sha256" if len(entry.oid or "") == 64
                               else "sha1") == entry.oid


def _copy(stream, out, limit: int) -> None:
    """At most ``limit`` bytes from ``stream`` to ``out``, one block at a time."""
    while limit > 0 and (block := stream.read(min(limit, READ_BLOCK))):
        out.write(block)
        limit -= len(block)
