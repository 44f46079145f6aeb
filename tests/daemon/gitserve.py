"""Real Git remotes for the daemon tests: bare repositories and a ``git daemon`` on 127.0.0.1.

Nothing here fakes Git: the remotes are what ``git init --bare`` and ``git daemon`` serve, and the
checks read them back with the ``git`` command line, independently of the code under test.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from snapops.demo.remote import GitDaemon, free_port  # noqa: F401  (one git daemon runner)


def git(*args: str, cwd: str | os.PathLike | None = None, check: bool = True) -> str:
    """Run the real git; stdout without the final newline."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.rstrip("\n")


def git_bytes(*args: str, cwd: str | os.PathLike | None = None) -> bytes:
    """Run the real git; stdout exactly as printed."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr!r}")
    return proc.stdout


def init_bare(path: Path) -> Path:
    git("init", "-q", "--bare", "-b", "main", str(path))
    return path


@pytest.fixture
def bare_remote(tmp_path) -> Path:
    """An empty bare repository ``tmp_path/remote.git``."""
    return init_bare(tmp_path / "remote.git")


@pytest.fixture
def git_daemon(tmp_path):
    """A running ``git daemon`` on 127.0.0.1 serving ``served.git`` (``daemon.url("served.git")``)."""
    base = tmp_path / "served"
    base.mkdir()
    init_bare(base / "served.git")
    daemon = GitDaemon(base)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections (kernel backlog) but never answers: a hung remote."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]
