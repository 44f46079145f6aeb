"""Reset the daemon's paths in the work tree to the branch tip before each generation.

After a crash the work tree may hold half of a generation (some shards rewritten, a ledger
line appended). Serialization always starts from the last commit, so those paths are first
made exactly what the commit has (untracked leftovers removed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

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


def configure_repo(repo: str | os.PathLike, compression: int) -> None:
    """zlib level for loose objects and packs (see RepoConfig.compression)."""
    root = Path(repo)
    for key in ("core.compression", "core.looseCompression", "pack.compression"):
        _git(root, "config", key, str(compression))


def set_delta_attributes(repo: str | os.PathLike, mode: str, dense: list[str]) -> None:
    """Tell git's pack-objects which paths not to delta-search (.git/info/attributes: local,
    never committed). Densely changed shards gain nothing from deltas but cost ~14 MB/s."""
    root = Path(repo)
    info = Path(_git(root, "rev-parse", "--git-path", "info").text)
    info = info if info.is_absolute() else root / info
    info.mkdir(parents=True, exist_ok=True)
    if mode == "never":
        lines = ["* -delta"]
    elif mode == "always":
        lines = []
    else:
        lines = [f"/{path} -delta" for path in sorted(dense)]
    (info / "attributes").write_text("".join(f"{line}\n" for line in lines))
