"""Thin, typed access to the real ``git`` for hooks and CI (never faked, never gitpython here:
hooks must see exactly what ``git`` sees, including GIT_INDEX_FILE and the quarantine area).
Every call goes through :mod:`snapops.formats.gitcmd`, which inherits the hook's environment.
One read bypasses git: a loose blob stored without compression is copied out of the object
directory git names (the quarantine area in a hook) by :mod:`snapops.formats.looseobject`,
only when its file reads exactly as git would read it; anything else goes to ``cat-file``.

A :class:`Tree` is either the index (what ``git commit`` is about to record) or a commit; both
answer "which blob is at PATH" and "which files changed against a parent", so one checker serves
pre-commit, pre-push, pre-receive and CI.

Example::

    git = Git(".")
    [c.path for c in git.index().changes()]
    # -> ['snapshots/run1/s.wtxt', 'ledger/run1.ledger']
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from snapops.formats.gitcmd import open_git, run_git
from snapops.formats.looseobject import copy_stored_blob

BLOB_MODES = ("100644", "100755")


@dataclass(frozen=True)
class Change:
    """One changed path: ``status`` A/M/D/T (renames are split into D + A), the blob before
    (None when added) and after (None when deleted)."""

    status: str
    path: str
    old: str | None
    new: str | None


class Git:
    """Runs ``git`` in one repository (work tree or bare); inherits the hook's environment."""

    def __init__(self, repo: str | os.PathLike = ".") -> None:
        self.cwd = os.fspath(repo)
        self._null: str | None = None
        self._empty_tree: str | None = None
        self._facts: dict[str, str] = {}

    def run(self, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        """stdout of ``git args``; GitError when it fails (unless ``check`` is False)."""
        return run_git(args, cwd=self.cwd, input=input, check=check,
                       what=" ".join(args[:3])).stdout

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

    def blob_to(self, oid: str, out: BinaryIO, *, size: int | None = None) -> str | None:
        """Write a blob into the open, empty file ``out``. A loose blob stored without
        compression (what snapops repositories and remotes keep) of the ``size`` the tree
        lists is copied out of the object store directly, and its SHA-256 computed on the way
        is returned (:mod:`snapops.formats.looseobject`); any other git writes there itself
        (no pipe, no copy through Python: about twice as fast for shard-sized blobs): None."""
        if size is not None:
            digest = copy_stored_blob(self.objects_dir(), oid, out, size=size)
            if digest is not None:
                return digest
        run_git(["cat-file", "blob", oid], cwd=self.cwd, stdout=out,
                what=f"cat-file blob {oid}")
        return None

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

    def listing(self, folder: str) -> dict[str, str]:
        """Every regular file under ``folder`` (recursively): path -> blob id."""
        spec = f":(literal){folder.rstrip('/')}/" if folder else "."
        if self.commit is None:
            out = self.git.run("ls-files", "--stage", "-z", "--", spec)
            pos_oid = 1
        else:
            out = self.git.run("ls-tree", "-r", "-z", self.commit, "--", spec)
            pos_oid = 2
        found = {}
        for record in filter(None, out.split(b"\0")):
            meta, _, name = record.partition(b"\t")
            fields = meta.split()
            if fields[0].decode() in BLOB_MODES:
                found[name.decode("utf-8", "surrogateescape")] = fields[pos_oid].decode()
        return found

    def changes(self, parent: str | None = None) -> list[Change]:
        """Changed regular files against ``parent`` (default: HEAD for the index, the first
        parent for a commit; the empty tree when there is none)."""
        if self.commit is None:
            base = parent or self.git.resolve("HEAD^{tree}") or self.git.empty_tree()
            out = self.git.run("diff-index", "--cached", "-r", "-z", "--no-renames", base)
        else:
            if parent is None:
                parents = self.git.parents(self.commit)
                parent = parents[0] if parents else self.git.empty_tree()
            out = self.git.run("diff-tree", "-r", "-z", "--no-renames", parent, self.commit)
        return parse_raw_diff(out, self.git.null_oid())


def parse_raw_diff(out: bytes, null: str) -> list[Change]:
    """Parse ``git diff --raw -z`` output (``:old new oldsha newsha S\\0path\\0`` records)."""
    fields = out.split(b"\0")
    changes = []
    for i in range(0, len(fields) - 1, 2):
        meta, path = fields[i].decode(), fields[i + 1].decode("utf-8", "surrogateescape")
        old_mode, new_mode, old, new, status = meta.lstrip(":").split()[:5]
        old_blob = old if old != null and old_mode in BLOB_MODES else None
        new_blob = new if new != null and new_mode in BLOB_MODES else None
        if old_blob is None and new_blob is None:
            continue  # submodules, symlinks
        changes.append(Change(status[0], path, old_blob, new_blob))
    return changes
