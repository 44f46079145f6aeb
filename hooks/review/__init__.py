"""Weight-diff review: ``snapops diff``, ``snapops textconv`` and the git diff drivers.

Example::

    report = diff_paths("gen1.wtxt", "gen2.wtxt")
    print(render_markdown(report))          # a pull-request comment
    plot_report(report, "diff.png")         # heatmap of changed row-blocks per array
    review = review_git("main", "HEAD", "run1")   # one review per generation (generation.py)
    print(render_generation_markdown(review))     # anomalies first; pr.py: the PR comment

For two WTXT files with the same chunk layout, unchanged chunks are recognised from the
SHA-256 on their ch lines; only the chunks needed for the numbers are decoded. Review does not
verify files: run ``snapops verify`` (or the hooks) for that.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from snapops.formats.limits import DEFAULT_LIMITS, DeclaredLimits

from ._compare import ArrayDiff, BlockChange, DiffReport, diff_snapshots  # noqa: F401
from ._gen_render import (  # noqa: F401
    render_generation_json, render_generation_markdown, render_generation_text,
)
from ._plot import plot_generation, plot_report  # noqa: F401
from ._render import render_json, render_markdown, render_text, summary_line  # noqa: F401
from ._sources import SnapshotSource, open_snapshot  # noqa: F401
from .gitutil import GITATTRIBUTES, setup_repo  # noqa: F401
from .textconv import textconv, textconv_lines  # noqa: F401

__all__ = ["diff_paths", "diff_git", "DiffReport", "ArrayDiff", "BlockChange", "render_text",
           "render_markdown", "render_json", "plot_report", "textconv", "textconv_lines",
           "setup_repo", "GITATTRIBUTES", "open_snapshot", "summary_line", "review_git",
           "review_paths", "generation_run", "render_generation_markdown",
           "render_generation_text", "render_generation_json", "plot_generation"]


def diff_paths(a: str | os.PathLike, b: str | os.PathLike, *, threads: int = 2,
               rows_per_block: int | None = None, labels: tuple[str, str] | None = None,
               progress: Callable[[int], None] | None = None,
               limits: DeclaredLimits = DEFAULT_LIMITS) -> DiffReport:
    """Compare two snapshot files of any supported formats (sizes they declare bounded by
    ``limits`` before anything is read).

    Example::

        diff_paths("a.wtxt", "b.npz").counts()["changed"]
        # -> 1
    """
    la, lb = labels or (os.fspath(a), os.fspath(b))
    with open_snapshot(a, rows_per_block=rows_per_block, limits=limits) as sa, \
            open_snapshot(b, rows_per_block=rows_per_block, limits=limits) as sb:
        return diff_snapshots(sa, sb, a_label=la, b_label=lb, threads=threads,
                              progress=progress)


def diff_git(rev1: str, rev2: str, path: str, *, threads: int = 2,
             rows_per_block: int | None = None,
             progress: Callable[[int], None] | None = None,
             limits: DeclaredLimits = DEFAULT_LIMITS) -> DiffReport:
    """Compare ``path`` at two revisions of the git repository of the current folder. A path
    missing at one revision counts as an empty snapshot there (every array added/removed)."""
    from .gitutil import blob_exists, check_revision, write_blob

    for rev in (rev1, rev2):
        check_revision(rev)
    with tempfile.TemporaryDirectory(prefix="snapops-diff-") as tmp:
        files = []
        for side, rev in (("a", rev1), ("b", rev2)):
            dest = Path(tmp) / side / Path(path).name   # keeps the suffix for detection
            dest.parent.mkdir()
            if blob_exists(rev, path):
                write_blob(rev, path, dest)
                files.append(dest)
            else:
                files.append(None)
        if files == [None, None]:
            from snapops.formats.errors import GitError

            raise GitError(f"{path} exists at neither {rev1} nor {rev2}")
        labels = (f"{rev1}:{path}", f"{rev2}:{path}")
        return _diff_maybe_missing(files, labels, threads, rows_per_block, progress, limits)


def _diff_maybe_missing(files, labels, threads, rows_per_block, progress, limits
                        ) -> DiffReport:
    opened = []
    try:
        for f in files:
            opened.append(open_snapshot(f, rows_per_block=rows_per_block, limits=limits)
                          if f is not None else None)
        fmt = next(s.format for s in opened if s is not None)
        sa, sb = (s if s is not None else SnapshotSource(fmt, {}, []) for s in opened)
        return diff_snapshots(sa, sb, a_label=labels[0], b_label=labels[1], threads=threads,
                              progress=progress)
    finally:
        for s in opened:
            if s is not None:
                s.close()


# --- one review per generation ------------------------------------------------------------------

def generation_run(path: str) -> str | None:
    """The run when ``path`` (relative to the current folder, as ``snapops diff --git`` takes
    it) names ``snapshots/<run>`` or ``snapshots/<run>/MANIFEST`` of the repository, else None."""
    import posixpath

    from snapops.formats.generation import valid_run

    from .gitutil import git

    if os.path.isabs(path):
        top = git(["rev-parse", "--show-toplevel"]).stdout.decode().strip()
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(top))
    else:
        prefix = git(["rev-parse", "--show-prefix"]).stdout.decode().strip()
        rel = prefix + Path(path).as_posix()
    parts = posixpath.normpath(Path(rel).as_posix()).split("/")
    if parts[-1] == "MANIFEST":
        parts = parts[:-1]
    if len(parts) == 2 and parts[0] == "snapshots" and valid_run(parts[1]):
        return parts[1]
    return None


def review_git(rev1: str, rev2: str, run: str, *, repo: str | os.PathLike = ".", **options):
    """The generation review of ``run`` between two revisions (commits, branches, or the
    generation tags ``<run>/gen-N``) of the repository at ``repo``; ``options`` as
    :func:`~snapops.hooks.review.generation.review_generations` takes them."""
    from snapops.hooks.gitio import Git

    from .generation import open_git_side, review_generations

    git = Git(repo)
    with open_git_side(git, rev1, run) as a, open_git_side(git, rev2, run) as b:
        return review_generations(a, b, **options)


def review_paths(a: str | os.PathLike, b: str | os.PathLike, **options):
    """The generation review of two generation folders (``ROOT/snapshots/<run>``) or two
    MANIFEST files (a MANIFEST lying elsewhere gives a statistics-only review)."""
    from .generation import path_side, review_generations

    return review_generations(path_side(a), path_side(b), **options)
