"""Thin, typed access to the real ``git`` for hooks and CI (never faked, never gitpython here:
hooks must see exactly what ``git`` sees, including GIT_INDEX_FILE and the quarantine area).
Every call goes through :mod:`snapops.formats.gitcmd`, which inherits the hook's environment.
One read bypasses git: a loose blob stored without compression is copied out of the object
directory git names (the quarantine area in a hook) by :mod:`snapops.formats.looseobject`,
only when its file reads exactly as git would read it; anything else goes to ``cat-file``.

A :class:`Tree` is either the index (what ``git commit`` is about to record) or a commit; both
answer "which blob is at PATH". :func:`tree_files` and :func:`diff_trees` list and compare
trees within ``snapops.maxPaths`` paths (``git diff-tree -r`` would collect every path of a
"tree bomb" in memory before printing the first).

Example::

    git = Git(".")
    [c.path for c in diff_trees(git, "HEAD~1", "HEAD")]
    # -> ['ledger/run1.ledger', 'snapshots/run1/s.wtxt']
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

from snapops.formats.errors import GitError
from snapops.formats.gitcmd import (
    MAX_LISTED_PATHS, OPEN_INPUT_MAX, open_git, run_git, run_listing, tree_records,
)
from snapops.formats.looseobject import copy_stored_blob

BLOB_MODES = ("100644", "100755")


class Git:
    """Runs ``git`` in one repository (work tree or bare); inherits the hook's environment."""

    def __init__(self, repo: str | os.PathLike = ".", max_paths: int = MAX_LISTED_PATHS) -> None:
        self.cwd = os.fspath(repo)
        self.max_paths = max_paths      # what one listing of a tree may name (snapops.maxPaths)
        self._null: str | None = None
        self._empty_tree: str | None = None
        self._facts: dict[str, str] = {}

    def run(self, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        """stdout of ``git args``; GitError when it fails (unless ``check`` is False)."""
        return run_git(args, cwd=self.cwd, input=input, check=check,
                       what=" ".join(args[:3])).stdout

    def listing(self, *args: str) -> bytes:
        """stdout of ``git args`` listing paths with ``-z``, at most ``max_paths`` of them
        (LimitError beyond: see :func:`~snapops.formats.gitcmd.run_listing`)."""
        return run_listing(args, cwd=self.cwd, what=" ".join(args[:3]),
                           max_paths=self.max_paths)

    def text(self, *args: str, check: bool = True) -> str:
        return self.run(*args, check=check).decode("utf-8", "surrogateescape").strip()

    def _fact(self, *args: str) -> str:
        key = " ".join(args)
        if key not in self._facts:
            self._facts[key] = self.text("rev-parse", *args)
        return self._facts[key]

    def is_bare(self) -> bool:
        return self._fact("--is-bare-repository") == "true"

    def toplevel(self) -> Path | None:
        """The work tree's root, or None for a bare repository."""
        return None if self.is_bare() else Path(self._fact("--show-toplevel"))

    def git_dir(self) -> Path:
        return Path(self.cwd, self._fact("--git-dir")).resolve()

    def hooks_dir(self) -> Path:
        """Where git looks for hooks (honours ``core.hooksPath``)."""
        return Path(self.cwd, self._fact("--git-path", "hooks")).resolve()

    def object_format(self) -> str:
        return self.text("rev-parse", "--show-object-format", check=False) or "sha1"

    def null_oid(self) -> str:
        if self._null is None:
            self._null = "0" * (64 if self.object_format() == "sha256" else 40)
        return self._null

    def empty_tree(self) -> str:
        if self._empty_tree is None:
            self._empty_tree = self.run("hash-object", "-t", "tree", "--stdin", input=b"")\
                .decode().strip()
        return self._empty_tree

    def resolve(self, rev: str) -> str | None:
        """The object id ``rev`` names, or None when it names nothing."""
        out = self.run("rev-parse", "--verify", "--quiet", "--end-of-options", rev, check=False)
        return out.decode().strip() or None

    def commits(self, *rev_args: str) -> list[str]:
        """``git rev-list --reverse`` (oldest first) of the given revisions."""
        out = self.text("rev-list", "--reverse", *rev_args, "--")
        return out.split() if out else []

    def parents(self, commit: str) -> list[str]:
        return self.text("rev-list", "--parents", "-n", "1", commit, "--").split()[1:]

    def subject(self, commit: str) -> str:
        return self.text("log", "-1", "--format=%s", commit, "--")

    def index(self) -> "Tree":
        return Tree(self, None)

    def commit(self, oid: str) -> "Tree":
        return Tree(self, oid)

    def blob_size(self, oid: str) -> int:
        return int(self.text("cat-file", "-s", oid))

    def read_blob(self, oid: str, limit: int) -> bytes:
        """At most ``limit`` bytes of a blob (the caller bounds what it parses)."""
        with self.open_blob(oid) as stream:
            parts, missing = [], limit
            while missing and (block := stream.read(missing)):
                parts.append(block)
                missing -= len(block)
        return b"".join(parts)

    def objects_dir(self) -> Path:
        """Where this repository (or a hook's quarantine area) writes new objects."""
        return Path(self.cwd, self._fact("--git-path", "objects"))

    def blob_to(self, oid: str, out: BinaryIO, *, size: int | None = None,
                sha256: bool = True) -> str | None:
        """Write a blob into the open, empty file ``out``. A loose blob stored without
        compression (what snapops repositories and remotes keep) of the ``size`` the tree
        lists is copied out of the object store directly, and its SHA-256 computed on the way
        is returned ("" with ``sha256=False``: not computed) (:mod:`snapops.formats.looseobject`);
        any other git writes there itself (no pipe, no copy through Python: about twice as
        fast for shard-sized blobs): None."""
        if size is not None:
            digest = copy_stored_blob(self.objects_dir(), oid, out, size=size, sha256=sha256)
            if digest is not None:
                return digest
        run_git(["cat-file", "blob", oid], cwd=self.cwd, stdout=out,
                what=f"cat-file blob {oid}")
        return None

    def small_blobs(self, specs: Sequence[str], limit: int) -> dict[str, bytes | None]:
        """The blobs ``specs`` (``REV:PATH`` or object ids) name, from ``cat-file --batch``
        (one git process per ``OPEN_INPUT_MAX`` bytes of questions), by spec: None when a
        spec names nothing or no blob. Reading stops before an object that would bring the
        bytes read beyond ``limit`` (the first such is None, later ones unanswered: absent),
        so memory stays bounded whatever the tags point at.

        Example::

            git.small_blobs(["v1:MANIFEST", "v2:MANIFEST"], 1 << 20)
            # -> {'v1:MANIFEST': b'...', 'v2:MANIFEST': None}
        """
        lines = [f"{spec}\n".encode("utf-8", "surrogateescape") for spec in specs]
        if any(line.count(b"\n") > 1 or len(line) > OPEN_INPUT_MAX for line in lines):
            raise ValueError("a cat-file spec cannot hold a line feed or be that long")
        found: dict[str, bytes | None] = {}
        room, start = limit, 0
        while start < len(specs):
            end, size = start, 0
            while end < len(specs) and size + len(lines[end]) <= OPEN_INPUT_MAX:
                size += len(lines[end])
                end += 1
            room = self._batch(specs[start:end], b"".join(lines[start:end]), room, found)
            if room < 0:
                break
            start = end
        return found

    def _batch(self, specs: Sequence[str], query: bytes, room: int,
               found: dict[str, bytes | None]) -> int:
        """One ``cat-file --batch`` of ``small_blobs``; the room left, -1 once it stopped."""
        with open_git(["cat-file", "--batch"], cwd=self.cwd, input=query, what="cat-file "
                      "--batch", bufsize=1 << 16) as stream:
            for spec in specs:
                fields = stream.readline(4096).split()
                if len(fields) != 3 or not fields[2].isdigit():
                    found[spec] = None          # "<spec> missing", "<spec> ambiguous"
                    continue
                size = int(fields[2])
                if size > room:
                    if not found:
                        found[spec] = None
                    return -1                   # leaving the block stops git
                data = stream.read(size + 1)
                if len(data) != size + 1 or data[-1:] != b"\n":
                    raise GitError(f"git cat-file --batch: {spec}: {len(data)} of the "
                                   f"{size + 1} bytes it announced")
                room -= size
                found[spec] = data[:-1] if fields[1] == b"blob" else None
        return room

    @contextlib.contextmanager
    def open_blob(self, oid: str) -> Iterator[BinaryIO]:
        """Stream a blob from ``git cat-file blob`` (no copy on disk). Leaving early stops git."""
        with open_git(["cat-file", "blob", oid], cwd=self.cwd, what=f"cat-file blob {oid}",
                      bufsize=1 << 20) as stream:
            yield stream


class Tree:
    """The index (``commit`` None) or one commit's tree."""

    def __init__(self, git: Git, commit: str | None) -> None:
        self.git, self.commit = git, commit

    @property
    def label(self) -> str:
        return "the index" if self.commit is None else f"commit {self.commit[:12]}"

    def blob(self, path: str) -> str | None:
        """The blob id at ``path`` (None when absent or not a regular file)."""
        if self.commit is None:
            out = self.git.run("ls-files", "--stage", "-z", "--", f":(literal){path}")
        else:
            out = self.git.run("ls-tree", "-z", self.commit, "--", f":(literal){path}")
        for record in out.split(b"\0"):
            meta, _, name = record.partition(b"\t")
            fields = meta.split()
            if name.decode("utf-8", "surrogateescape") == path and fields \
                    and fields[0].decode() in BLOB_MODES:
                stage_ok = self.commit is not None or fields[2] == b"0"
                oid = fields[1] if self.commit is None else fields[2]
                if stage_ok:
                    return oid.decode()
        return None


@dataclass(frozen=True)
class Entry:
    """A non-tree entry of a tree: ``mode`` as git writes it, ``oid`` the object it names."""

    mode: str
    oid: str


@dataclass(frozen=True)
class TreeDiff:
    """One path that differs between two trees; ``old``/``new`` None where it is absent."""

    path: str
    old: Entry | None
    new: Entry | None


def tree_files(git: Git, tree_ish: str, *pathspecs: str) -> dict[str, Entry]:
    """Every non-tree entry of ``tree_ish`` (under ``pathspecs``, taken literally), by path:
    one streamed ``ls-tree -r``, LimitError past ``git.max_paths``."""
    specs = [f":(literal){spec}" for spec in pathspecs]
    out = git.listing("ls-tree", "-r", "-z", "--full-tree", tree_ish, "--", *specs)
    return {r.path: Entry(r.mode, r.oid) for r in tree_records(out)}


def diff_trees(git: Git, old: str, new: str, *pathspecs: str) -> list[TreeDiff]:
    """The paths whose entry differs between two tree-ishes, in byte order (what ``diff-tree
    -r --no-renames`` reports, from two bounded listings)."""
    before, after = tree_files(git, old, *pathspecs), tree_files(git, new, *pathspecs)
    paths = sorted(before.keys() | after.keys(), key=lambda p: p.encode("utf-8",
                                                                         "surrogateescape"))
    return [TreeDiff(p, before.get(p), after.get(p)) for p in paths
            if before.get(p) != after.get(p)]
