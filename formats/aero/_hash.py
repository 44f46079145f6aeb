"""BLAKE3 over byte ranges, run on a small thread pool (blake3 releases the GIL while hashing).

A hash job is a key and a list of buffers hashed in order. Jobs with the same byte range share
one digest: a tensor filling a whole shard, or a page equal to a tensor, is hashed once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from blake3 import blake3

from ..workers import run_all

PIECE = 8 << 20          # update() granularity; large enough to amortise per-call overhead
ZEROS = memoryview(bytes(PIECE))


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def digest(data, *, threads: int = 1) -> bytes:
    """BLAKE3-256 of ``data`` (any buffer)."""
    return blake3(data, max_threads=threads if threads > 1 else 1).digest()


@dataclass(frozen=True)
class Segments:
    """A byte string made of buffers at given offsets with zero bytes between them.

    ``parts`` are ``(offset, buffer)`` in increasing, non-overlapping order; ``size`` may extend
    past the last part (zero padding).
    """

    parts: tuple[tuple[int, memoryview], ...]
    size: int

    def pieces(self, start: int = 0, stop: int | None = None) -> Iterable[memoryview]:
        """Buffers covering ``[start, stop)`` in order, padding included, each <= PIECE bytes."""
        stop = self.size if stop is None else stop
        cursor = start
        for offset, buf in self.parts:
            end = offset + len(buf)
            if end <= cursor or len(buf) == 0:
                continue
            if offset >= stop:
                break
            yield from _zeros(offset - cursor) if offset > cursor else ()
            lo, hi = max(cursor, offset) - offset, min(stop, end) - offset
            for p in range(lo, hi, PIECE):
                yield buf[p:min(hi, p + PIECE)]
            cursor = offset + hi
        if stop > cursor:
            yield from _zeros(stop - cursor)


def _zeros(n: int) -> Iterable[memoryview]:
    while n > 0:
        step = min(n, PIECE)
        yield ZEROS[:step]
        n -= step


@dataclass(frozen=True)
class HashJob:
    key: Hashable
    span: Hashable           # identical spans (same bytes) are hashed once
    size: int
    source: object           # a buffer, or a callable returning an iterable of buffers


def run_job(job: HashJob, threads: int = 1) -> bytes:
    """Digest of one job; ``threads`` > 1 lets BLAKE3 split the input across its own threads."""
    if callable(job.source):
        hasher = blake3(max_threads=threads)
        for piece in job.source():
            hasher.update(piece)
        return hasher.digest()
    return blake3(job.source, max_threads=threads).digest()


BIG_JOB = 64 << 20


def schedule(jobs: Sequence[HashJob], workers: int) -> list[tuple[HashJob, int]]:
    """Unique spans, largest first, each with the BLAKE3 thread count to use.

    A job bigger than its fair share of the work (the only shard of a one-tensor file, say)
    would leave the other workers idle, so it gets every thread to itself.
    """
    unique: dict[Hashable, HashJob] = {}
    for job in jobs:
        unique.setdefault(job.span, job)
    order = sorted(unique.values(), key=lambda j: -j.size)
    total = sum(j.size for j in order)
    return [(j, workers if workers > 1 and j.size >= BIG_JOB and j.size * workers > total
             else 1) for j in order]


def run_jobs(jobs: Sequence[HashJob], workers: int | None = None) -> dict:
    """Digest of every job, keyed by ``job.key``; largest jobs are started first."""
    workers = default_workers() if workers is None else max(1, workers)
    plan = schedule(jobs, workers)
    done = {job.span: run_job(job, threads) for job, threads in plan if threads > 1}
    rest = [job for job, threads in plan if threads == 1]
    done.update(zip((j.span for j in rest), run_all(run_job, rest, workers)))
    return {job.key: done[job.span] for job in jobs}
