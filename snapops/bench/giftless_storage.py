"""The storage class of the giftless that the tests and benches run: giftless's local storage,
with downloads streamed in 1 MiB blocks. giftless hands the open file to werkzeug as the response
body, and a binary file iterates by lines (about 256 bytes each for random bytes): 15-20 MB/s
per object instead of the disk's speed. Imported by the giftless process only."""

import giftless.app  # noqa: F401  (giftless's own modules import each other in this order)
from giftless.storage.local_storage import LocalStorage
from werkzeug.wsgi import FileWrapper

BLOCK = 1 << 20


class BlockLocalStorage(LocalStorage):
    def get(self, prefix: str, oid: str):
        return FileWrapper(super().get(prefix, oid), BLOCK)
