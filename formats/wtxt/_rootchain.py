"""``sha256_all``, ``fastxor`` and the arr lines of a file being written, fed array by array.

``sha256_all`` is one SHA-256 over every arr line and its array's bytes in file order, and an
arr line holds that array's SHA-256 and HMAC: the pass over array ``i`` can start as soon as
array ``i``'s two digests are in. The thread that completes the last digest an array was
waiting for feeds it (and every array ready after it) at once, so the root is known shortly
after the last array's digests rather than one whole pass later, and the chain never queues
behind other work; one thread feeds at a time, and nothing in it waits on another task.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import Future

from ..integrity import FastXor
from ._grammar import ZERO64, ArrLine
from ._prepare import PreparedArray


class RootChain:
    """``done`` resolves to ``(arr lines, sha256_all hex, fastxor hex)``; :meth:`add` gives it
    each array's digest futures, in file order."""

    def __init__(self, arrays: list[PreparedArray], salts: list[bytes]) -> None:
        self._arrays, self._salts = arrays, salts
        self._pairs: list[tuple[Future, Future | None] | None] = [None] * len(arrays)
        self._lock = threading.Lock()
        self._next = 0
        self._busy = False
        self._total, self._fx, self._lines = hashlib.sha256(), FastXor(), []
        self.done: Future = Future()
        if not arrays:
            self._settle()

    def add(self, index: int, pair: tuple[Future, Future | None]) -> None:
        """Array ``index``'s (SHA-256, HMAC or None) futures."""
        self._pairs[index] = pair
        for future in pair:
            if future is not None:
                future.add_done_callback(self._advance)

    def _ready(self, index: int) -> bool:
        pair = self._pairs[index] if index < len(self._pairs) else None
        return pair is not None and all(f is None or f.done() for f in pair)

    def _advance(self, _=None) -> None:
        """Feed every ready array in order, unless another thread is already feeding."""
        while True:
            with self._lock:
                if self._busy or self.done.done() or not self._ready(self._next):
                    return
                self._busy = True
                index = self._next
            try:
                self._feed_one(index)
            except BaseException as exc:        # in a done-callback: nothing else would see it
                self._fail(exc)
                return
            with self._lock:
                self._busy = False
                self._next = index + 1
            if self._next == len(self._arrays):
                self._settle()
                return

    def _feed_one(self, index: int) -> None:
        array, (sha, mac) = self._arrays[index], self._pairs[index]
        line = ArrLine(array.name, array.dtype, array.shape, len(array.raw), sha.result(),
                       mac.result() if mac is not None else ZERO64,
                       self._salts[index].hex()).line()
        self._lines.append(line)
        self._total.update(line.encode("ascii"))
        self._total.update(array.raw)
        self._fx.update(array.raw)

    def _settle(self) -> None:
        with self._lock:
            if not self.done.done():
                self.done.set_result((self._lines, self._total.hexdigest(),
                                      self._fx.hexdigest()))

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._busy = False
            if not self.done.done():
                self.done.set_exception(exc)
