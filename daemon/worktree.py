"""The daemon's work tree: reset its paths to the branch tip before each generation, the
repository settings it relies on, and the ``.gitattributes`` it commits.

After a crash the work tree may hold half of a generation (some shards rewritten, a ledger
line appended). Serialization always starts from the last commit, so those paths are first
made exactly what the commit has (untracked leftovers removed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.gitcmd import GitResult, run_git


def _git(repo: Path, *args: str, check: bool = True) -> GitResult:
    return run_git(args, cwd=repo, check=check, what=" ".join(args[:2]), where=str(repo))


def restore_paths(repo: str | os.PathLike, branch: str, paths: list[str]) -> None:
    root = Path(repo)
    has_head = _git(root, "rev-parse", "--verify", "-q", f"refs/heads/{branch}",
                    check=False).returncode == 0
    for rel in paths:
        target = root / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if has_head and _git(root, "cat-file", "-e", f"refs/heads/{branch}:{rel}",
                             check=False).returncode == 0:
            _git(root, "checkout", f"refs/heads/{branch}", "--", rel)


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
        text = path.read_text()
    except FileNotFoundError:
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
