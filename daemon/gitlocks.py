"""Git lock files a killed git leaves behind, and when they can be removed.

A git process killed mid-write (OOM killer, SIGKILL, SIGXFSZ) leaves its ``*.lock`` and git
refuses every later write until it is gone. At start the daemon owns its repository, so old
locks go (:func:`remove_locks` of :func:`lock_candidates`). While it runs, before a retry,
:func:`remove_dead_locks` removes only what no live process may hold: a lock nobody has open,
older than a moment, and none at all while a git that is not the daemon's own works in the
repository. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterable

from snapops.formats.errors import GitError


def lock_candidates(git_dir: Path) -> list[Path]:
    """The lock files a git killed mid-write leaves and every later write trips over."""
    return [git_dir / "index.lock", git_dir / "HEAD.lock", git_dir / "packed-refs.lock",
            *(git_dir / "refs").rglob("*.lock")]


def remove_locks(paths: Iterable[Path], *, newer_than: float = float("-inf"),
                 older_than: float = float("inf")) -> list[str]:
    """Remove the lock files among ``paths`` whose mtime lies in the window; their paths."""
    removed = []
    for lock in paths:
        try:
            mtime = lock.stat().st_mtime
            if newer_than <= mtime <= older_than:
                lock.unlink()
                removed.append(str(lock))
        except FileNotFoundError:
            continue
        except OSError as err:
            raise GitError(f"{lock}: cannot remove a stale git lock: {err}") from err
    return removed


def remove_dead_locks(repo: Path, git_dir: Path, min_age: float) -> tuple[list[str], list[str]]:
    """Remove the :func:`lock_candidates` of ``repo`` that no live process may hold (the
    caller holds its own commit lock, so none of its gits runs); returns (removed paths, why
    others were kept)."""
    present = [lock for lock in lock_candidates(git_dir) if os.path.lexists(lock)]
    if not present:
        return [], []
    real = {lock: os.path.join(os.path.realpath(lock.parent), lock.name)
            for lock in present}   # as /proc/PID/fd names them
    users, opened = _repo_processes(repo, set(real.values()))
    if users:
        return [], [f"{len(present)} lock(s) kept: {', '.join(users[:3])} works in {repo}"]
    kept = [f"{lock}: held open by pid {','.join(map(str, opened[real[lock]]))}"
            for lock in present if real[lock] in opened]
    free = [lock for lock in present if real[lock] not in opened]
    removed = remove_locks(free, older_than=time.time() - min_age)
    kept += [f"{lock}: younger than {min_age:g} s" for lock in free
             if str(lock) not in removed and os.path.lexists(lock)]
    return removed, kept


def _proc_stat(pid: str) -> tuple[int, bytes] | None:
    """(parent pid, command name) of a live process, None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.find(b"(") + 1:stat.rfind(b")")]
    fields = stat[stat.rfind(b")") + 2:].split()   # state ppid pgrp ...
    if len(fields) < 2 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), comm


def _repo_processes(repo: Path, locks: set[str]) -> tuple[list[str], dict[str, list[int]]]:
    """Live git processes working in ``repo`` (their working folder inside it) that are not
    this process's descendants, and which process has each of ``locks`` open."""
    with os.scandir("/proc") as entries:
        pids = [entry.name for entry in entries if entry.name.isdigit()]
    stats = {int(pid): st for pid in pids if (st := _proc_stat(pid)) is not None}
    ours, grew = {os.getpid()}, True
    while grew:   # this process and its descendants: the caller's own gits have finished
        found = {pid for pid, (ppid, _) in stats.items() if ppid in ours} - ours
        ours |= found
        grew = bool(found)
    root = os.path.realpath(repo)
    users, opened = [], {}
    for pid, (_, comm) in stats.items():
        if pid not in ours and comm.startswith(b"git"):
            with contextlib.suppress(OSError):
                cwd = os.readlink(f"/proc/{pid}/cwd")
                if cwd == root or cwd.startswith(root + os.sep):
                    users.append(f"pid {pid} ({comm.decode('ascii', 'replace')})")
        try:
            with os.scandir(f"/proc/{pid}/fd") as fds:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        target = os.readlink(fd.path)
                        if target in locks:
                            opened.setdefault(target, []).append(pid)
        except OSError:   # gone, or another user's: its working folder showed it if a git
            continue
    return users, opened
