"""The daemon's work tree: reset its paths to the branch tip before each generation, the
repository settings it relies on, and the ``.gitattributes`` it commits.

After a crash the work tree may hold half of a generation (some shards rewritten, a ledger
line appended). Serialization always starts from the last commit, so those paths are first
made exactly what the commit has (untracked leftovers removed). Rewriting them costs a full
checkout of the state (0.6 s per 64 MiB of WTXT); a :class:`WorktreeRecord` lets the daemon
skip it when the work tree is provably as its own last commit left it.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.errors import FormatError
from snapops.formats.gitcmd import GitResult, run_git
from snapops.formats.iosafe import read_small_text, refuse_symlinked

from .safeio import StatKey, stat_key


def _git(repo: Path, *args: str, check: bool = True) -> GitResult:
    return run_git(args, cwd=repo, check=check, what=" ".join(args[:2]), where=str(repo))


def _entries(root: Path, paths: list[str]) -> dict[str, StatKey] | None:
    """Every file under ``paths`` (relative POSIX path -> its lstat key); None if anything
    there is not a plain file or folder (a link, a FIFO: never trusted, always restored)."""
    found: dict[str, StatKey] = {}
    stack = [rel for rel in paths]
    while stack:
        rel = stack.pop()
        try:
            st = os.lstat(root / rel)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                with os.scandir(root / rel) as entries:
                    stack += [f"{rel}/{entry.name}" for entry in entries]
            except OSError:  # gone or changed while listed: not what was recorded
                return None
        elif stat.S_ISREG(st.st_mode):
            found[rel] = stat_key(st)
        else:
            return None
    return found


class WorktreeRecord:
    """What this process knows the work tree's ``paths`` held at a commit: every file there
    with its lstat key, taken when its bytes were known to be the commit's (just checked out,
    or just staged). A file written again gets a new inode, size or ctime; so when the branch
    tip is still that commit and every key matches, the paths hold exactly the commit's
    bytes and :func:`restore_paths` has nothing to do. Kept in memory only: a new daemon
    process restores in full once.

    Example::

        record = WorktreeRecord()
        restore_paths(repo, "main", ["snapshots/run1"], record)   # full: nothing known yet
        ...  # write the generation, commit it as `commit`
        record.committed(repo, commit, written_paths)
        restore_paths(repo, "main", ["snapshots/run1"], record)   # nothing to do
    """

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.commit: str | None = None    # None: no branch yet (the paths were emptied)
        self.files: dict[str, StatKey] | None = None    # None: nothing known

    def forget(self) -> None:
        self.commit, self.files = None, None

    def holds(self, root: Path, commit: str, paths: list[str]) -> bool:
        """The work tree's ``paths`` are exactly as recorded at ``commit``."""
        return self.files is not None and commit == self.commit and paths == self.paths \
            and _entries(root, paths) == self.files

    def restored(self, root: Path, commit: str | None, paths: list[str]) -> None:
        """``restore_paths`` just made ``paths`` exactly ``commit``'s."""
        self.paths, self.commit, self.files = list(paths), commit, _entries(root, paths)

    def committed(self, repo: str | os.PathLike, commit: str, staged: list[str]) -> None:
        """``commit`` was made from the recorded state plus ``staged`` (paths written, then
        staged from their bytes): those get new keys; anything else that changed since the
        record voids it (the next restore is a full one)."""
        now = _entries(Path(repo), self.paths)
        if self.files is None or now is None:
            return self.forget()
        fresh = set(staged)
        for rel in set(now) | set(self.files):
            if rel not in fresh and self.files.get(rel) != now.get(rel):
                return self.forget()
        self.commit, self.files = commit, now


