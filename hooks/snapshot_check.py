"""Verify one snapshot blob of any supported format, as it is in a tree (index or commit).

Files are recognised by content (the registry's magic bytes, read from the blob itself), then
by suffix, so a ``.wtxt`` whose first line was damaged is still verified (and fails). WTXT is
verified streaming from ``git cat-file`` (or from the work-tree copy proven to be the blob, see
:mod:`.blobs`); other formats are written to a private temporary folder first, because their
verifiers map the file. ``.wsum`` files are verified with the ``.wtxt`` beside them; DELTA files
need their base and are only noted.

Example::

    ctx = Context(git, cfg, tmp)
    report = verify_blob(ctx, git.index(), "snapshots/run1/s.wtxt", oid)
    report.ok, str(report.failure)
    # -> (False, 'snapshots/run1/s.wtxt:9: [crc32c] array w, chunk 1: expected ..., got ...')
"""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from snapops.formats.contract import SnapshotFormat
from snapops.formats.errors import FormatError, SnapopsError
from snapops.formats.registry import SNIFF_BYTES, detect_head
from snapops.formats.report import Report
from snapops.formats.wtxt.verify import verify_stream
from snapops.formats.wtxt.wsum import MAX_WSUM

from .blobs import HashingFile, PrefixedStream, read_head
from .gitio import Git, Tree
from .repo_config import RepoConfig

WSUM_SUFFIX = ".wsum"
DELTA_SUFFIX = ".wtxtdelta"
DELTA_MAGIC = b"WTXT-DELTA "
WSUM_MAGIC = b"WSUM "
LFS_MAGIC = b"version https://git-lfs.github.com/spec/"


@dataclass
class Context:
    """What every check of one hook run shares: git, the settings, a private temp folder."""

    git: Git
    cfg: RepoConfig
    tmp: Path
    _serial: "itertools.count[int]" = field(default_factory=itertools.count)
    _index_cache: dict[str, str | None] = field(default_factory=dict)

    def scratch(self) -> Path:
        folder = self.tmp / str(next(self._serial))
        folder.mkdir()
        return folder

    def index_blob(self, path: str) -> str | None:
        if path not in self._index_cache:
            self._index_cache[path] = self.git.index().blob(path)
        return self._index_cache[path]


def classify(path: str, head: bytes) -> SnapshotFormat | str | None:
    """A snapshot format, "wsum", "delta", "lfs" (a Git LFS pointer), or None for a file
    that is no snapshot."""
    if head.startswith(DELTA_MAGIC) or path.endswith(DELTA_SUFFIX):
        return "delta"
    if head.startswith(WSUM_MAGIC) or path.endswith(WSUM_SUFFIX):
        return "wsum"
    if head.startswith(LFS_MAGIC):
        return "lfs"
    try:
        return detect_head(head, path.rsplit("/", 1)[-1])
    except FormatError:
        return None


def verify_blob(ctx: Context, tree: Tree, path: str, oid: str) -> Report | None:
    """Verify the blob ``oid`` at ``path`` of ``tree``; None when it is not a snapshot file."""
    with ctx.git.open_blob(oid) as pipe:
        head = read_head(pipe, SNIFF_BYTES)
        kind = classify(path, head)
        if kind is None or kind == "wsum":
            return None
        if kind == "delta":
            return Report(path=path, format="wtxt-delta", notes=[
                "DELTA file not verified here (it needs its base); verify the applied result"])
        if kind == "lfs":
            return Report(path=path, format="lfs-pointer", notes=[
                "Git LFS pointer: the content is not in git (verify it after `git lfs pull`)"])
        if not kind.capabilities.streams_text:
            return _verify_materialized(ctx, tree, path, oid, kind, head, pipe)
        candidate = _worktree_candidate(ctx, path, oid)
        if candidate is None:
            return _verify_wtxt(ctx, tree, path, PrefixedStream(head, pipe))
    return _verify_wtxt_worktree(ctx, tree, path, oid, candidate)


