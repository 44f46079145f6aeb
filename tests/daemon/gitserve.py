"""Real Git remotes for the daemon tests: bare repositories and a ``git daemon`` on 127.0.0.1.

Nothing here fakes Git: the remotes are what ``git init --bare`` and ``git daemon`` serve, and the
checks read them back with the ``git`` command line, independently of the code under test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GitDaemon:
    """``git daemon`` serving every repository under ``base`` (push enabled); stop/start at will."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        assert self.proc is None
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={self.base}", "--export-all",
             "--enable=receive-pack", "--listen=127.0.0.1", f"--port={self.port}", str(self.base)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # its own process group: stop() also ends its children
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"git daemon exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("git daemon did not accept connections within 10 s")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # wait until the port refuses connections, so "down" really is down
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
            except OSError:
                return
            time.sleep(0.02)


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
