"""SHA-256 of a buffer's chunks and of a few running messages over the same bytes, in one pass.

WTXT hashes the same bytes several times: the writer each 32 KiB chunk, the whole array and,
with a key, the HMAC's inner message (salt, then the array); the reader the array, the HMAC
and ``sha256_all``. On CPUs with the SHA extensions the C kernel (``_sha256.c``) interleaves
those messages' rounds, which one message leaves half idle: two messages hash at 1.46x,
three at 1.68x, four at 1.77x the bytes per second of one hashlib pass. Elsewhere the same
results come from hashlib, one pass per message.

>>> array, keyed = Running(), Running(b"prefix")
>>> chunks = feed(b"abcdef", 4, [array, keyed])
>>> chunks == hashlib.sha256(b"abcd").digest() + hashlib.sha256(b"ef").digest()
True
>>> [array.digest(), keyed.digest()] == [hashlib.sha256(b"abcdef").digest(),
...                                      hashlib.sha256(b"prefixabcdef").digest()]
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ._sha256 import available, sha256_context, sha256_feed, sha256_finish

KERNEL = available()
MAX_RUNNING = 3             # running messages per pass (the kernel's lanes, besides chunks)
BLOCK = 64


class Running:
    """A running SHA-256 of ``prefix`` and whatever is added (by :func:`feed` or
    :meth:`update`); the kernel's context where the CPU has the SHA extensions."""

    def __init__(self, prefix: bytes = b"", *, kernel: bool | None = None) -> None:
        self.kernel = KERNEL if kernel is None else kernel
        self.state = sha256_context(prefix) if self.kernel else hashlib.sha256(prefix)

    def update(self, data) -> None:
        feed(data, 0, [self])

    def digest(self) -> bytes:
        """The digest of everything so far (adding may go on)."""
        return sha256_finish(self.state) if self.kernel else self.state.digest()

    def hexdigest(self) -> str:
        return self.digest().hex()


def feed(data, chunk_len: int, running: Sequence[Running]) -> bytes:
    """The 32-byte digests of ``data``'s chunks of ``chunk_len`` bytes (the last may be
    shorter; empty data is one empty chunk; none for ``chunk_len`` 0), back to back, and
    ``data`` added to each of ``running`` (at most ``MAX_RUNNING``, all of one kind)."""
    view = memoryview(data).cast("B")
    if chunk_len < 0 or len(running) > MAX_RUNNING:
        raise ValueError(f"chunk_len={chunk_len}, {len(running)} running messages: expected "
                         f"chunk_len >= 0 and at most {MAX_RUNNING}")
    kernel = running[0].kernel if running else KERNEL
    if any(r.kernel != kernel for r in running):
        raise ValueError("running messages of both kinds in one feed")
    if kernel:
        chunks = 0 if chunk_len == 0 else max(1, -(-len(view) // chunk_len))
        out = bytearray(32 * chunks)
        sha256_feed(view, chunk_len, [r.state for r in running], out)
        return bytes(out)
    for r in running:
        r.state.update(view)
    if chunk_len == 0:
        return b""
    return b"".join(hashlib.sha256(view[at:at + chunk_len]).digest()
                    for at in range(0, max(len(view), 1), chunk_len))


def hmac_inner_prefix(key: bytes, message_start: bytes = b"") -> bytes:
    """What HMAC-SHA256's inner hash hashes before the rest of the message: the key block
    XOR 0x36, then ``message_start``."""
    return _key_block(key, 0x36) + message_start


def hmac_from_inner(key: bytes, inner: bytes) -> bytes:
    """HMAC-SHA256 from its inner hash's digest.

    >>> import hmac
    >>> inner = hashlib.sha256(hmac_inner_prefix(b"k", b"msg")).digest()
    >>> hmac_from_inner(b"k", inner) == hmac.new(b"k", b"msg", "sha256").digest()
    True
    """
    return hashlib.sha256(_key_block(key, 0x5C) + inner).digest()


def _key_block(key: bytes, pad: int) -> bytes:
    if len(key) > BLOCK:
        key = hashlib.sha256(key).digest()
    return bytes(b ^ pad for b in key.ljust(BLOCK, b"\0"))
