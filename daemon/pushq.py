"""The resend queue: push committed generations to every remote, oldest first, in pushes that
each complete, retrying with backoff.

Per remote, one attempt pushes the oldest pending generation and each next one while the sum
of their bytes (what their commits add: ``git rev-list --disk-usage``) fits
``push.batch_bytes`` (at least one, at most ``max_batch``): the branch goes to the newest
generation of the attempt, with their tags, in one atomic ``git push``. Every success moves
the queue forward, so a backlog drains however large an outage let it grow. A push has no
wall-clock limit while git reports progress; ``push.stall_timeout`` seconds without any
abort it (git and its helpers are killed) and it is retried after :func:`backoff_delay`.

Before its first attempt and after every failure, the queue asks the remote what it has
(``ls-remote``): generations whose tags are there already are reported without being sent
again (a push that completed on the remote while we were killed or timed out), and an
unreachable remote costs no push. The branch the remote's HEAD names is kept equal to ours
when it does not exist there or holds only our commits, so a bare remote made with
``git init --bare -b master`` gives a full work tree on clone.

Success reports exactly the generations of that attempt through ``on_pushed(remote, gens)``,
once per (remote, gen) for the life of the queue. Enqueues are accepted at any time. Pushes
run in apscheduler jobs, one job id per remote: a job pushes until nothing is pending or an
attempt fails, and a failure schedules the retry (a remote never has two pushes at once;
remotes push in parallel). ``on_change()`` is called after every change :meth:`status` would show
(at most twice a second for progress). Callbacks never run under the queue's lock.

The queue is in memory: the caller persists COMMITTED/PUSHED (the WAL) and enqueues again after
a restart (``remotes=`` limits an enqueue to the remotes that still lack a generation).

Example::

    queue = PushQueue(repo, cfg.repo.remotes, cfg.push, on_pushed=wal.pushed, run="run1")
    queue.start()
    queue.enqueue(1)
    queue.flush(timeout=30)
    # -> True
    queue.stop()
"""

from __future__ import annotations

import collections
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
from snapops.formats.errors import ConfigError, GitError

from .gitops import SnapshotRepo
from .pushprogress import PushProgress, drain_estimate
from .redact import redact_url

__all__ = ["PushQueue", "backoff_delay", "gen_tag"]

log = logging.getLogger(__name__)
HISTORY = 20                 # finished attempts kept per remote for status
PROGRESS_EVERY = 0.5         # seconds between on_change calls for progress lines


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


def choose_batch(pending: Iterable[int], sizes: dict[int, int], budget: int,
                 limit: int) -> list[int]:
    """The oldest pending generation and each next one while their bytes fit ``budget``.

    >>> choose_batch([3, 1, 2], {1: 60, 2: 50, 3: 10}, budget=100, limit=10)
    [1]
    """
    batch: list[int] = []
    total = 0
    for gen in sorted(pending)[:limit]:
        size = sizes.get(gen, 0)
        if batch and total + size > budget:
            break
        batch.append(gen)
        total += size
    return batch


@dataclass
class _Remote:
    config: RemoteConfig
    job_id: str
    pending: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)      # reported through on_pushed
    sizes: dict[int, int] = field(default_factory=dict)  # estimated bytes per generation
    in_flight: PushProgress | None = None
    synced: bool = False                              # remote refs read since the last failure
    mirror: str | None = None                         # the remote HEAD's branch, kept = ours
    attempts: int = 0                                 # consecutive failed attempts
    last_error: str | None = None
    next_retry: float | None = None                   # clock() time of the scheduled retry
    last_delay: float | None = None
    last_pushed: int | None = None
    last_success: float | None = None
    history: collections.deque = field(default_factory=lambda: collections.deque(maxlen=HISTORY))
    scheduled: bool = False
    running: bool = False

    def rate(self) -> float | None:
        """Bytes/s: the push in flight's, else the last successful push's average."""
        if self.in_flight is not None and self.in_flight.rate:
            return float(self.in_flight.rate)
        for past in reversed(self.history):
            if past["ok"] and past["bytes"] and past["seconds"] > 0:
                return past["bytes"] / past["seconds"]
        return None

    def snapshot(self, now: float) -> dict:
        pending_bytes = sum(self.sizes.get(g, 0) for g in self.pending)
        flight = self.in_flight.snapshot(now) if self.in_flight is not None else None
        rate = self.rate()
        return {
            "url": redact_url(self.config.url),
            "pending": sorted(self.pending),
            "depth": len(self.pending),
            "pending_bytes": pending_bytes,
            "unmeasured": sum(g not in self.sizes for g in self.pending),
            "in_flight": flight,
            "rate": rate,
            "eta": drain_estimate(pending_bytes - (flight["sent"] if flight else 0), rate),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "next_retry": self.next_retry,
            "backoff": self.last_delay,
            "last_pushed": self.last_pushed,
            "last_success": self.last_success,
            "pushed": len(self.done),
            "default_branch": self.mirror,
            "history": list(self.history),
        }


