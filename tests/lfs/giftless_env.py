"""A real giftless LFS server for tests: started on 127.0.0.1, JWT-authenticated, local storage
(:mod:`snapops.bench.giftless`). The tests talk to it with snapops's LFS client and with git-lfs
itself; the stored objects are read back from its storage folder (``<storage>/<org>/<repo>/<oid>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from snapops.bench.giftless import ORG, REPO, serving, token


@dataclass
class Giftless:
    url: str             # the LFS endpoint: http://127.0.0.1:PORT/ORG/REPO.git/info/lfs
    storage: Path
    secret: str

    def token(self, actions: str = "*") -> str:
        """A JWT granting ``actions`` (read, write, verify or *) on this repository."""
        return token(self.secret, actions)

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
    secret = "test-secret-" + tmp_path.name
    with serving(tmp_path, secret) as url:
        yield Giftless(url, tmp_path / "lfs-storage", secret)
