"""The writer's one pass over an array's raw bytes: every chunk's SHA-256, the array's
SHA-256 and (with a key) its HMAC, hashed together (:mod:`..sha256lanes`).

The pass runs as one task on the writer's pool, run by run in file order; the chunk digests
of each run are published as soon as they are known (kept as 32 bytes each until used), so
the tasks that encode the run's text (submitted after this one, and so started after it)
wait at most for the runs not yet hashed.
Every future it hands out is resolved whatever happens: with the digests, with the error that
stopped the pass, or cancelled when the pool dropped the task before it ran.
"""

from __future__ import annotations

from concurrent.futures import CancelledError, Future

import numpy as np

from .. import sha256lanes
from ..sha256lanes import Running, feed, hmac_from_inner, hmac_inner_prefix
from ._heads import hex_digits
from ._prepare import PreparedArray


class ArrayHashes:
    """Futures of one array's digests: ``sha`` and ``mac`` (hex; ``mac`` None without a key)
    and, by :meth:`chunk_hex`, each run's chunk digests."""

    def __init__(self, array: PreparedArray, key: bytes | None, salt: bytes,
                 batch_bytes: int) -> None:
        self._array, self._key, self._salt = array, key, salt
        self._runs = list(array.plan.runs(batch_bytes))
        self._chunks: dict[int, Future] = {first: Future() for first, _, _ in self._runs}
        self.sha: Future = Future()
        self.mac: Future | None = Future() if key is not None else None

    def start(self, pool) -> None:
        """Submit the pass to ``pool``: one task where the SHA-256 kernel interleaves the
        messages; with hashlib (a CPU without the SHA extensions), whose passes cost the same
        together or apart, the HMAC's pass as a task of its own, on the other core."""
        alone = self.mac is not None and not sha256lanes.KERNEL
        mine = [*self._chunks.values(), self.sha] + ([] if alone else [self.mac])
        pool.submit(self._run, not alone).add_done_callback(lambda task: _settle(task, mine))
        if alone:
            pool.submit(self._run_mac).add_done_callback(lambda task: _settle(task, [self.mac]))

    def chunk_hex(self, first: int) -> np.ndarray:
        """(count, 64) hex digits of the SHA-256s of the run that starts at chunk ``first``,
        once hashed."""
        digests = self._chunks[first].result()
        return hex_digits(np.frombuffer(digests, np.uint8).reshape(-1, 32))

    def _run(self, with_mac: bool) -> None:
        plan, raw = self._array.plan, self._array.raw
        running = [Running()]
        if with_mac and self._key is not None:
            running.append(Running(hmac_inner_prefix(self._key, self._salt)))
        for first, count, length in self._runs:
            start = first * plan.chunk_len
            self._chunks[first].set_result(
                feed(raw[start:start + count * length], max(length, 1), running))
        self.sha.set_result(running[0].hexdigest())
        if len(running) > 1:
            self.mac.set_result(hmac_from_inner(self._key, running[1].digest()).hex())

    def _run_mac(self) -> None:
        inner = Running(hmac_inner_prefix(self._key, self._salt))
        inner.update(self._array.raw)
        self.mac.set_result(hmac_from_inner(self._key, inner.digest()).hex())


def _settle(task: Future, futures: list[Future | None]) -> None:
    """After a task (done, failed or cancelled): fail whatever of its ``futures`` it left
    unresolved."""
    error = CancelledError() if task.cancelled() else task.exception()
    for future in futures:
        if future is not None and not future.done():
            future.set_exception(error or RuntimeError("array hashes not computed"))
