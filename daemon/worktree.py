"""Reset the daemon's paths in the work tree to the branch tip before each generation.

After a crash the work tree may hold half of a generation (some shards rewritten, a ledger
line appended). Serialization always starts from the last commit, so those paths are first
made exactly what the commit has (untracked leftovers removed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from snapops.formats.errors import GitError


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if check and proc.returncode != 0:
        raise GitError(f"{repo}: git {' '.join(args)} failed: {proc.stderr.strip()[:300]}")
    return proc


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
