"""The work repository's history cut on disk: its shallow boundaries, its object sizes, and
its packs rewritten without the objects a cut dropped (used by
:meth:`snapops.daemon.gitops.SnapshotRepo.forget_history`, which holds the repository's lock
and runs git through ``run``, its one git runner: ``run(*args, data=..., what=...)`` returns
git's stdout as text).

Packs are rewritten only where they hold something to drop: each pack whose objects are all
still reachable is marked with a ``.keep`` file for the ``repack -a -d``, so a dense run's
shard packs (one per generation) are not copied again at every cut. Marks are removed after
the repack; one left by a killed cut is recognised by its content and removed at the next.

Example::

    repack_dropping(repo.git_dir, repo._run)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from snapops.formats.atomic import atomic_write_bytes

__all__ = ["add_shallow", "object_bytes", "object_counts", "repack_dropping", "shallow"]

CUT_MARK = b"snapops: history cut in progress\n"   # our .keep files, and only ours

Run = Callable[..., str]


def shallow(git_dir: Path) -> list[str]:
    """The commits git treats as having no parents (``.git/shallow``)."""
    try:
        return (git_dir / "shallow").read_text().split()
    except FileNotFoundError:
        return []


def add_shallow(git_dir: Path, commit: str) -> None:
    # Older boundaries stay: another run's tag may still reach them.
    lines = sorted(set(shallow(git_dir)) | {commit})
    atomic_write_bytes(git_dir / "shallow", "".join(f"{line}\n" for line in lines).encode())


def object_counts(run: Run) -> dict[str, str]:
    out = run("count-objects", "-v", what="count-objects")
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def object_bytes(run: Run) -> int:
    """Bytes of loose objects and packs on disk."""
    counts = object_counts(run)
    return 1024 * (int(counts.get("size", 0)) + int(counts.get("size-pack", 0)))


def repack_dropping(git_dir: Path, run: Run) -> None:
    """Pack what is reachable and drop the rest, rewriting only the packs that hold
    something to drop. No new delta search (git's runs at ~15 MB/s, under the commit lock):
    deltas are kept where their bases are, the rest stored whole."""
    marked = _keep_reachable_packs(git_dir, run)
    try:
        run("repack", "-a", "-d", "-q", "--window=0", what="repack")
    finally:
        for keep in marked:
            keep.unlink(missing_ok=True)


def _keep_reachable_packs(git_dir: Path, run: Run) -> list[Path]:
    """Mark with a ``.keep`` file every pack whose objects are all still reachable (from
    refs or the index); returns the marks made (packs kept by anyone else are left alone)."""
    listed = run("rev-list", "--objects", "--all", "--indexed-objects",
                 what="rev-list --objects")
    reachable = {line.split(" ", 1)[0] for line in listed.splitlines()}
    marked = []
    for idx in sorted((git_dir / "objects" / "pack").glob("pack-*.idx")):
        keep = idx.with_suffix(".keep")
        if keep.exists() and keep.read_bytes() == CUT_MARK:
            keep.unlink()   # left by a cut that was killed
        if keep.exists() or not idx.with_suffix(".pack").exists():
            continue
        shown = run("show-index", data=idx.read_bytes(), what="show-index")
        if {line.split()[1] for line in shown.splitlines()} <= reachable:
            keep.write_bytes(CUT_MARK)
            marked.append(keep)
    return marked
