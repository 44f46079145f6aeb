"""A real giftless LFS server for tests: started on 127.0.0.1, JWT-authenticated, local storage.

The tests talk to it with snapops's LFS client and with git-lfs itself; the stored objects are
read back from giftless's storage folder (``<storage>/<org>/<repo>/<oid>``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
import pytest

SERVE = Path(__file__).with_name("serve_giftless.py")
ORG, REPO = "snapops", "weights"


@dataclass
class Giftless:
    url: str             # the LFS endpoint: http://127.0.0.1:PORT/ORG/REPO.git/info/lfs
    storage: Path
    secret: str
    proc: subprocess.Popen

    def token(self, actions: str = "*", lifetime: int = 3600) -> str:
        """A JWT granting ``actions`` (read, write, verify or *) on this repository."""
        scope = f"obj:{ORG}/{REPO}/*" + ("" if actions == "*" else f":{actions}")
        return jwt.encode({"sub": "snapops-test", "exp": int(time.time()) + lifetime,
                           "scopes": [scope]}, self.secret, algorithm="HS256")

    def token_file(self, folder: Path, actions: str = "*") -> Path:
        path = folder / f"lfs-token-{actions.replace('*', 'all')}"
        path.write_text(self.token(actions) + "\n")
        path.chmod(0o600)
        return path

    def objects(self) -> dict[str, Path]:
        """oid -> file of every object giftless stores."""
        root = self.storage / ORG / REPO
        return {p.name: p for p in root.rglob("*") if p.is_file() and len(p.name) == 64}


@pytest.fixture
def giftless(tmp_path):
    storage = tmp_path / "lfs-storage"
    storage.mkdir()
    secret_file = tmp_path / "giftless-secret"
    secret = "test-secret-" + tmp_path.name
    secret_file.write_text(secret)
    log = tmp_path / "giftless.log"   # a file, not a pipe: a full pipe would stall the server
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(SERVE), str(storage), str(secret_file)],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            proc.kill()
            raise AssertionError(f"giftless did not start: {log.read_text()[-2000:]}")
        yield Giftless(f"http://127.0.0.1:{line}/{ORG}/{REPO}.git/info/lfs", storage, secret,
                       proc)
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