def restore_paths(repo: str | os.PathLike, branch: str, paths: list[str],
                  record: WorktreeRecord | None = None) -> None:
    """Make ``paths`` of the work tree exactly what the tip of ``branch`` has (files the tip
    does not have are removed); nothing to do when ``record`` shows they already are."""
    root = Path(repo)
    tip = _git(root, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False)
    has_head = tip.returncode == 0
    if record is not None and has_head and record.holds(root, tip.text, paths):
        return
    for rel in paths:
        refuse_symlinked(root, rel, last=False)   # a removal through one would land outside
        target = root / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if has_head and _git(root, "cat-file", "-e", f"refs/heads/{branch}:{rel}",
                             check=False).returncode == 0:
            _git(root, "checkout", f"refs/heads/{branch}", "--", rel)
    if record is not None:
        record.restored(root, tip.text if has_head else None, paths)


ATTRIBUTES = ".gitattributes"
_BEGIN = "# >>> snapops: no git delta search for these (densely changed) shards >>>"
_END = "# <<< snapops <<<"


def configure_repo(repo: str | os.PathLike, compression: int) -> None:
    """zlib level for loose objects and packs (see RepoConfig.compression); no automatic
    ``git gc`` (the daemon prunes on its own schedule, never in the middle of a commit)."""
    root = Path(repo)
    for key in ("core.compression", "core.looseCompression", "pack.compression"):
        _git(root, "config", key, str(compression))
    _git(root, "config", "gc.auto", "0")
    _forget_local_delta_attributes(root)


def _forget_local_delta_attributes(root: Path) -> None:
    """Older daemons wrote ``-delta`` lines to ``.git/info/attributes``, which outranks the
    committed ``.gitattributes``: remove them."""
    info = Path(_git(root, "rev-parse", "--git-path", "info/attributes").text)
    info = info if info.is_absolute() else root / info
    try:
        lines = info.read_text().splitlines()
    except FileNotFoundError:
        return
    kept = [line for line in lines if not line.endswith(" -delta")]
    if kept != lines:
        info.write_text("".join(f"{line}\n" for line in kept))


def _pattern(path: str) -> str:
    """A gitattributes pattern matching exactly the repository path ``path``."""
    escaped = "".join(f"\\{c}" if c in "\\*?[" else c for c in path)
    if any(c.isspace() or c == '"' for c in escaped):
        quoted = escaped.replace("\\", "\\\\").replace('"', '\\"')
        return f'"/{quoted}"'
    return f"/{escaped}"


def write_delta_attributes(repo: str | os.PathLike, mode: str, dense: list[str]) -> list[str]:
    """Write which shards git must not delta-search into the committed ``.gitattributes``
    (a block of its own; other lines are kept), so every clone and every server that reads
    attributes from the tree skips them too. Densely changed shards gain nothing from deltas
    but cost ~14 MB/s of search. Returns the paths to commit.

    Example::

        write_delta_attributes(repo, "auto", ["snapshots/run1/shards/0000.wtxt"])
        # -> ['.gitattributes']
    """
    if mode == "never":
        block = ["* -delta"]
    elif mode == "always":
        block = []
    else:
        block = [f"{_pattern(p)} -delta" for p in sorted(dense)]
    write_attributes_block(repo, _BEGIN, _END, block)
    return [ATTRIBUTES]


def write_attributes_block(repo: str | os.PathLike, begin: str, end: str,
                           block: list[str]) -> None:
    """Replace the lines between ``begin`` and ``end`` in the committed ``.gitattributes``
    (other lines are kept; an empty block removes the markers, an empty file is removed)."""
    path = Path(repo) / ATTRIBUTES
    try:
        text = read_small_text(path) or ""
    except FormatError:   # a symlink, a FIFO... a remote's tree planted: ours replaces it
        text = ""
    lines = text.splitlines()
    if begin in lines and end in lines[lines.index(begin):]:
        stop = lines.index(end, lines.index(begin))
        lines = lines[:lines.index(begin)] + lines[stop + 1:]
    if block:
        lines += [begin, *block, end]
    new = "".join(f"{line}\n" for line in lines)
    if not new:
        path.unlink(missing_ok=True)
    elif new != text:
        atomic_write_bytes(path, new.encode())