class PushQueue:
    """Push generations to ``remotes``; see the module docstring for the semantics.

    ``clock`` (unix seconds) stamps times; ``rng`` draws the jitter; ``scheduler`` is an
    apscheduler 3 scheduler to share (its owner starts and shuts it down; :meth:`stop` then only
    removes this queue's jobs). Without one, :meth:`start` creates a BackgroundScheduler and
    :meth:`stop` shuts it down. start/stop may alternate; pending work survives a stop.
    """

    def __init__(self, repo: SnapshotRepo, remotes: Iterable[RemoteConfig], config: PushConfig,
                 *, on_pushed: Callable[[str, list[int]], None], run: str,
                 on_change: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 scheduler=None, max_batch: int = 500) -> None:
        self._repo = repo
        self._config = config
        self._on_pushed = on_pushed
        self._on_change = on_change
        self._run = run
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._external = scheduler
        self._scheduler = None          # set while started
        self._max_batch = max(1, max_batch)
        self._cancel = threading.Event()  # set by stop(): running pushes end now
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
        self._changed()

    def start(self) -> None:
        """Start pushing (and schedule everything still pending)."""
        with self._cond:
            if self._scheduler is not None:
                return
            self._cancel.clear()
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
        """Stop scheduling attempts and abort running pushes (their git is killed); with
        ``wait``, wait until they have ended.

        Pending generations (also the aborted ones) stay queued for a later :meth:`start`.
        """
        self._cancel.set()
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
        """Per remote name: pending gens, their bytes (``pending_bytes``; ``unmeasured``
        gens not yet sized), the push ``in_flight`` (gens, bytes, phase, percent, sent, rate)
        or None, ``rate`` (bytes/s) and ``eta`` (seconds to drain), attempts, last_error,
        next_retry, backoff, last_pushed, last_success, pushed count, ``default_branch``
        (the remote HEAD's branch kept equal to ours) and the last attempts (``history``)."""
        now = self._clock()
        with self._cond:
            return {name: state.snapshot(now) for name, state in self._remotes.items()}

    def retry_waiting(self) -> bool:
        """Whether a remote waits for a scheduled retry (after a failed attempt)."""
        with self._cond:
            return any(s.next_retry is not None and s.pending for s in self._remotes.values())

    def clock_stepped(self, seconds: float) -> None:
        """The wall clock jumped by ``seconds``: the retry times :meth:`status` shows move with
        it (the owner moves the scheduler's jobs, :func:`~daemon.clockwatch.shift_jobs`)."""
        with self._cond:
            for state in self._remotes.values():
                if state.next_retry is not None:
                    state.next_retry += seconds
        self._changed()

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

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                log.exception("on_change failed")

    def _schedule(self, state: _Remote, delay: float) -> None:
        # Called with the lock held. Adding the job under the lock is what makes stop() safe:
        # stop() clears self._scheduler under the lock before it shuts the scheduler down
        # (apscheduler's shutdown holds its job-store lock while it waits for running jobs).
        if self._scheduler is None:
            return  # start() schedules whatever is pending
        state.scheduled = True
        # A retry is scheduled from inside the attempt that failed: with apscheduler's
        # default of one instance per job, a retry due before that attempt has returned
        # would be skipped and the queue would stall. Extra instances return at once
        # (``running``), so pushes stay one at a time.
        self._scheduler.add_job(
            self._attempt, "date", args=[state.config.name], id=state.job_id,
            run_date=datetime.now(timezone.utc) + timedelta(seconds=delay),
            replace_existing=True, misfire_grace_time=None, coalesce=True, max_instances=8,
            name=f"push to {state.config.name}")

    def _attempt(self, name: str) -> None:
        """Push until nothing is pending or an attempt fails (then retry after its delay)."""
        with self._cond:
            state = self._remotes[name]
            state.scheduled = False
            if self._scheduler is None or state.running or not state.pending:
                return
            state.running = True
        delay = 0.0
        try:
            while True:
                delay = self._sync_and_push(state)
                with self._cond:
                    if delay or not state.pending or self._scheduler is None:
                        break
                self._changed()
        finally:
            with self._cond:
                state.running = False
                state.in_flight = None
                if state.pending and not state.scheduled:
                    self._schedule(state, delay)
                self._cond.notify_all()
            self._changed()

    def _sync_and_push(self, state: _Remote) -> float:
        """One attempt; the delay before the next one (0 after a success)."""
        try:
            self._measure(state)  # first: an outage is when pending bytes matter most
            if not state.synced:
                self._sync(state)
            with self._cond:
                batch = choose_batch(state.pending, state.sizes, self._config.batch_bytes,
                                     self._max_batch)
            if batch:
                self._push(state, batch)
        except Exception as err:  # PushError expected; anything else is a failed attempt too
            return self._failed(state, err)
        return 0.0

    def _sync(self, state: _Remote) -> None:
        """Read the remote's refs: report what it has, decide which default branch to keep."""
        url = state.config.url
        refs = self._repo.remote_refs(url, stall=self._config.stall_timeout)
        with self._cond:
            candidates = {g: gen_tag(self._run, g) for g in state.pending}
        there = sorted(g for g, tag in candidates.items() if tag in refs.tags
                       and refs.tags[tag] == self._repo.tag_object(tag))
        head = refs.head
        if head is None:
            head = self._repo.remote_unborn_head(url, stall=self._config.stall_timeout)
        ours = f"refs/heads/{self._repo.branch}"
        mirror = None
        if head is not None and head != ours:
            theirs = refs.heads.get(head)
            mirror = head if theirs is None or self._repo.is_ours(theirs) else None
        with self._cond:
            state.mirror, state.synced = mirror, True
        if there:
            log.info("%s already has gen %s: not pushed again", state.config.name,
                     ",".join(map(str, there)))
            self._succeeded(state, there, pushed_bytes=0, seconds=0.0, sent=False)

    def _measure(self, state: _Remote) -> None:
        """Size the pending generations not sized yet (one git call each, outside the lock)."""
        with self._cond:
            missing = sorted(g for g in state.pending if g not in state.sizes)
        for gen in missing:
            size = self._repo.generation_bytes(gen_tag(self._run, gen))
            if size is not None:
                with self._cond:
                    state.sizes[gen] = size

    def _push(self, state: _Remote, batch: list[int]) -> None:
        tags = [gen_tag(self._run, g) for g in batch]
        commit = self._repo.tag_commit(tags[-1])
        if commit is None:
            raise GitError(f"tag {tags[-1]} is missing in {self._repo.path}")
        progress = PushProgress(batch, sum(state.sizes.get(g, 0) for g in batch), self._clock())
        with self._cond:
            state.in_flight = progress
        self._changed()
        last_change = [time.monotonic()]

        def on_line(line: str) -> None:
            if progress.feed(line) and time.monotonic() - last_change[0] >= PROGRESS_EVERY:
                last_change[0] = time.monotonic()
                self._changed()

        self._repo.push(state.config.url, tags, branch_commit=commit,
                        also_branches=[state.mirror] if state.mirror else [],
                        stall=self._config.stall_timeout,
                        timeout=self._config.timeout or None, on_line=on_line,
                        cancel=self._cancel)
        self._succeeded(state, batch, pushed_bytes=progress.bytes,
                        seconds=time.monotonic() - progress.mono, sent=True)

    def _failed(self, state: _Remote, err: Exception) -> float:
        with self._cond:
            delay = backoff_delay(self._config, state.attempts, self._rng)
            state.attempts += 1
            state.last_error = str(err)
            state.last_delay = delay
            state.next_retry = self._clock() + delay
            state.synced = False
            flight, state.in_flight = state.in_flight, None
            if flight is not None:
                state.history.append(self._record(flight.gens, flight.bytes, False,
                                                  time.monotonic() - flight.mono, str(err)))
            attempts, depth = state.attempts, len(state.pending)
        log.warning("push to %s failed (attempt %d, retry in %.2fs, %d pending): %s",
                    state.config.name, attempts, delay, depth, err)
        return delay

    def _record(self, gens: list[int], size: int, ok: bool, seconds: float,
                error: str | None = None) -> dict:
        record = {"gens": list(gens), "bytes": size, "ok": ok, "seconds": round(seconds, 3),
                  "ended": self._clock()}
        if error is not None:
            record["error"] = error[:300]
        return record

    def _succeeded(self, state: _Remote, batch: list[int], *, pushed_bytes: int,
                   seconds: float, sent: bool) -> None:
        name = state.config.name
        with self._cond:
            state.pending.difference_update(batch)
            report = [g for g in batch if g not in state.done]
            state.done.update(report)
            for gen in batch:
                state.sizes.pop(gen, None)
            state.attempts = 0
            state.last_error = None
            state.next_retry = None
            state.last_success = self._clock()
            state.last_pushed = max(batch[-1], -1 if state.last_pushed is None
                                    else state.last_pushed)
            if sent:
                state.history.append(self._record(batch, pushed_bytes, True, seconds))
            state.in_flight = None
        log.info("pushed %d generation(s) to %s: %s..%s in %.2f s", len(batch), name, batch[0],
                 batch[-1], seconds)
        if report:
            try:
                self._on_pushed(name, report)
            except Exception:
                log.exception("on_pushed(%s, %s) failed", name, report)
