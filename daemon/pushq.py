"""The resend queue: push committed generations to every remote, retrying with backoff.

Per remote, pending generations are pushed in ascending order; one attempt pushes the branch and
every pending tag (up to ``max_batch``) in a single ``git push``. Success reports exactly the
generations of that attempt through ``on_pushed(remote, gens)``, once per (remote, gen) for the
life of the queue. Failure schedules the next attempt after :func:`backoff_delay`; enqueues keep
being accepted meanwhile and join the next attempt. Attempts run as apscheduler jobs (one job id
per remote, so a remote never has two pushes at once; remotes push in parallel).

The queue is in memory: the caller persists COMMITTED/PUSHED (the WAL) and enqueues again after
a restart (``remotes=`` limits an enqueue to the remotes that still lack a generation).
Callbacks run on scheduler threads, never under the queue's lock, one at a time per remote.

Example::

    queue = PushQueue(repo, cfg.repo.remotes, cfg.push, on_pushed=wal.pushed, run="run1")
    queue.start()
    queue.enqueue(1)
    queue.flush(timeout=30)
    # -> True
    queue.stop()
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler

from snapops.config.schema import PushConfig, RemoteConfig
from snapops.formats.errors import ConfigError

from .gitops import SnapshotRepo, redact_url

__all__ = ["PushQueue", "backoff_delay", "gen_tag"]

log = logging.getLogger(__name__)


def gen_tag(run: str, gen: int) -> str:
    """The tag of generation ``gen`` of ``run``: ``run1/gen-000042``."""
    return f"{run}/gen-{gen:06d}"


def backoff_delay(config: PushConfig, failures: int, rng) -> float:
    """Seconds to wait after a failed attempt preceded by ``failures`` consecutive failures.

    ``min(backoff_max, backoff_initial * backoff_factor ** failures)``, then scaled by a random
    factor in ``[1 - jitter, 1 + jitter]`` drawn with ``rng.uniform(-1, 1)``; never negative.

    >>> backoff_delay(PushConfig(backoff_initial=1, jitter=0), 3, random.Random())
    8.0
    """
    try:
        base = config.backoff_initial * config.backoff_factor ** failures
    except OverflowError:
        base = config.backoff_max
    base = min(config.backoff_max, base)
    return max(0.0, base * (1.0 + config.jitter * rng.uniform(-1.0, 1.0)))


@dataclass
class _Remote:
    config: RemoteConfig
    job_id: str
    pending: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)      # reported through on_pushed
    in_flight: list[int] = field(default_factory=list)
    attempts: int = 0                                 # consecutive failed attempts
    last_error: str | None = None
    next_retry: float | None = None                   # clock() time of the scheduled retry
    last_delay: float | None = None
    last_pushed: int | None = None
    last_success: float | None = None
    scheduled: bool = False
    running: bool = False

    def snapshot(self) -> dict:
        return {
            "url": redact_url(self.config.url),
            "pending": sorted(self.pending),
            "depth": len(self.pending),
            "in_flight": list(self.in_flight),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "next_retry": self.next_retry,
            "backoff": self.last_delay,
            "last_pushed": self.last_pushed,
            "last_success": self.last_success,
            "pushed": len(self.done),
        }


class PushQueue:
    """Push generations to ``remotes``; see the module docstring for the semantics.

    ``clock`` (unix seconds) stamps ``next_retry``; ``rng`` draws the jitter; ``scheduler`` is an
    apscheduler 3 scheduler to share (its owner starts and shuts it down; :meth:`stop` then only
    removes this queue's jobs). Without one, :meth:`start` creates a BackgroundScheduler and
    :meth:`stop` shuts it down. start/stop may alternate; pending work survives a stop.
    """

    def __init__(self, repo: SnapshotRepo, remotes: Iterable[RemoteConfig], config: PushConfig,
                 *, on_pushed: Callable[[str, list[int]], None], run: str,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 scheduler=None, max_batch: int = 500) -> None:
        self._repo = repo
        self._config = config
        self._on_pushed = on_pushed
        self._run = run
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._external = scheduler
        self._scheduler = None          # set while started
        self._max_batch = max(1, max_batch)
        self._cond = threading.Condition(threading.Lock())
        self._remotes: dict[str, _Remote] = {}
        for remote in remotes:
            if remote.name in self._remotes:
                raise ConfigError(f"repo.remotes: duplicate remote name {remote.name!r}")
            job_id = f"snapops-push-{id(self):x}-{remote.name}"
            self._remotes[remote.name] = _Remote(remote, job_id)

    # -- public API --------------------------------------------------------------------------

    def enqueue(self, gen: int, *, remotes: Iterable[str] | None = None) -> None:
        """Queue committed generation ``gen`` (tag ``run/gen-NNNNNN``) for every remote.

        ``remotes`` limits it to those names (after a restart, the ones without PUSHED).
        A generation already pushed by this queue, or already pending, is ignored.
        """
        if isinstance(gen, bool) or not isinstance(gen, int) or gen < 0:
            raise ValueError(f"generation must be a non-negative int, got {gen!r}")
        with self._cond:
            names = list(self._remotes) if remotes is None else list(remotes)
            for name in names:
                state = self._remotes.get(name)
                if state is None:
                    raise KeyError(f"unknown remote {name!r}")
                if gen in state.done or gen in state.pending:
                    continue
                state.pending.add(gen)
                if not state.running and not state.scheduled:
                    self._schedule(state, 0.0)

    def start(self) -> None:
        """Start pushing (and schedule everything still pending)."""
        with self._cond:
            if self._scheduler is not None:
                return
            if self._external is not None:
                self._scheduler = self._external
            else:
                scheduler = BackgroundScheduler(timezone=timezone.utc)
                scheduler.start()
                self._scheduler = scheduler
            now = self._clock()
            for state in self._remotes.values():
                state.scheduled = False
                if state.pending and not state.running:
                    wait = 0.0 if state.next_retry is None else state.next_retry - now
                    self._schedule(state, max(0.0, wait))

    def stop(self, wait: bool = True) -> None:
        """Stop scheduling attempts; with ``wait``, also wait for running pushes to end.

        Pending generations stay queued for a later :meth:`start`.
        """
        with self._cond:
            scheduler, self._scheduler = self._scheduler, None
            for state in self._remotes.values():
                state.scheduled = False
        if scheduler is None:
            return
        if scheduler is self._external:
            for state in self._remotes.values():
                try:
                    scheduler.remove_job(state.job_id)
                except JobLookupError:
                    pass
        else:
            scheduler.shutdown(wait=wait)
        if wait:
            with self._cond:
                self._cond.wait_for(lambda: not any(s.running for s in self._remotes.values()))

    def status(self) -> dict:
        """Per remote name: pending gens, depth, in_flight, attempts, last_error, next_retry,
        backoff (last delay), last_pushed gen, last_success time, pushed count."""
        with self._cond:
            return {name: state.snapshot() for name, state in self._remotes.items()}

    def flush(self, timeout: float) -> bool:
        """Wait until no remote has pending or running work (True) or ``timeout`` s pass."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not any(s.pending or s.running for s in self._remotes.values()),
                timeout)

    def __enter__(self) -> "PushQueue":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------

    def _schedule(self, state: _Remote, delay: float) -> None:
        # Called with the lock held. Adding the job under the lock is what makes stop() safe:
        # stop() clears self._scheduler under the lock before it shuts the scheduler down
        # (apscheduler's shutdown holds its job-store lock while it waits for running jobs).
        if self._scheduler is None:
            return  # start() schedules whatever is pending
        state.scheduled = True
        self._scheduler.add_job(
            self._attempt, "date", args=[state.config.name], id=state.job_id,
            run_date=datetime.now(timezone.utc) + timedelta(seconds=delay),
            replace_existing=True, misfire_grace_time=None, coalesce=True,
            name=f"push to {state.config.name}")

    def _attempt(self, name: str) -> None:
        with self._cond:
            state = self._remotes[name]
            state.scheduled = False
            if self._scheduler is None or state.running or not state.pending:
                return
            batch = sorted(state.pending)[: self._max_batch]
            state.running = True
            state.in_flight = batch
        delay = 0.0
        try:
            delay = self._push(state, batch)
        finally:
            with self._cond:
                state.running = False
                state.in_flight = []
                if state.pending and not state.scheduled:
                    self._schedule(state, delay)
                self._cond.notify_all()

    def _push(self, state: _Remote, batch: list[int]) -> float:
        """One attempt: update the state, report success outside the lock; return the delay
        before the next attempt (0 after a success)."""
        name = state.config.name
        try:
            self._repo.push(state.config.url, [gen_tag(self._run, g) for g in batch],
                            timeout=self._config.timeout)
        except Exception as err:  # PushError expected; anything else is a failed attempt too
            with self._cond:
                delay = backoff_delay(self._config, state.attempts, self._rng)
                state.attempts += 1
                state.last_error = str(err)
                state.last_delay = delay
                state.next_retry = self._clock() + delay
                attempts, depth = state.attempts, len(state.pending)
            log.warning("push to %s failed (attempt %d, retry in %.2fs, %d pending): %s",
                        name, attempts, delay, depth, err)
            return delay
        with self._cond:
            state.pending.difference_update(batch)
            report = [g for g in batch if g not in state.done]
            state.done.update(report)
            state.attempts = 0
            state.last_error = None
            state.next_retry = None
            state.last_success = self._clock()
            state.last_pushed = max(batch[-1], -1 if state.last_pushed is None
                                    else state.last_pushed)
        log.info("pushed %d generation(s) to %s: %s..%s", len(batch), name, batch[0], batch[-1])
        if report:
            try:
                self._on_pushed(name, report)
            except Exception:
                log.exception("on_pushed(%s, %s) failed", name, report)
        return 0.0
