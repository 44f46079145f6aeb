"""Reads of a repository's own objects and refs through gitpython's object database, which
keeps one ``git cat-file --batch`` process open instead of starting a git per question.

That process can die under the daemon (OOM killer, a signal). It is then restarted, with one
log line: before a read when it has exited, and once more when its pipe breaks during a read
(every read is idempotent). A lookup that finds nothing is told apart from a helper that died
(gitpython reports both as an empty answer).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, TypeVar

import git

from snapops.formats.errors import GitError

log = logging.getLogger("snapops.daemon")
T = TypeVar("T")
_HELPERS = ("cat_file_header", "cat_file_all")    # gitpython's persistent cat-file processes


class ObjectReader:
    """One repository's object database, one question at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._repo: git.Repo | None = None
        self._lock = threading.Lock()   # gitpython's cat-file pipes serve one question at a time

    def read(self, what: str, read: Callable[[git.Repo], T]) -> T:
        """``read(repo)``; GitError naming ``what`` on failure."""
        with self._lock:
            for attempt in (1, 2):
                repo = self._opened()
                dead = self._dead_helpers()
                if dead:
                    self._restart("; ".join(dead))
                try:
                    return read(repo)
                except (git.exc.GitError, ValueError, OSError) as err:
                    dead = self._dead_helpers()
                    if attempt == 1 and (dead or isinstance(err, (BrokenPipeError,
                                                                  ConnectionError))):
                        self._restart("; ".join(dead) or f"pipe broken ({err})")
                        continue
                    raise GitError(f"{self.path}: {what} failed: {err}") from err
        raise AssertionError("unreachable")

    def lookup(self, repo: git.Repo, spec: str):
        """The object ``spec`` names, or None; a helper that died is an error, not absence."""
        try:
            return repo.rev_parse(spec)
        except (git.BadName, git.BadObject, ValueError):
            if self._dead_helpers():
                raise BrokenPipeError(f"git cat-file ended while looking up {spec}") from None
            return None

    def close(self) -> None:
        """End the persistent cat-file processes."""
        with self._lock:
            if self._repo is not None:
                self._repo.close()
                self._repo = None

    def _opened(self) -> git.Repo:
        if self._repo is None:
            try:
                self._repo = git.Repo(self.path)
            except (git.exc.GitError, OSError) as err:
                raise GitError(f"{self.path}: cannot open the repository: {err}") from err
        return self._repo

    def _dead_helpers(self) -> list[str]:
        """The persistent cat-file processes that have exited (killed, crashed)."""
        if self._repo is None:
            return []
        dead = []
        for attr in _HELPERS:
            proc = getattr(getattr(self._repo.git, attr, None), "proc", None)
            if proc is not None and proc.poll() is not None:
                args = proc.args if isinstance(proc.args, (list, tuple)) else [str(proc.args)]
                dead.append(f"{' '.join(map(str, args))} (pid {proc.pid}, "
                            f"exit status {proc.returncode})")
        return dead

    def _restart(self, why: str) -> None:
        """Drop the cat-file processes: the next read starts fresh ones."""
        log.warning("%s: git object reader restarted: %s", self.path, why)
        if self._repo is not None:
            self._repo.git.clear_cache()
