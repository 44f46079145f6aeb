"""The demo's Git remote: a bare repository guarded by the snapops ``pre-receive`` hook (every
pushed generation must be sealed by a trusted key), served by ``git daemon`` on 127.0.0.1."""

from __future__ import annotations

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
    for key, value in (("snapops.trustedKeys", str(trusted)),
                       ("snapops.requireSignature", "true")):
        run_git(["config", key, value], cwd=path, what="config")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GitDaemon:
    """``git daemon`` serving the repositories under ``base`` on 127.0.0.1, pushes enabled."""

    def __init__(self, base: Path) -> None:
        self.base, self.port = base, free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> "GitDaemon":
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={self.base}", "--export-all",
             "--enable=receive-pack", "--listen=127.0.0.1", f"--port={self.port}",
             str(self.base)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise GitError(f"git daemon on 127.0.0.1:{self.port} did not start")
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        self.proc = None


def repository_bytes(path: Path) -> int:
    """Bytes on disk of everything under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
