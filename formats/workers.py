"""Run one function over many items on helper threads, safe against Ctrl-C in the caller.

Why not ``ThreadPoolExecutor.map``: CPython may raise KeyboardInterrupt just after a ``with
lock:`` took its lock and before the block began (gh-74174). The executor's submit and its
futures take such locks in the caller's thread; a lock left taken there makes a worker wait
for it forever, and the shutdown that joins the worker with it (an interrupted save hung).
Here the caller and the helpers share only ``queue.SimpleQueue`` objects, which lock in C,
and a list used as a flag. Pools that stream (a window of futures, callbacks) stay executors.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def run_all(fn: Callable[[Item], Result], items: Iterable[Item], workers: int,
            name: str) -> list[Result]:
    """``[fn(item) for item in items]``, computed by up to ``workers`` threads (named
    ``name-N``), started in the items' order. The first exception is raised once every
    running call has ended; items not started by then are skipped (also on an interrupt).

    >>> run_all(lambda n: n * n, range(5), workers=2, name="square")
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

    def work() -> None:
        while True:
            try:
                index, item = todo.get_nowait()
            except queue.Empty:
                return
            if stopped:
                done.put((index, False, None))
                continue
            try:
                done.put((index, True, fn(item)))
            except BaseException as exc:            # handed to the caller, which raises it
                done.put((index, False, exc))

    threads = [threading.Thread(target=work, name=f"{name}-{n}", daemon=True)
               for n in range(min(workers, len(items)))]
    results: list = [None] * len(items)
    failure: BaseException | None = None
    try:
        for thread in threads:
            thread.start()
        for _ in items:
            index, ok, value = done.get()
            if ok:
                results[index] = value
            elif value is not None and failure is None:
                failure = value
                stopped.append(True)
    finally:
        stopped.append(True)
        for thread in threads:
            if thread.ident is not None:
                thread.join()
    if failure is not None:
        raise failure
    return results
