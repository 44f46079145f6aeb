"""Helper threads that a Ctrl-C in the thread feeding them cannot wedge, and a parallel map
built on them.

Why not ``ThreadPoolExecutor``: CPython may raise KeyboardInterrupt just after a ``with
lock:`` took its lock and before the block began (gh-74174). The executor's submit and its
futures take such locks in the caller's thread; a lock left taken there makes a worker wait
for it forever, and the shutdown that joins the worker with it (an interrupted save hung).
Here the caller and the helpers share only ``queue.SimpleQueue`` objects, which lock in C,
and a list used as a flag. Helpers are daemons, kept idle and reused: ``Thread.start`` waits
on a lock too (a thread started per write turned 1 Ctrl-C in 473 into CPython's
``RuntimeError: release unlocked lock``). Pools that stream (a window of futures, callbacks)
use :class:`HelperPool`, an ``Executor`` on the same helpers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from concurrent.futures import Executor, Future
from typing import Callable, Iterable, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
_FINISHED = "finished"


class Helper:
    """A daemon thread running the calls put in ``calls``, in order (a call reports its own
    outcome, e.g. through a queue it was given)."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="helper", daemon=True).start()

    def _serve(self) -> None:
        while True:
            call = self.calls.get()
            with contextlib.suppress(BaseException):
                call()
            del call            # an idle helper holds no piece of anyone's memory


_IDLE: queue.SimpleQueue = queue.SimpleQueue()


def _forget_idle() -> None:
    """A forked child has none of its parent's threads: their helpers would never run."""
    global _IDLE
    _IDLE = queue.SimpleQueue()


os.register_at_fork(after_in_child=_forget_idle)


def lend_helper() -> Helper:
    """An idle helper, or a new one."""
    try:
        return _IDLE.get_nowait()
    except queue.Empty:
        return Helper()


def give_back(helper: Helper, *, now: bool = False) -> None:
    """Idle again once it has run every call put so far; ``now``: the caller knows they have
    run (the last may still be returning: a call put next waits that long)."""
    if now:
        _IDLE.put(helper)
    else:
        helper.calls.put(functools.partial(_IDLE.put, helper))


def idle_helpers() -> int:
    return _IDLE.qsize()


def run_all(fn: Callable[[Item], Result], items: Iterable[Item], workers: int) -> list[Result]:
    """``[fn(item) for item in items]``, computed by up to ``workers`` helpers, started in
    the items' order. The first exception is raised once every running call has ended; items
    not started by then are skipped (also on an interrupt).

    >>> run_all(lambda n: n * n, range(5), workers=2)
    [0, 1, 4, 9, 16]
    """
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for index, item in enumerate(items):
        todo.put((index, item))
    done: queue.SimpleQueue = queue.SimpleQueue()     # (index, ok, result or exception)
    stopped: list[bool] = []         # appended to once: start nothing more

    def work(helper: Helper) -> None:
        while True:
            try:
                index, item = todo.get_nowait()
            except queue.Empty:
                give_back(helper, now=True)     # before the caller goes on: ready for reuse
                done.put(_FINISHED)
                return
            if stopped:
                done.put((index, False, None))
                continue
            try:
                done.put((index, True, fn(item)))
            except BaseException as exc:            # handed to the caller, which raises it
                done.put((index, False, exc))

    results: list = [None] * len(items)
    failure: BaseException | None = None
    running = 0
    try:
        for _ in range(min(workers, len(items))):
            helper = lend_helper()
            helper.calls.put(functools.partial(work, helper))
            running += 1
        while running:
            outcome = done.get()
            if outcome is _FINISHED:
                running -= 1
                continue
            index, ok, value = outcome
            if ok:
                results[index] = value
            elif value is not None and failure is None:
                failure = value
                stopped.append(True)
    finally:
        stopped.append(True)
        while running:          # interrupted: let the running calls end, start no more
            running -= done.get() is _FINISHED
    if failure is not None:
        raise failure
    return results


class HelperPool(Executor):
    """``ThreadPoolExecutor``'s ``submit``, ``map`` and ``shutdown`` on lent helpers, for
    pools that stream (a window of futures): up to ``workers`` calls at once, in submission
    order. ``submit`` takes no Python-level lock (a new Future and a ``SimpleQueue.put``), so
    a Ctrl-C in it leaves nothing taken; a call is counted as run before its future is set,
    so ``shutdown(wait=True)`` returns even when a Ctrl-C in the caller's ``result()`` left
    that future's lock taken (the helper setting it is then lost: a daemon, it cannot hold up
    the program's exit). Counts are list lengths, which an interrupt between two statements
    cannot leave wrong by more than the call it interrupted. Idle helpers go back for reuse.

    >>> with HelperPool(2) as pool:
    ...     [f.result() for f in [pool.submit(pow, 2, n) for n in range(4)]]
    [1, 2, 4, 8]
    """

    def __init__(self, workers: int) -> None:
        self._workers = max(1, workers)
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()    # (future, call) or None
        self._wake: queue.SimpleQueue = queue.SimpleQueue()     # a call ran: look again
        self._queued: list[bool] = []
        self._ran: list[bool] = []
        self._helpers: list[bool] = []
        self._closed: list[bool] = []       # appended to once: shut down

    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future = Future()
        self._tasks.put((future, functools.partial(fn, *args, **kwargs)))
        self._queued.append(True)
        if len(self._helpers) < self._workers:
            self._helpers.append(True)
            helper = lend_helper()
            helper.calls.put(functools.partial(self._serve, helper))
        return future

    def _serve(self, helper: Helper) -> None:
        while (task := self._tasks.get()) is not None:
            future, call = task
            del task
            if future.set_running_or_notify_cancel():      # else cancelled while queued
                try:
                    result = call()
                except BaseException as exc:    # the caller sees it through the future
                    self._counted()
                    future.set_exception(exc)
                else:
                    self._counted()
                    future.set_result(result)
                    del result
            else:
                self._counted()
            del future, call
        give_back(helper, now=True)

    def _counted(self) -> None:
        self._ran.append(True)
        self._wake.put(True)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._closed:
            self._closed.append(True)
            if cancel_futures:
                self._cancel_queued()
            for _ in self._helpers:
                self._tasks.put(None)
        while wait and len(self._ran) < len(self._queued):
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=0.1)

    def _cancel_queued(self) -> None:
        """Cancel what no helper has started (counted as run here: no helper sees it)."""
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if task is not None:
                task[0].cancel()
                self._ran.append(True)
