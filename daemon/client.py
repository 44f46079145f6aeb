"""The training side: ``Snapshotter.request(state, gen)`` pins a copy and returns at once.

The only hot-path costs are one copy of the arrays into recycled buffers and one WAL
``write()``; a spool thread writes pinned generations to the spool folder (zero-encoding,
fsynced, atomic) and records SPOOLED. At most ``max_in_flight`` generations wait for the spool
thread: with ``policy="coalesce"`` a newer request replaces the newest waiting one (recorded
as DROPPED ... reason=coalesced), with ``policy="block"`` ``request`` waits for room.
A failure to spool one generation (disk full) costs that generation only.

A script that ends without ``close()`` (a normal end, an uncaught exception, ``sys.exit``) still
spools what it handed over: the spool thread is a daemon thread and an ``atexit`` hook closes
every live Snapshotter of the process, waiting at most ``EXIT_TIMEOUT`` seconds in all. What it
then gives up on (a hanging disk) stays in REQ and is retired by the daemon (``abandoned``, or
SPOOLED if its spool file is complete); problems are one line on stderr, never a traceback.

Multi-rank training: each rank has its own Snapshotter (``rank=``, ``world_size=``, or taken
from ``torch.distributed`` when it is initialised) on its machine's spool, and requests its part
of each generation: whole arrays it owns, and :class:`Shard` s (its box of a global array). The
daemon commits a generation once every rank's part is spooled.
"""

from __future__ import annotations

import atexit
import collections
import functools
import logging
import math
import numbers
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from snapops.formats.atomic import remove_leftover_temps
from snapops.formats.dtypes import dtype_name
from snapops.formats.errors import ConfigError, DataError, SnapopsError, short_repr
from snapops.formats.generation.plan import Shard
from snapops.formats.iosafe import shown, user_path
from snapops.formats.tensors import tensor_to_numpy

from .lifecycle import DROPPED, REQ, SPOOLED
from .redact import redact_url
from .spool import DTYPES as SPOOL_DTYPES
from .spool import LOGICAL, MAX_RANK, check_request, spool_name, write_spool
from .wal import Wal, WalError, error_token, replay
from .writers import WriterLock, retire_unfinished

log = logging.getLogger("snapops.client")
WAL_NAME = "wal.log"
MAX_WORLD = MAX_RANK + 1      # writer ids are at most 6 digits
MAX_TIME = 253402300799       # 9999-12-31T23:59:59Z: the last time a spool's meta.ts can say
NICE = (-20, 19)              # setpriority's range
EXIT_TIMEOUT = 60.0           # seconds the exit hook waits for unclosed Snapshotters, in all


class SpoolFailed(SnapopsError):
    """Generations that could not be written to the spool (recorded DROPPED spool_failed)."""

    def __init__(self, failed: list[tuple[int, str]]) -> None:
        self.failed = failed
        gens = ", ".join(str(gen) for gen, _ in failed)
        super().__init__(f"spool writer failed for gen {gens}: {failed[-1][1]}")


class SpoolThreadDied(SnapopsError):
    """The spool thread stopped on an unexpected error: this Snapshotter spools nothing more
    (``close()`` it and open a new one); the generations it held are recorded DROPPED."""


Boxes = dict[str, tuple[tuple[int, ...], tuple[int, ...]]]   # name -> (global shape, offsets)
SPOOLABLE = [dtype_name(np.dtype(d)) for d in sorted(SPOOL_DTYPES)] + list(LOGICAL)


@dataclass
class Pinned:
    gen: int
    arrays: dict[str, np.ndarray]
    logical: dict[str, str]      # arrays held as their unsigned bits: {name: dtype name}
    ts: str
    nbytes: int
    boxes: Boxes


