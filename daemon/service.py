"""The snapops daemon: WAL -> spool -> serialize/seal -> ledger -> commit -> push queue.

One process per snapshot repository (a lock file enforces it). The main loop wakes on
watchdog events in the spool folder (or every ``poll_interval``), folds new WAL records
through the lifecycle table and advances every generation it can, in gen order. Every step
it finishes is a WAL record, so a restart (after SIGKILL, power loss, ...) resumes exactly:
serialization is deterministic and starts from the last commit, commits are idempotent by
tag, and committed generations go back into the resend queue.
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

from .client import WAL_NAME
from .lifecycle import COMMITTED, DROPPED, PUSHED, REQ, SERIALIZED, SPOOLED
from .serialize import Sealing, ledger_path, run_dir, serialize_generation
from .spool import Spool, spool_files, spool_name
from .wal import Wal, WalReader, WalState
from .worktree import configure_repo, restore_paths, set_delta_attributes

log = logging.getLogger("snapops.daemon")
MAX_FAILURES = 20


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
        self.wake = threading.Event()
        self.state = WalState()
        self.failures: list[dict] = []
        self.retry_at = 0.0
        self.consecutive_failures = 0
        self.started = clock()

    # --- lifecycle -------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or ``stop()``); returns the exit code."""
        from .gitops import SnapshotRepo
        from .pushq import PushQueue

        self._install_signals()  # first: a SIGTERM during start-up must still stop cleanly
        _lower_priority(self.config.daemon.nice)
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
        self.pushq = PushQueue(self.repo, self.config.repo.remotes, self.config.push,
                               on_pushed=self._on_pushed, run=self.config.snapshot.run)
        self.repo.clear_stale_locks(min_age=2)  # git killed with a previous daemon
        configure_repo(self.repo_dir, self.config.repo.compression)
        observer = self._watch()
        try:
            self._sync_state()
            for gen in self.state.in_state(COMMITTED, PUSHED):
                missing = self.remotes - gen.pushed
                if missing:
                    self.pushq.enqueue(gen.gen, remotes=sorted(missing))
            self.pushq.start()
            log.info("daemon started: spool=%s repo=%s remotes=%s", self.spool_dir,
                     self.repo_dir, ",".join(sorted(self.remotes)) or "-")
            while not self.stopping():
                self.step()
                self._idle(self.config.daemon.poll_interval)
        finally:
            log.info("daemon stopping")
            if observer is not None:
                observer.stop()
                observer.join()
            self.pushq.stop(wait=True)
            self._sync_state()
            self.write_status()
            self.wal.close()
            os.close(lock)
        return 0

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def stopping(self) -> bool:
        return self.signalled or self.stop_event.is_set()

    def _idle(self, seconds: float) -> None:
        """Wait for a wake-up, in short slices so a signal is noticed within 0.2 s."""
        deadline = time.monotonic() + seconds
        while not self.stopping() and time.monotonic() < deadline:
            if self.wake.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
                break
        self.wake.clear()

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
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a dependency
            return None
        wake = self.wake

        class Wake(FileSystemEventHandler):
            def on_any_event(self, event):
                wake.set()

        observer = Observer()
        observer.schedule(Wake(), str(self.spool_dir), recursive=False)
        observer.daemon = True
        observer.start()
        return observer

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        def request_stop(*_):
            # Event.set() here could deadlock on a lock the interrupted main thread holds.
            self.signalled = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, request_stop)

    # --- one pass --------------------------------------------------------------------------
    def _sync_state(self) -> None:
        for record in self.reader.read_new():
            self.state.apply(record)

    def step(self) -> None:
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
                          [run_dir(self.config), ledger_path(self.config)])
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
            commit = self.repo.commit_generation(written.paths, message, tag)
            set_delta_attributes(self.repo_dir, self.config.repo.delta, written.dense)
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
        data = json.dumps(self.status(), indent=2, sort_keys=True).encode() + b"\n"
        try:
            atomic_write_bytes(self.state_dir / "status.json", data)
        except OSError as exc:
            log.error("cannot write status: %s", exc)


def _lower_priority(nice: int) -> None:
    """Run (with git children) below the training process so it keeps the CPU."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > current:
        os.setpriority(os.PRIO_PROCESS, 0, nice)


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
