"""Git plumbing for review: blobs of a revision as files, and the diff drivers' config.

Runs the real ``git`` through :mod:`snapops.formats.gitcmd` (never a reimplementation, prompts
disabled). Blobs are streamed from ``git cat-file`` into a file, so a large snapshot never sits
in memory.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import BinaryIO

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.errors import GitError
from snapops.formats.iosafe import read_small_text
from snapops.formats.gitcmd import GitResult, run_git

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}

# What review needs from .gitattributes (the snapshot repository's and this project's).
GITATTRIBUTES = """\
*.wtxt       text eol=lf diff=wtxt
*.wtxtdelta  text eol=lf diff=wtxt
*.fold       binary diff=snapops
*.mind       binary diff=snapops
*.aero       binary diff=snapops
*.pycauset   binary diff=snapops
*.finf       binary diff=snapops
*.npz        binary diff=snapops
*.safetensors binary diff=snapops
"""
# Hunk headers of WTXT diffs name the array: the nearest arr line above the hunk.
WTXT_XFUNCNAME = "^arr name=.*$"


def git(args: list[str], *, repo: str | os.PathLike | None = None, check: bool = True,
        stdout: BinaryIO | None = None) -> GitResult:
    """``git args`` in ``repo`` (default: the current folder), paths taken literally;
    ``stdout``: a binary file receiving the output instead of memory."""
    return run_git(args, cwd=repo, env=_LITERAL, check=check, stdout=stdout,
                   what=" ".join(args[:3]))


def blob_spec(rev: str, path: str) -> str:
    """``REV:./PATH``: a path relative to the current folder, as git's own commands take it
    (``REV:PATH`` alone would be relative to the top of the repository)."""
    if os.path.isabs(path):
        top = git(["rev-parse", "--show-toplevel"]).stdout.decode().strip()
        path = os.path.relpath(os.path.realpath(path), os.path.realpath(top))
        return f"{rev}:{Path(path).as_posix()}"
    return f"{rev}:./{Path(path).as_posix()}"


def blob_exists(rev: str, path: str) -> bool:
    return git(["cat-file", "-e", blob_spec(rev, path)], check=False).returncode == 0


def check_revision(rev: str) -> None:
    if git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], check=False).returncode:
        raise GitError(f"unknown revision {rev!r} (or not inside a git repository)")


def write_blob(rev: str, path: str, dest: str | os.PathLike) -> None:
    """Stream the blob ``rev:path`` into the file ``dest``."""
    spec = blob_spec(rev, path)
    with open(dest, "wb") as out:
        git(["cat-file", "blob", spec], stdout=out)


def textconv_command() -> str:
    """``snapops textconv`` when that ``snapops`` is on PATH, else this interpreter's module
    (git runs the command through the shell, in whatever environment git itself has)."""
    found = shutil.which("snapops")
    if found and Path(found).resolve().parent == Path(sys.executable).resolve().parent:
        return "snapops textconv"
    return f"{shlex.quote(sys.executable)} -m snapops textconv"


def setup_repo(repo: str | os.PathLike = ".", *, command: str | None = None,
               attributes: bool = False) -> list[tuple[str, str]]:
    """Configure the review diff drivers in ``repo`` (local git config); with ``attributes``,
    append the missing lines of ``GITATTRIBUTES`` to ``repo/.gitattributes``.

    Returns the (key, value) pairs set.
    """
    top = Path(git(["rev-parse", "--show-toplevel"], repo=repo).stdout.decode().strip())
    pairs = [("diff.snapops.textconv", command or textconv_command()),
             ("diff.snapops.cachetextconv", "true"),
             ("diff.wtxt.xfuncname", WTXT_XFUNCNAME)]
    for key, value in pairs:
        git(["config", "--local", key, value], repo=top)
    if attributes:
        write_attributes(top / ".gitattributes")
    return pairs


def write_attributes(path: Path) -> list[str]:
    """Append each pattern line of GITATTRIBUTES whose pattern ``path`` does not mention yet
    (the file is replaced whole, atomically; a symlink or a FIFO there is refused)."""
    text = read_small_text(path) or ""
    have = {line.split()[0] for line in text.splitlines() if line.strip()
            and not line.lstrip().startswith("#")}
    missing = [line for line in GITATTRIBUTES.splitlines() if line.split()[0] not in have]
    if missing:
        sep = "" if not text or text.endswith("\n") else "\n"
        atomic_write_bytes(path, (text + sep + "\n".join(missing) + "\n").encode())
    return missing