class BufferPool:
    """Recycles whole generations of pinned buffers by layout (names, shapes, dtypes), so
    the copy of a state lands in warm memory instead of fresh pages."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: dict[tuple, list[dict[str, np.ndarray]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def layout(arrays: dict[str, np.ndarray]) -> tuple:
        return tuple((name, a.shape, a.dtype.str) for name, a in arrays.items())

    def take(self, layout: tuple) -> dict[str, np.ndarray] | None:
        with self._lock:
            free = self._free.get(layout)
            return free.pop() if free else None

    def give(self, arrays: dict[str, np.ndarray]) -> None:
        key = self.layout(arrays)
        with self._lock:
            free = self._free.setdefault(key, [])
            if len(free) < self.keep:
                free.append(arrays)


def _state_items(state: Any):
    if hasattr(state, "state_dict") and callable(state.state_dict):
        state = state.state_dict()
    if not isinstance(state, Mapping):
        raise DataError(f"expected a mapping of arrays (or a module), got {type(state).__name__}")
    return state.items()


def pin(state: Any, pool: BufferPool, gen: int = 0, meta: dict | None = None
        ) -> tuple[dict[str, np.ndarray], dict[str, str], Boxes]:
    """Copy every array (numpy, or torch on CPU/CUDA; a Shard's local part) into host buffers
    the caller owns; returns them, the dtype names of the arrays held as their unsigned bits
    (bf16, c64, float8) and the boxes of the Shards.
    Before copying, the layout must pass the spool's own rules (:func:`check_request`) for
    generation ``gen``: what the daemon would refuse is refused here, with DataError."""
    sources, logical, boxes = {}, {}, {}
    for name, value in _state_items(state):
        if not isinstance(name, str):
            raise DataError(f"array names must be str, got {name!r}")
        if isinstance(value, Shard):
            boxes[name] = (value.global_shape, value.offsets)
            value = value.local
        if hasattr(value, "detach") and hasattr(value, "cpu"):
            direct = _tensor_source(value)
            if direct is not None:
                sources[name], is_bf16 = direct
                if is_bf16:
                    logical[name] = "bf16"
                continue
            value = tensor_to_numpy(value, name)  # what snapops.save does (DataError if not)
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            raise DataError(f"array {name!r}: expected an array or tensor, got "
                            f"{type(value).__name__} that is no rectangular array") from None
        kept_as = LOGICAL.get(dtype_name(array.dtype))
        if kept_as is not None:  # travels as its bits, its dtype named in the spool
            logical[name] = dtype_name(array.dtype)
            array = array.astype(_le(array.dtype), copy=False).view(kept_as)
        elif _le(array.dtype).str not in SPOOL_DTYPES:
            raise DataError(f"array {name!r}: dtype {array.dtype} cannot be "
                            f"snapshotted (a spool holds {', '.join(SPOOLABLE)})")
        sources[name] = array
    check_request(gen, [(n, _le(a.dtype).str, tuple(a.shape), logical.get(n), boxes.get(n))
                        for n, a in sources.items()], meta)
    layout = tuple((n, a.shape, _le(a.dtype).str) for n, a in sources.items())
    buffers = pool.take(layout) or {n: np.empty(a.shape, _le(a.dtype))
                                    for n, a in sources.items()}
    for name, source in sources.items():
        _copy(buffers[name], source)
    return buffers, logical, boxes


def _le(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def _copy(dst: np.ndarray, src) -> None:
    if isinstance(src, np.ndarray):
        np.copyto(dst, src, casting="equiv")
        return
    import torch  # a CPU tensor: copy straight into the pinned numpy buffer

    target = dst.view(np.int16) if dst.dtype == np.uint16 and src.tensor.dtype == torch.int16 \
        else dst
    torch.from_numpy(target).copy_(src.tensor)


def _tensor_source(tensor):
    """(a numpy array (device tensors: copied to host) or a CPU tensor to copy from, is bf16);
    None for what takes the general conversion (sparse, quantized, meta, other dtypes)."""
    import torch

    t = tensor.detach()
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta" or \
            t.dtype not in _direct_dtypes(torch):
        return None
    is_bf16 = t.dtype == torch.bfloat16
    if is_bf16:
        t = t.view(torch.int16)
    if t.device.type != "cpu":
        host = t.to("cpu").numpy()  # the device-to-host transfer
        return (host.view(np.uint16) if is_bf16 else host), is_bf16
    if is_bf16:
        return _TensorRef(t, np.dtype(np.uint16)), True
    return _TensorRef(t, torch.empty((), dtype=t.dtype).numpy().dtype), False


@functools.cache
def _direct_dtypes(torch) -> frozenset:
    """torch dtypes that copy straight into a spool buffer (the spool's dtypes, and bf16)."""
    return frozenset(getattr(torch, n) for n in (
        "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
        "uint64", "uint32", "uint16", "uint8", "bool") if hasattr(torch, n))


class _TensorRef:
    """A CPU tensor with the numpy-facing shape/dtype the pool needs."""

    def __init__(self, tensor, dtype: np.dtype) -> None:
        self.tensor, self.shape, self.dtype = tensor, tuple(tensor.shape), dtype


def rank_ids(world_size: int) -> frozenset[str]:
    """The writer ids of the ranks of a world: ``{"0", ..., "<world_size - 1>"}``."""
    return frozenset(str(r) for r in range(world_size))


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size) as given, else from an initialised ``torch.distributed``, else (0, 1)."""
    if rank is None and world_size is None:
        rank, world_size = _torch_rank()
    if rank is None or world_size is None:
        raise DataError("give rank and world_size together (or neither)")
    for value, what in ((rank, "rank"), (world_size, "world_size")):
        if not isinstance(value, int) or isinstance(value, bool):
            raise DataError(f"{what} must be an int, got {value!r}")
    if not 0 <= rank < world_size <= MAX_WORLD:
        raise DataError(f"rank {rank} of world_size {world_size}: expected 0 <= rank < "
                        f"world_size <= {MAX_WORLD}")
    return rank, world_size


def _torch_rank() -> tuple[int, int]:
    import sys

    dist = sys.modules.get("torch.distributed")  # never import torch just to ask
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _timeout(timeout) -> float | None:
    if timeout is None:
        return None
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool) or \
            not 0 <= timeout <= threading.TIMEOUT_MAX:
        raise DataError(f"timeout: expected seconds in 0..{threading.TIMEOUT_MAX:.0f} or None, "
                        f"got {short_repr(timeout)}")
    return float(timeout)


def _spool_dir(spool_dir) -> Path:
    """The spool folder, created if missing; ConfigError for what cannot be one."""
    path = user_path(spool_dir, "spool_dir")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"spool_dir {shown(path)}: expected a folder that exists or can be "
                          f"created, got {exc.strerror or exc}") from None
    return Path(path)


class Snapshotter:
    """Hand generations to the snapops daemon without waiting for it.

    One Snapshotter per spool folder: a second one (in any process) is refused with
    WriterBusy while the first lives. A new one retires what a killed predecessor left
    unfinished (see :mod:`snapops.daemon.writers`). When a generation cannot be spooled (disk
    full, ...), it is recorded DROPPED ``reason=spool_failed``, the next ``flush()``/``close()``
    raises SpoolFailed naming it once, and later requests work again as soon as the disk does.

    Example::

        snap = Snapshotter("spool", max_in_flight=2)
        for step in range(1000):
            train_step()
            if step % 10 == 0:
                snap.request(model.state_dict(), gen=step)
        snap.close()

    With ranks, every rank requests every generation (the same gen numbers), e.g. its rows of
    an embedding plus the arrays it alone owns::

        snap = Snapshotter("spool", rank=1, world_size=4)
        snap.request({"emb": Shard(emb_rows, global_shape=(4096, 512), offsets=(1024, 0))}, 7)
    """

    def __init__(self, spool_dir: str | os.PathLike, *, max_in_flight: int = 2,
                 policy: str = "coalesce", spool_nice: int = 19, clock=time.time,
                 rank: int | None = None, world_size: int | None = None) -> None:
        if not isinstance(policy, str) or policy not in ("coalesce", "block"):
            raise DataError(f"policy: expected coalesce or block, got {short_repr(policy)}")
        if not _is_int(max_in_flight) or max_in_flight < 1:
            raise DataError(f"max_in_flight: expected an int >= 1, got {short_repr(max_in_flight)}")
        if not _is_int(spool_nice) or not NICE[0] <= spool_nice <= NICE[1]:
            raise ConfigError(f"spool_nice: expected an int in {NICE[0]}..{NICE[1]} (a nice "
                              f"value), got {short_repr(spool_nice)}")
        if not callable(clock):
            raise ConfigError(f"clock: expected a callable returning seconds since the epoch "
                              f"(like time.time), got {short_repr(clock)}")
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.spool_dir = _spool_dir(spool_dir)
        self.max_in_flight, self.policy, self.clock = max_in_flight, policy, clock
        self.spool_nice = spool_nice
        self.writer = str(self.rank)
        self._writer_lock = WriterLock(self.spool_dir, self.writer)
        try:
            self.wal = Wal(self.spool_dir / WAL_NAME, writer=self.writer)
            state, _ = replay(self.spool_dir / WAL_NAME, rank_ids(self.world_size),
                              world=self.world_size)
            retire_unfinished(self.wal, state, self.spool_dir, self.writer)
        except BaseException:
            self._writer_lock.release()
            raise
        remove_leftover_temps(self.spool_dir)
        self.last_gen = state.last_gen(self.writer)
        self.pool = BufferPool(keep=max_in_flight + 1)
        self.failures: list[tuple[int, str]] = []     # (gen, error) never spooled, all time
        self._unreported: list[tuple[int, str]] = []  # ... not yet raised by flush()
        self._unrecorded: list[tuple[str, int, dict]] = []  # WAL records that hit a full disk
        self._pending: collections.deque[Pinned] = collections.deque()
        self._busy = False
        self._closed = False
        self._died: str | None = None  # what killed the spool thread
        self._current: Pinned | None = None  # the generation it is writing
        self._lost: list[int] = []     # the generations it held then
        self._cond = threading.Condition()
        self._pid = os.getpid()  # a forked child inherits this object but not its thread
        # a daemon thread: Python joins non-daemon threads before atexit hooks run, so one
        # would wait forever for a close() that never comes; _close_live_at_exit closes instead
        self._thread = threading.Thread(target=self._run, name="snapops-spool", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def request(self, state: Any, gen: int) -> None:
        """Pin ``state`` as generation ``gen`` (> every earlier gen) and return."""
        if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
            raise DataError(f"gen must be an int >= 0, got {short_repr(gen)}")
        with self._cond:
            self._check_alive()
        ts = self._timestamp()
        arrays, logical, boxes = pin(state, self.pool, int(gen), self._meta(ts))
        pinned = Pinned(gen, arrays, logical, ts, sum(a.nbytes for a in arrays.values()), boxes)
        with self._cond:
            try:
                self._admit(pinned)
            except BaseException:
                self.pool.give(arrays)
                raise
            self._cond.notify_all()

    def _timestamp(self) -> str:
        try:
            now = self.clock()
        except Exception as exc:
            raise ConfigError(f"clock() raised {type(exc).__name__}: {str(exc)[:80]}; expected "
                              "seconds since the epoch") from exc
        if not isinstance(now, numbers.Real) or isinstance(now, bool) or \
                not (math.isfinite(now) and 0 <= now <= MAX_TIME):
            raise ConfigError(f"clock() returned {short_repr(now)}: expected seconds since the "
                              f"epoch (a real number in 0..{MAX_TIME})")
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(now)))

    def _meta(self, ts: str) -> dict:
        ranked = self.world_size > 1
        return {"ts": ts, **({"rank": self.rank, "world": self.world_size} if ranked else {})}

    def _admit(self, pinned: Pinned) -> None:
        """Under the lock: order, room, the REQ record, coalescing; then queue ``pinned``."""
        self._check_request(pinned.gen)
        if self.policy == "block":
            while len(self._pending) >= self.max_in_flight and not self._closed and \
                    self._died is None:
                self._cond.wait()
            self._check_request(pinned.gen)  # the world may have changed while waiting
        self._append_pending()
        world = {"world": self.world_size} if self.world_size > 1 else {}
        self.wal.append(REQ, pinned.gen, pid=os.getpid(), arrays=len(pinned.arrays),
                        bytes=pinned.nbytes, **world)
        self.last_gen = pinned.gen
        if len(self._pending) >= self.max_in_flight:
            dropped = self._pending.pop()
            self._append(DROPPED, dropped.gen, reason="coalesced", by=pinned.gen)
            self.pool.give(dropped.arrays)
        self._pending.append(pinned)

    def _check_request(self, gen: int) -> None:
        if self._closed:
            raise SnapopsError("Snapshotter is closed")
        self._check_alive()
        if gen <= self.last_gen:
            raise DataError(f"gen {gen} is not greater than the last requested gen "
                            f"{self.last_gen}")

    def _check_alive(self) -> None:
        """Under the lock: SpoolThreadDied once the spool thread is gone."""
        if self._died is not None:
            lost = f"; generations {self._lost} were not spooled" if self._lost else ""
            raise SpoolThreadDied(f"the spool thread died ({self._died}){lost}: expected a "
                                  "live spool thread, close() this Snapshotter and open a new one")

    def _append(self, event: str, gen: int, **fields) -> None:
        """Append a record; one that fails (disk full) is kept and appended again later."""
        try:
            self._append_pending()
            self.wal.append(event, gen, **fields)
        except WalError as exc:
            log.error("cannot record %s gen %d yet: %s", event, gen, exc)
            self._unrecorded.append((event, gen, fields))

    def _append_pending(self) -> None:
        while self._unrecorded:
            event, gen, fields = self._unrecorded[0]
            self.wal.append(event, gen, **fields)
            self._unrecorded.pop(0)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug or a broken environment: never a silent hang
            reason = redact_url(f"{type(exc).__name__}: {exc}")[:200]
            log.error("the spool thread died: %s", reason)
            with self._cond:
                self._died, self._busy = reason, False
                lost = ([self._current] if self._current else []) + list(self._pending)
                self._current, self._pending = None, collections.deque()
                self._lost.extend(item.gen for item in lost)
                self.failures.extend((item.gen, reason) for item in lost)
                self._cond.notify_all()
                try:
                    for item in lost:
                        self._append(DROPPED, item.gen, reason="spool_failed",
                                     error=error_token(reason))
                except Exception as record_exc:  # the daemon retires what stays unrecorded
                    log.error("cannot record the lost generations: %s", record_exc)

    def _loop(self) -> None:
        try:  # Linux: niceness is per thread; the training threads keep the CPU
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.spool_nice)
        except (OSError, AttributeError):
            pass
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                item = self._pending.popleft()
                self._busy = True
                self._cond.notify_all()
            self._current = item
            try:
                self._spool(item)
                self._current = None
            finally:
                self.pool.give(item.arrays)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _spool(self, item: Pinned) -> None:
        """Write one generation and record SPOOLED; on failure record it DROPPED."""
        ranked = self.world_size > 1
        name = spool_name(item.gen, self.rank if ranked else None)
        meta = self._meta(item.ts)
        try:
            size = write_spool(self.spool_dir / name, item.gen, item.arrays, meta, item.logical,
                               item.boxes)
        except Exception as exc:  # disk full, permissions: this gen is lost, the next may not be
            error = redact_url(str(exc))
            log.error("spooling gen %d failed: %s", item.gen, error)
            with self._cond:
                self.failures.append((item.gen, error))
                self._unreported.append((item.gen, error))
                self._append(DROPPED, item.gen, reason="spool_failed", error=error_token(error))
            return
        with self._cond:
            self._append(SPOOLED, item.gen, file=name, bytes=size)
        try:
            self.wal.sync()
        except OSError as exc:
            log.error("cannot sync the WAL: %s", exc)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every pinned generation is spooled; False on timeout. Raises SpoolFailed
        (once) if generations could not be spooled since the last flush, SpoolThreadDied (every
        time) once the spool thread is gone."""
        timeout = _timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._pending or self._busy) and self._died is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            self._check_alive()
            failed, self._unreported = self._unreported, []
        if failed:
            raise SpoolFailed(failed)
        return True

    def close(self, timeout: float | None = None) -> None:
        """Spool everything still pinned, then stop the spool thread (raises like flush)."""
        timeout = _timeout(timeout)
        _LIVE.discard(self)
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join(timeout)
            with self._cond:
                try:
                    self._append_pending()
                except WalError as exc:
                    log.error("records lost on close (the daemon retires them): %s", exc)
            self.wal.close()
            self._writer_lock.release()

    def _close_at_exit(self, timeout: float) -> str | None:
        """close() for the exit hook: spool what is pinned within ``timeout`` seconds, else give
        up on it (the daemon retires it); release the lock. Returns a problem, never raises."""
        with self._cond:
            if self._closed:
                return None
        problem = None
        try:
            done = self.flush(timeout)
        except SnapopsError as exc:  # SpoolFailed, SpoolThreadDied: the spool thread is idle
            problem, done = str(exc), True
        if not done:
            with self._cond:  # never start the queued ones; the one being written may finish
                left = ([self._current.gen] if self._current else []) + \
                    [item.gen for item in self._pending]
                for item in self._pending:
                    self.pool.give(item.arrays)
                self._pending.clear()
            problem = (f"gave up waiting for the spool thread (EXIT_TIMEOUT {EXIT_TIMEOUT:g} s):"
                       f" generations {left} not spooled, the daemon retires them (abandoned)")
        try:
            self.close(timeout if done else 0.0)
        except SnapopsError as exc:
            problem = problem or str(exc)
        return problem

    def __enter__(self) -> "Snapshotter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_LIVE: "weakref.WeakSet[Snapshotter]" = weakref.WeakSet()  # not closed yet


def _close_live_at_exit() -> None:
    """At interpreter exit: close every Snapshotter this process did not close, within
    EXIT_TIMEOUT seconds in all; one stderr line per problem, never a traceback."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    for snap in list(_LIVE):
        try:
            if snap._pid != os.getpid():  # inherited through fork: the parent owns it
                continue
            problem = snap._close_at_exit(max(0.0, deadline - time.monotonic()))
        except BaseException as exc:  # Ctrl-C during the wait, a bug: still no traceback
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            try:
                line = redact_url(f"snapops: at exit, spool {snap.spool_dir}: {problem}")
                sys.stderr.write(line.replace("\n", " ") + "\n")
                sys.stderr.flush()
            except Exception:
                pass


atexit.register(_close_live_at_exit)
