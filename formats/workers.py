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
stay executors.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
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
