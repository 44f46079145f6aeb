"""Run giftless (a real Git LFS server) on 127.0.0.1, a free port, printed on the first line.

Usage: ``python serve_giftless.py STORAGE_DIR SECRET_FILE``. Local storage backend under
STORAGE_DIR (created first: giftless's own creation races between threads); JWT (HS256) auth
with the secret from SECRET_FILE, for requests and for the pre-authorized action URLs.
"""

import sys
from pathlib import Path

from werkzeug.serving import make_server


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
            "options": {"storage_class": "giftless.storage.local_storage:LocalStorage",
                        "storage_options": {"path": str(storage)}}}}})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    print(server.port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
