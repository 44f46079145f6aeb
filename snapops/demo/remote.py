"""The demo's Git remote: a bare repository guarded by the snapops ``pre-receive`` hook (every
pushed generation must be sealed by a trusted key), served by ``git daemon`` on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from snapops.formats.errors import GitError
from snapops.formats.gitcmd import run_git


def guarded_remote(path: Path, trusted: Path) -> Path:
    """A bare repository (created if missing) whose pre-receive requires signatures by a key
    in ``trusted`` (a folder of ``*.pub`` files, outside the repository)."""
    from snapops.hooks.install import install_hooks

    if not path.exists():
        run_git(["init", "-q", "--bare", "-b", "main", str(path)], what="init")
    install_hooks(path)
    # pack.*: serve clones and restores without a delta search over every shard (what the
    # README recommends for a snapshot remote)
    for key, value in (("snapops.trustedKeys", str(trusted)),
                       ("snapops.requireSignature", "true"),
                       ("pack.window", "0"), ("pack.compression", "0")):
        run_git(["config", key, value], cwd=path, what="config")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GitDaemon:
    """``git daemon`` serving every repository under ``base`` on 127.0.0.1 (pushes enabled);
    a context manager, or ``start``/``stop`` at will (tests take a remote down and up)."""

    def __init__(self, base: Path) -> None:
        self.base, self.port = base, free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        if self.proc is not None:
            raise GitError(f"git daemon on 127.0.0.1:{self.port} is already running")
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={self.base}", "--export-all",
             "--enable=receive-pack", "--listen=127.0.0.1", f"--port={self.port}",
             str(self.base)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # its own process group: stop() also ends its children
        deadline = time.monotonic() + 10
        while not _accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop()
                raise GitError(f"git daemon on 127.0.0.1:{self.port} did not start"
                               + (f" (exit {code})" if code is not None else " within 10 s"))
            time.sleep(0.05)

    def stop(self) -> None:
        """End the daemon and its children; returns once the port refuses connections."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        deadline = time.monotonic() + 5
        while _accepts(self.port, timeout=0.2) and time.monotonic() < deadline:
            time.sleep(0.02)

    def __enter__(self) -> "GitDaemon":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _accepts(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def repository_bytes(path: Path) -> int:
    """Bytes on disk of everything under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