def _wsum_for(ctx: Context, tree: Tree, path: str) -> str | None:
    """Write the tree's ``PATH.wsum`` (if any) to the scratch folder; return where."""
    oid = tree.blob(path + WSUM_SUFFIX)
    if oid is None:
        return None
    target = ctx.scratch() / Path(path).name
    target = target.with_name(target.name + WSUM_SUFFIX)
    target.write_bytes(ctx.git.read_blob(oid, MAX_WSUM + 1))
    return os.fspath(target)


def _verify_wtxt(ctx: Context, tree: Tree, path: str, stream) -> Report:
    wsum = _wsum_for(ctx, tree, path)
    report = verify_stream(stream, path, **ctx.cfg.verify_options(), wsum_default=wsum)
    if wsum is not None:
        relocate(report, os.path.dirname(wsum), os.path.dirname(path))
    return report


def _worktree_candidate(ctx: Context, path: str, oid: str) -> tuple[Path, int] | None:
    """The work-tree file that probably is this blob (the index holds the same blob there and
    the sizes agree) and the blob's size; None when there is none."""
    top = ctx.git.toplevel() if ctx.cfg.use_worktree else None
    if top is None or ctx.index_blob(path) != oid:
        return None
    candidate = top / path
    try:
        if candidate.is_symlink() or not candidate.is_file():
            return None
        size = ctx.git.blob_size(oid)
        if candidate.stat().st_size != size:
            return None
    except OSError:
        return None
    return candidate, size


def _verify_wtxt_worktree(ctx: Context, tree: Tree, path: str, oid: str,
                          candidate: tuple[Path, int]) -> Report:
    algorithm = "sha256" if ctx.git.object_format() == "sha256" else "sha1"
    try:
        stream = HashingFile(candidate[0], candidate[1], algorithm)
    except OSError:
        stream = None
    if stream is not None:
        with stream:
            report = _verify_wtxt(ctx, tree, path, stream)
            if stream.object_id() == oid:
                report.details["verified_from"] = "work tree (hash-matched to the blob)"
                return report
    with ctx.git.open_blob(oid) as pipe:  # not the staged bytes: verify the blob itself
        return _verify_wtxt(ctx, tree, path, pipe)


def _verify_materialized(ctx: Context, tree: Tree, path: str, oid: str,
                         handler: SnapshotFormat, head: bytes, pipe) -> Report:
    """Binary formats map their file: write the blob (and, for a format whose file names
    others beside it, its folder) under the private scratch folder, verify there (the
    format's own checks; their seal is the generation's MANIFEST), and name the repository
    path."""
    root = ctx.scratch()
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        out.write(head)
        shutil.copyfileobj(pipe, out, 1 << 20)
    if handler.capabilities.multi_file:
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        for member, member_oid in tree.listing(folder).items():
            if member != path:
                _materialize(ctx.git, member_oid, root / member)
    try:
        report = handler.verify(os.fspath(target))
    except SnapopsError as exc:  # a verifier that raised instead of reporting
        error = exc if isinstance(exc, FormatError) else FormatError(str(exc), check="verify")
        report = Report(path=os.fspath(target), format=handler.name).fail(error)
    relocate(report, os.fspath(root), "")
    shutil.rmtree(root, ignore_errors=True)
    return report


def _materialize(git: Git, oid: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with git.open_blob(oid) as pipe, open(target, "wb") as out:
        shutil.copyfileobj(pipe, out, 1 << 20)


def relocate(report: Report, scratch: str, repo_folder: str) -> Report:
    """Name repository paths instead of scratch paths in a report."""
    def fix(text: str | None) -> str | None:
        if text is None or not text.startswith(scratch):
            return text
        rest = text[len(scratch):].lstrip("/")
        return f"{repo_folder}/{rest}" if repo_folder else rest

    report.path = fix(report.path)
    if report.failure is not None:
        report.failure.path = fix(report.failure.path)
        report.failure.args = (str(report.failure),)
    report.notes = [n.replace(scratch + "/", f"{repo_folder}/" if repo_folder else "")
                    for n in report.notes]
    return report
