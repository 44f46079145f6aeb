"""The snapops daemon: WAL -> spool -> serialize/seal -> ledger -> commit -> push queue.

One process per snapshot repository (a lock file enforces it). The main loop sleeps until
something can be new (:mod:`.wakeup`): the WAL grew (watchdog), the push queue changed, a
retry or a cleanup is due, or the long safety interval ``poll_interval`` passed. It then folds
new WAL records through the lifecycle table and advances every generation it can, in gen
order; a wake-up with nothing new runs no git, reads no WAL and writes no status. Every step
it finishes is a WAL record, so a restart (after SIGKILL, power loss, ...) resumes exactly:
serialization is deterministic and starts from the last commit, commits are idempotent by
tag, and committed generations go back into the resend queue. git children die with the
daemon (:data:`snapops.formats.gitcmd.children`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import threading
import time

from snapops.config.loader import resolve
from snapops.config.schema import Config
from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.errors import DataError, FormatError, GitError, SnapopsError
from snapops.formats.gitcmd import children

from .client import WAL_NAME
from .lifecycle import COMMITTED, DROPPED, PUSHED, REQ, SERIALIZED, SPOOLED
from .maintenance import maintain
from .priority import lower_priority
from .serialize import Sealing, ledger_path, run_dir, serialize_generation
from .spool import Spool, spool_files, spool_name
from .wakeup import Waker, watch_file
from .wal import Wal, WalReader, WalState
from .worktree import ATTRIBUTES, configure_repo, restore_paths, write_delta_attributes

log = logging.getLogger("snapops.daemon")
MAX_FAILURES = 20
STATUS_EVERY = 1.0      # seconds between status.json rewrites while a push reports progress
MAINTENANCE_RETRY = 60.0  # seconds before a cleanup skipped for a running push is tried again


class DaemonLocked(SnapopsError):
    """Another daemon already serves this state folder."""


class Daemon:
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
        self._maintenance_at: float | None = None  # clock() time a cleanup is due
        self.state = WalState()
        self.failures: list[dict] = []
        self.retry_at = 0.0
        self.consecutive_failures = 0
        self.started = clock()

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
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = self._lock()
        self.wal = Wal(self.spool_dir / WAL_NAME)
        self.reader = WalReader(self.spool_dir / WAL_NAME)
        self.sealing = Sealing.from_config(self.config)
        self.repo = SnapshotRepo(self.repo_dir, branch=self.config.repo.branch,
                                 author_name=self.config.repo.author_name,
                                 author_email=self.config.repo.author_email)
        self.remotes = {r.name for r in self.config.repo.remotes}
        self.pushq = self._push_queue()
        self.repo.clear_stale_locks(min_age=2)  # git killed with a previous daemon
        configure_repo(self.repo_dir, self.config.repo.compression)
        observer = self._watch()
        try:
            self._sync_state()
            for gen in self.state.in_state(COMMITTED, PUSHED):
                missing = self.remotes - gen.pushed
                if missing:
                    self.pushq.enqueue(gen.gen, remotes=sorted(missing))
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
            children.stop()
            self._sync_state()
            self.write_status()
            self.wal.close()
            os.close(lock)
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
        return retry and bool(self._ready())

    def _next_wake(self) -> float:
        """Seconds until the loop must look again even if nothing rings."""
        now = self.clock()
        wait = self.config.daemon.poll_interval
        if self.retry_at > now:
            wait = min(wait, self.retry_at - now)
        if self._maintenance_at is not None:
            wait = min(wait, self._maintenance_at - now)
        if self._status_dirty:
            wait = min(wait, self._status_due - time.monotonic())
        return max(0.0, wait)

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

    def _lock(self) -> int:
        fd = os.open(self.state_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonLocked(f"another snapops daemon holds {self.state_dir}/daemon.lock")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

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

    # --- one pass --------------------------------------------------------------------------
    def _sync_state(self) -> None:
        for record in self.reader.read_new():
            self.state.apply(record)

    def step(self) -> None:
        self.steps += 1
        self._stepped_size = self._wal_size()
        self._stepped_at = self.clock()
        self._sync_state()
        if self.clock() >= self.retry_at:
            for gen in self._ready():
                if self.stopping() or not self._advance(gen):
                    break
        self._retain()
        self.write_status()

    def _ready(self) -> list[int]:
        """Generations to serialize and commit, in order, none overtaking an unspooled one."""
        ready = []
        for gen in sorted(self.state.gens):
            state = self.state.gens[gen].state
            if state == REQ:
                break
            if state in (SPOOLED, SERIALIZED):
                ready.append(gen)
        return ready

    def _advance(self, gen: int) -> bool:
        """Serialize, seal, ledger and commit ``gen``; False to stop this pass (retry later)."""
        record = self.state.gens[gen]
        path = self.spool_dir / record.fields.get("file", spool_name(gen))
        try:
            spool = Spool(path)
            arrays = spool.arrays(check=True)
        except FormatError as exc:
            return self._drop(gen, "bad_spool", exc)
        try:
            restore_paths(self.repo_dir, self.config.repo.branch,
                          [run_dir(self.config), ledger_path(self.config), ATTRIBUTES])
            previous = self.repo.head_file(f"{run_dir(self.config)}/MANIFEST")
            ts = str(spool.meta.get("ts", "")) or time.strftime("%Y-%m-%dT%H:%M:%SZ")
            written = serialize_generation(self.repo_dir, gen, arrays, ts, self.config,
                                           self.sealing, previous)
            del arrays
            spool.close()
            if record.state == SPOOLED:
                self._record(SERIALIZED, gen, merkle=written.merkle_this)
            tag = f"{self.config.snapshot.run}/gen-{gen:06d}"
            message = (f"snapops: {self.config.snapshot.run} gen {gen} "
                       f"merkle_this={written.merkle_this}")
            paths = written.paths + write_delta_attributes(
                self.repo_dir, self.config.repo.delta, written.dense)
            commit = self.repo.commit_generation(paths, message, tag)
        except DataError as exc:
            return self._drop(gen, "unserializable", exc)
        except (OSError, GitError, FormatError) as exc:
            self._fail(gen, "serialize/commit", exc)
            return False
        self._record(COMMITTED, gen, commit=commit, tag=tag)
        self.consecutive_failures = 0
        self.pushq.enqueue(gen)
        log.info("gen %d committed %s (%s)", gen, commit[:12], tag)
        return True

    def _record(self, event: str, gen: int, **fields) -> None:
        self.wal.append(event, gen, **fields)
        self.wal.sync()
        self._sync_state()

    def _drop(self, gen: int, reason: str, exc: Exception) -> bool:
        log.error("gen %d dropped (%s): %s", gen, reason, exc)
        self._note_failure(gen, reason, exc)
        if self.state.gens[gen].state == SPOOLED:
            self._record(DROPPED, gen, reason=reason)
        return True

    def _fail(self, gen: int, stage: str, exc: Exception) -> None:
        self.consecutive_failures += 1
        delay = min(30.0, 0.5 * 2 ** min(self.consecutive_failures - 1, 6))
        self.retry_at = self.clock() + delay
        log.error("gen %d: %s failed, retrying in %.0fs: %s", gen, stage, delay, exc)
        self._note_failure(gen, stage, exc)

    def _note_failure(self, gen: int, stage: str, exc: Exception) -> None:
        self.failures.append({"gen": gen, "stage": stage, "error": str(exc)[:500],
                              "time": self.clock()})
        del self.failures[:-MAX_FAILURES]

    def _on_pushed(self, remote: str, gens: list[int]) -> None:
        for gen in gens:
            self.wal.append(PUSHED, gen, remote=remote)
        self.wal.sync()
        log.info("pushed gens %s to %s", ",".join(map(str, gens)), remote)
        self.wake.set()

    # --- retention and status --------------------------------------------------------------
    def _retain(self) -> None:
        """Keep spool files of the last K generations; older ones once committed or dropped."""
        keep = self.config.repo.retention
        files = spool_files(self.spool_dir)
        for gen, path in files[:-keep] if len(files) > keep else []:
            state = self.state.gens.get(gen)
            if state is not None and state.state in (COMMITTED, PUSHED, DROPPED):
                path.unlink(missing_ok=True)

    def status(self) -> dict:
        return status_from(self.state, self.remotes, pid=os.getpid(), started=self.started,
                           failures=self.failures, push=self.pushq.status(),
                           retry_at=self.retry_at or None)

    def write_status(self) -> None:
        self._status_dirty = False
        self._status_due = time.monotonic() + STATUS_EVERY
        data = json.dumps(self.status(), indent=2, sort_keys=True).encode() + b"\n"
        try:
            atomic_write_bytes(self.state_dir / "status.json", data)
        except OSError as exc:
            log.error("cannot write status: %s", exc)


def status_from(state: WalState, remotes: set[str], **extra) -> dict:
    """What ``snapops daemon status`` shows; computable from the WAL alone."""
    def last(*states):
        gens = [g.gen for g in state.gens.values() if g.state in states]
        return max(gens) if gens else None

    committed = [g for g in state.gens.values() if g.state in (COMMITTED, PUSHED)]
    unpushed = sorted(g.gen for g in committed if not g.fully_pushed(remotes))
    return {
        "last_requested": max(state.gens) if state.gens else None,
        "last_spooled": last(SPOOLED, SERIALIZED, COMMITTED, PUSHED),
        "last_committed": last(COMMITTED, PUSHED),
        "last_pushed": {r: max((g.gen for g in committed if r in g.pushed), default=None)
                        for r in sorted(remotes)},
        "waiting_to_serialize": sorted(g.gen for g in state.gens.values()
                                       if g.state in (REQ, SPOOLED, SERIALIZED)),
        "push_queue_depth": len(unpushed),
        "push_queue": unpushed[:50],
        "dropped": sorted(g.gen for g in state.gens.values() if g.state == DROPPED)[-50:],
        "wal_rejected": len(state.rejected),
        **extra,
    }
