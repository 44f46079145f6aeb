"""The snapops daemon: WAL -> spool -> serialize/seal -> ledger -> commit -> push queue.

One process per state folder and per spool folder (a ``daemon.lock`` in each enforces it).
The main loop sleeps until something can be new (:mod:`.wakeup`): the WAL grew (watchdog), the
push queue changed, a retry or a cleanup is due, or the long safety interval ``poll_interval``
passed. It then folds
new WAL records through the lifecycle table and advances every generation it can, in gen
order; a wake-up with nothing new runs no git, reads no WAL and writes no status. Every step
it finishes is a WAL record, so a restart (after SIGKILL, power loss, ...) resumes exactly:
serialization is deterministic and starts from the last commit, commits are idempotent by
tag, and committed generations go back into the resend queue. git children die with the
daemon (:data:`snapops.formats.gitcmd.children`).

Multi-rank runs (``[cluster]``): a generation is ready once every rank's part is spooled
(:mod:`snapops.daemon.ranks`); one that waited ``rank_timeout`` for missing ranks is dropped
naming them. One generation's step (serialize, seal, ledger, commit; a contributor node's
part; drops and retries) is :mod:`.advance`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

from snapops.config.loader import resolve
from snapops.config.schema import Config
from snapops.formats.atomic import atomic_write_bytes, remove_leftover_temps
from snapops.formats.errors import GitError
from snapops.formats.gitcmd import children

from .advance import UNFINISHED, GenerationStep
from .client import WAL_NAME
from .clockwatch import CHECK_EVERY, ClockWatch, shift_jobs
from .lifecycle import COMMITTED, DROPPED, PUSHED, REQ, SERIALIZED, SPOOLED
from .daemonlock import lock_folders, release
from .maintenance import maintain
from .priority import lower_priority
from .redact import redact_data
from .nodes import NodeGit, PartExchange
from .ranks import Cluster, RankWaits, overdue
from .serialize import Sealing
from .spool import spool_files
from .wakeup import Waker, watch_file
from .wal import DAEMON_WRITER, Wal, WalError, WalReader, WalState
from .walstatus import status_from
from .lfsstore import open_stash, switch_off_filters
from .worktree import WorktreeRecord, configure_repo
from .writers import retire_unfinished, try_writer_lock

log = logging.getLogger("snapops.daemon")
STATUS_EVERY = 1.0      # seconds between status.json rewrites while a push reports progress
MAINTENANCE_RETRY = 60.0  # seconds before a cleanup skipped for a running push is tried again


class Daemon(GenerationStep):
    def __init__(self, config: Config, *, clock=time.time) -> None:
        self.config = config
        self.clock = clock
        self.spool_dir = resolve(config, config.daemon.spool_dir)
        self.state_dir = resolve(config, config.daemon.state_dir)
        self.repo_dir = resolve(config, config.repo.path)
        self.stop_event = threading.Event()
        self.signalled = False  # set by the signal handler: no locks in a handler
        self.wake = Waker()
        self.wakeups = 0          # returns from the idle wait
        self.steps = 0            # passes that looked at the WAL
        self._stepped_size = -1   # WAL size seen by the last step
        self._stepped_at = 0.0    # clock() when the last step began
        self._status_dirty = False
        self._status_due = 0.0    # time.monotonic() of the next allowed status rewrite
        self._serialize_s = 0.0   # seconds the last generation took to serialize (logged)
        self._maintenance_at: float | None = None  # clock() time a cleanup is due
        self._abandon_check_at: float | None = None  # clock() time a waiting REQ is due
        self.cluster = Cluster.from_config(config)
        self.state: WalState = self.cluster.state()
        self.exchange: PartExchange | None = None  # a committer's intake of other nodes' parts
        self.failures: list[dict] = []
        self.retry_at = 0.0
        self.consecutive_failures = 0
        self.attempts: dict[int, int] = {}        # gen -> failed attempts counted to its drop
        self.waiting_since: dict[tuple[int, str], float] = {}  # (gen, rank) in REQ -> seen at
        self.unspooled: list[dict] = []            # those requests, for the status
        self.cleaned: list[str] = []               # leftover temp files removed at start
        self._sweep_locks = False   # a serialize/commit step failed: sweep dead git locks first
        self.started = clock()
        self.clock_watch = ClockWatch(clock)
        self.rank_waits = RankWaits()   # how long each generation has waited for its ranks

    # --- lifecycle -------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or ``stop()``); returns the exit code."""
        from .gitops import SnapshotRepo

        self._install_signals()  # first: a SIGTERM during start-up must still stop cleanly
        applied = lower_priority(nice=self.config.daemon.nice,
                                 cpu_policy=self.config.daemon.cpu_policy,
                                 io_class=self.config.daemon.io_class)
        children.start()  # before the first git: none may outlive us
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)  # status and queue name remotes: private
        locks = lock_folders(self.state_dir, self.spool_dir)
        self.wal = Wal(self.spool_dir / WAL_NAME, writer=DAEMON_WRITER)
        self.reader = WalReader(self.spool_dir / WAL_NAME)
        self._remove_leftovers()
        self.sealing = Sealing.from_config(self.config)
        self.repo = SnapshotRepo(self.repo_dir, branch=self.config.repo.branch,
                                 author_name=self.config.repo.author_name,
                                 author_email=self.config.repo.author_email)
        self.remotes = {r.name for r in self.config.repo.remotes} if self.cluster.committer \
            else {self.cluster.remote.name}   # a contributor pushes its parts, nothing else
        self.pushq = self._push_queue()
        self.repo.clear_stale_locks(min_age=2)  # git killed with a previous daemon
        configure_repo(self.repo_dir, self.config.repo.compression)
        self.worktree = WorktreeRecord()   # lets a generation skip the work tree's reset
        self.lfs = open_stash(self.config, self.state_dir)
        if self.lfs is not None:
            switch_off_filters(self.repo_dir)
        self.git = NodeGit(self.repo_dir, self.config.push.stall_timeout)
        if self.cluster.multi_node and self.cluster.committer:
            self.exchange = PartExchange(self.git, self.cluster, self.config.snapshot.run,
                                         self.config.snapshot.format, self.sealing.hmac_key,
                                         store=self.config.repo.store)
        observer = self._watch()
        try:
            self._sync_state()
            self._requeue_pushes()
            self.scheduler.start()
            self._schedule_maintenance()
            self.pushq.start()
            log.info("daemon started: spool=%s repo=%s remotes=%s (%s)", self.spool_dir,
                     self.repo_dir, ",".join(sorted(self.remotes)) or "-",
                     ", ".join(applied) or "priority unchanged")
            self.step()  # whatever the WAL left to do
            self._serve()
        finally:
            log.info("daemon stopping")
            observer.stop()
            observer.join()
            self.pushq.stop(wait=True)
            if self.scheduler.running:
                self.scheduler.shutdown(wait=True)
            self.repo.close()
            children.stop()
            self._sync_state()
            self.write_status()
            self.wal.close()
            release(locks)
            self.wake.close()
        return 0

    def _push_queue(self):
        """The resend queue, on a scheduler shared with the cleanup job (started later)."""
        from apscheduler.schedulers.background import BackgroundScheduler

        from .pushq import PushQueue

        self.scheduler = BackgroundScheduler(timezone="UTC")
        return PushQueue(self.repo, self.config.repo.remotes, self.config.push,
                         on_pushed=self._on_pushed, run=self.config.snapshot.run,
                         on_change=self._status_changed, scheduler=self.scheduler)

    def _serve(self) -> None:
        """Work only when something can be new; otherwise sleep (see the module docstring)."""
        while not self.stopping():
            self._now()                  # a step of the wall clock is handled first
            if self._has_news():
                self.step()
            if self._maintenance_at is not None and self.clock() >= self._maintenance_at:
                self._maintain()
            if self._status_dirty and time.monotonic() >= self._status_due:
                self.write_status()
            self._idle(self._next_wake())

    def _wal_size(self) -> int:
        try:
            return os.stat(self.spool_dir / WAL_NAME).st_size
        except OSError:
            return 0

    def _has_news(self) -> bool:
        """The WAL holds bytes no step has seen, or a retry of ready work is due."""
        size = self._wal_size()
        if size != self.reader.offset and size != self._stepped_size:
            return True
        retry = self._stepped_at < self.retry_at <= self.clock()
        due = [at for at in (self._abandon_check_at, self._ranks_due()) if at is not None]
        return any(self.clock() >= at for at in due) or (retry and bool(self._ready()))

    def _ranks_due(self) -> float | None:
        """clock() time a multi-rank generation needs a look without news in the WAL: the next
        poll of other nodes' parts, or the rank timeout of one still waiting for ranks."""
        waiting = [g for g in self.state.in_state(REQ) if g.problem is None]
        self.rank_waits.keep({g.gen for g in waiting})
        now = self._now()
        times = [now + self.cluster.timeout - self.rank_waits.waited(g, now) for g in waiting] \
            if self.cluster.ranked else []
        if self.exchange is not None and (waiting or self.exchange.outstanding):
            times.append(self.exchange.next_at)  # parts to take in, or refs left to sweep
        return min(times, default=None)

    def _next_wake(self) -> float:
        """Seconds until the loop must look again even if nothing rings."""
        now = self.clock()
        wait = self.config.daemon.poll_interval
        if self.retry_at > now:
            wait = min(wait, self.retry_at - now)
        if self._maintenance_at is not None:
            wait = min(wait, self._maintenance_at - now)
        for due in (self._abandon_check_at, self._ranks_due()):
            if due is not None:
                wait = min(wait, due - now)
        if self._status_dirty:
            wait = min(wait, self._status_due - time.monotonic())
        if self.pushq.retry_waiting():   # a step of the clock would delay it: look often
            wait = min(wait, CHECK_EVERY)
        return max(0.0, wait)

    def _now(self) -> float:
        """clock(), a step of it since the last look handled first (see ``_clock_stepped``)."""
        now, step = self.clock_watch.look()
        if step != 0.0:
            self._clock_stepped(step)
        return now

    def _clock_stepped(self, seconds: float) -> None:
        """Keep every wait at its real length: apscheduler's jobs and the times this loop
        compares with clock() are wall-clock times, so all move by the step."""
        moved = shift_jobs(self.scheduler, seconds)
        self.pushq.clock_stepped(seconds)
        self.retry_at += seconds if self.retry_at else 0.0
        self._stepped_at += seconds
        self._maintenance_at, self._abandon_check_at = (
            None if at is None else at + seconds
            for at in (self._maintenance_at, self._abandon_check_at))
        self.waiting_since = {key: at + seconds for key, at in self.waiting_since.items()}
        self.rank_waits.stepped()
        if self.exchange is not None:
            self.exchange.next_at += seconds
        log.warning("wall clock stepped by %+.0f s: %d scheduled job(s) and the daemon's own "
                    "retry times moved with it", seconds, moved)

    def _status_changed(self) -> None:
        """The push queue changed what status shows (called from its threads)."""
        self._status_dirty = True
        self.wake.set()

    def _schedule_maintenance(self) -> None:
        interval = self.config.repo.gc_interval
        if interval > 0:
            self.scheduler.add_job(self._maintenance_due, "interval", seconds=interval,
                                   id="snapops-maintenance", name="work repository cleanup",
                                   coalesce=True, misfire_grace_time=None)

    def _maintenance_due(self) -> None:
        self._maintenance_at = self.clock()
        self.wake.set()

    def _maintain(self) -> None:
        """Forget local history every remote has, beyond the retention ring (main thread:
        the WAL state is read here only)."""
        self._maintenance_at = None
        try:
            done = maintain(self.repo, self.state, self.remotes, self.config.repo.retention,
                            self.config.snapshot.run)
        except (GitError, OSError) as exc:
            log.error("work repository cleanup failed: %s", exc)
            return
        if not done:  # a push or commit was running
            self._maintenance_at = self.clock() + MAINTENANCE_RETRY

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def stopping(self) -> bool:
        return self.signalled or self.stop_event.is_set()

    def _idle(self, seconds: float) -> None:
        """Sleep until rung (a signal rings too) or ``seconds`` pass."""
        if not self.stopping():
            self.wake.wait(seconds)
            self.wakeups += 1

    def _watch(self):
        """Ring when the WAL changes; the daemon's own reads and other files never ring."""
        return watch_file(self.spool_dir, WAL_NAME, self.wake.set)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        def request_stop(*_):
            # No lock here (it could be held by the interrupted main thread): a flag and
            # one write() to the wake-up pipe.
            self.signalled = True
            self.wake.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, request_stop)

    def _requeue_pushes(self) -> None:
        """Committed generations go back into the resend queue for the remotes they lack; a
        contributor's COMMITTED means its part is on the remote already."""
        for gen in self.state.in_state(COMMITTED, PUSHED):
            missing = self.remotes - gen.pushed
            if not missing:
                continue
            if self.cluster.committer:
                self.pushq.enqueue(gen.gen, remotes=sorted(missing))
            elif self.cluster.remote.name in missing:
                self._record(PUSHED, gen.gen, remote=self.cluster.remote.name)

    # --- one pass --------------------------------------------------------------------------
    def _sync_state(self) -> None:
        for record in self.reader.read_new():
            self.state.apply(record)

    def step(self) -> None:
        self.steps += 1
        self._stepped_size = self._wal_size()
        self._stepped_at = self.clock()
        self._sync_state()
        self._retire_abandoned()
        if self.exchange is not None:
            self.exchange.poll(self.state, self._record, self.clock())
        self._drop_overdue()
        if self.clock() >= self.retry_at:
            for gen in self._ready():
                if self.stopping() or not self._advance(gen):
                    break
        self._retain()
        self.write_status()

    def _ready(self) -> list[int]:
        """Generations to serialize and commit (or drop), in order, none overtaking an
        unspooled one; a malformed one is ready to be dropped wherever it is."""
        ready = []
        for gen in sorted(self.state.gens):
            record = self.state.gens[gen]
            if record.problem and record.state in UNFINISHED:
                ready.append(gen)
            elif record.state == REQ:
                break
            elif record.state in (SPOOLED, SERIALIZED):
                ready.append(gen)
        return ready

    def _record(self, event: str, gen: int, **fields) -> None:
        self.wal.append(event, gen, **fields)
        self.wal.sync()
        self._sync_state()

    # --- writers that died -----------------------------------------------------------------
    def _retire_abandoned(self) -> None:
        """Retire requested parts of this machine's ranks that waited ``abandon_after``
        seconds for SPOOLED and whose writer is gone (its lock is free: taken here while
        retiring, so it cannot come back)."""
        now, due = self.clock(), {}
        local = {str(r) for r in self.cluster.local}
        waiting = {(g.gen, rank): part for g in self.state.in_state(REQ)
                   for rank, part in g.parts.items() if part.state == REQ and rank in local}
        self.waiting_since = {key: self.waiting_since.get(key, now) for key in waiting}
        self.unspooled = [{"gen": gen, "writer": rank,
                           "waiting_s": round(now - self.waiting_since[(gen, rank)], 1),
                           "writer_alive": None} for gen, rank in sorted(waiting)]
        for entry in self.unspooled:
            if entry["waiting_s"] >= self.config.daemon.abandon_after:
                due.setdefault(entry["writer"], []).append(entry["gen"])
        # look again when the next request is due (or, its writer alive, one period later)
        period = max(1.0, self.config.daemon.abandon_after)
        self._abandon_check_at = min(
            (max(since + self.config.daemon.abandon_after, now + period)
             if since + self.config.daemon.abandon_after <= now
             else since + self.config.daemon.abandon_after
             for since in self.waiting_since.values()), default=None)
        for writer, gens in due.items():
            lock = try_writer_lock(self.spool_dir, writer)
            for entry in self.unspooled:
                if entry["writer"] == writer and entry["gen"] in gens:
                    entry["writer_alive"] = lock is None
            if lock is None:
                continue  # alive: still spooling (a large state takes a while)
            try:
                self._sync_state()
                retire_unfinished(self.wal, self.state, self.spool_dir, writer, gens)
            except WalError as exc:
                log.error("cannot retire requests of writer %s: %s", writer, exc)
            finally:
                lock.release()
        if due:
            self._sync_state()

    def _drop_overdue(self) -> None:
        """Drop generations whose missing ranks did not deliver within ``rank_timeout`` (not
        while the parts remote is unreachable: their parts may be waiting there)."""
        if self.exchange is not None and not self.exchange.reachable:
            return
        for gen, missing in overdue(self.state, self.cluster, self.rank_waits,
                                    self._now()).items():
            refused = [f"node {node}: {why}" for (g, node), why in
                       (self.exchange.refused.items() if self.exchange else ()) if g == gen]
            why = f"ranks {','.join(missing)} (of world size {self.cluster.world}) did not " \
                  f"deliver within {self.cluster.timeout:g}s" + \
                  (f" ({'; '.join(refused)})" if refused else "")
            self._drop(gen, "missing_ranks", why, missing="+".join(missing))

    def _remove_leftovers(self) -> None:
        """Temp files of writers killed mid-write, in the folders this daemon serves."""
        for folder, recursive in ((self.spool_dir, False), (self.state_dir, False),
                                  (self.repo_dir, True)):
            removed = remove_leftover_temps(folder, recursive=recursive)
            self.cleaned += [os.fspath(path) for path in removed]
        if self.cleaned:
            log.warning("removed %d leftover temp files: %s", len(self.cleaned),
                        ", ".join(self.cleaned[:10]))

    def _on_pushed(self, remote: str, gens: list[int]) -> None:
        for gen in gens:
            self.wal.append(PUSHED, gen, remote=remote)
        self.wal.sync()
        log.info("pushed gens %s to %s", ",".join(map(str, gens)), remote)
        self.wake.set()

    # --- retention and status --------------------------------------------------------------
    def _retain(self) -> None:
        """Keep spool files of the last K generations (every rank's part of them); older
        ones once committed or dropped."""
        files = spool_files(self.spool_dir)
        gens = sorted({gen for gen, _ in files})
        old = set(gens[:-self.config.repo.retention])
        newest = max(self.state.gens, default=-1)
        for gen, path in (item for item in files if item[0] in old):
            state = self.state.gens.get(gen)
            done = state.state in (COMMITTED, PUSHED, DROPPED) if state is not None \
                else gen < newest  # an orphan: no request names it
            if done:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:  # a folder named like a spool file, ...
                    log.error("cannot remove %s: %s", path, exc)

    def status(self) -> dict:
        """The status dict (see :func:`status_from`) with what only the running daemon knows;
        every string in it is redacted."""
        return redact_data(status_from(
            self.state, self.remotes, pid=os.getpid(), started=self.started,
            failures=self.failures, push=self.pushq.status(), retry_at=self.retry_at or None,
            retrying={str(gen): {"attempts": n, "max_attempts": self.config.daemon.max_attempts}
                      for gen, n in sorted(self.attempts.items())},
            wal_corrupt_lines=len(self.reader.bad),
            wal_corrupt=[{"line": n, "text": text} for n, text in self.reader.bad[-20:]],
            wal_problem=self.reader.problem, leftovers_removed=self.cleaned[:50],
            waiting_for_spool=self.unspooled[:50], waiting_for_ranks=self._waiting_for_ranks(),
            **self._node_status()))

    def _waiting_for_ranks(self) -> list[dict]:
        """Requested generations of a multi-rank run, the ranks they wait for and for how long."""
        if not self.cluster.ranked:
            return []
        now = self._now()    # a first look at a generation fixes its wait: never across a step
        return [{"gen": g.gen, "missing": g.missing(self.state.expect),
                 "waiting_s": round(self.rank_waits.waited(g, now), 1),
                 "timeout_s": self.cluster.timeout}
                for g in self.state.in_state(REQ)[:50]]

    def _node_status(self) -> dict:
        if self.cluster.node is None:
            return {}
        out = {"node": self.cluster.node, "committer": self.cluster.committer,
               "ranks": sorted(self.cluster.local)}
        if self.exchange is not None:
            out["parts_remote_reachable"] = self.exchange.reachable
            out["parts_refused"] = [{"gen": g, "node": n, "why": why[:300]} for (g, n), why
                                    in sorted(self.exchange.refused.items())[-20:]]
        return out

    def write_status(self) -> None:
        self._status_dirty = False
        self._status_due = time.monotonic() + STATUS_EVERY
        data = json.dumps(self.status(), indent=2, sort_keys=True).encode() + b"\n"
        try:
            atomic_write_bytes(self.state_dir / "status.json", data, mode=0o600)
        except OSError as exc:
            log.error("cannot write status: %s", exc)
