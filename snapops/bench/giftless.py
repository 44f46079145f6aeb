"""Run giftless (a real Git LFS server) on 127.0.0.1, a free port, printed on the first line;
for the LFS-store tests and ``snapops bench storage`` (giftless comes with the test extras).

Usage: ``python -m snapops.bench.giftless STORAGE_DIR SECRET_FILE``. Local storage backend
(``giftless_storage``: downloads in 1 MiB blocks) under STORAGE_DIR (created first: giftless's
own creation races between threads); JWT (HS256) auth with the secret from SECRET_FILE, for
requests and for the pre-authorized action URLs.
"""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from werkzeug.serving import make_server

ORG, REPO = "snapops", "weights"


def token(secret: str, actions: str = "*", lifetime: int = 3600) -> str:
    """A JWT (HS256) granting ``actions`` (read, write, verify or *) on ORG/REPO."""
    import jwt

    scope = f"obj:{ORG}/{REPO}/*" + ("" if actions == "*" else f":{actions}")
    return jwt.encode({"sub": "snapops", "exp": int(time.time()) + lifetime,
                       "scopes": [scope]}, secret, algorithm="HS256")


@contextlib.contextmanager
def serving(folder: Path, secret: str, nice: int = 0) -> Iterator[str]:
    """giftless with its storage under ``folder/lfs-storage``, its log in ``folder``, at CPU
    niceness ``nice``; yields the LFS endpoint URL; killed when the block ends."""
    storage = folder / "lfs-storage"
    storage.mkdir(parents=True, exist_ok=True)
    secret_file = folder / "giftless-secret"
    secret_file.write_text(secret)
    log = folder / "giftless.log"   # a file, not a pipe: a full pipe would stall the server
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "snapops.bench.giftless", str(storage),
                                 str(secret_file)], stdout=subprocess.PIPE, stderr=err,
                                text=True, preexec_fn=(lambda: os.nice(nice)) if nice else None)
    try:
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"giftless did not start: {log.read_text()[-2000:]}")
        yield f"http://127.0.0.1:{port}/{ORG}/{REPO}.git/info/lfs"
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()


def main() -> None:
    storage, secret_file = Path(sys.argv[1]), Path(sys.argv[2])
    storage.mkdir(parents=True, exist_ok=True)
    secret = secret_file.read_text().strip()
    from giftless.app import init_app

    jwt = {"factory": "giftless.auth.jwt:factory",
           "options": {"algorithm": "HS256", "private_key": secret}}
    app = init_app(additional_config={
        "LEGACY_ENDPOINTS": False,
        "AUTH_PROVIDERS": [jwt],
        "PRE_AUTHORIZED_ACTION_PROVIDER": jwt,
        "TRANSFER_ADAPTERS": {"basic": {
            "factory": "giftless.transfer.basic_streaming:factory",
            "options": {"storage_class": "snapops.bench.giftless_storage:BlockLocalStorage",
                        "storage_options": {"path": str(storage)}}}}})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    print(server.port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
