"""``run_all`` and ``HelperPool``: a parallel map and an executor that a Ctrl-C in the caller
cannot wedge (formats.workers)."""

from __future__ import annotations

import gc
import queue
import subprocess
import sys
import threading
import time
import weakref

import pytest

from snapops.formats.workers import HelperPool, give_back, lend_helper, run_all
from tests.formats.helper_threads import helper_threads, wait_helpers_idle


def test_results_come_in_the_items_order_whatever_finishes_first():
    def slow_first(n: int) -> int:
        time.sleep(0.02 if n == 0 else 0)
        return n * 10

    assert run_all(slow_first, range(6), 3) == [0, 10, 20, 30, 40, 50]


def test_the_calls_run_on_helper_threads_at_most_workers_at_once():
    running, most, lock = [0], [0], threading.Lock()
    names = set()

    def note(_):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            names.add(threading.current_thread().name)
        time.sleep(0.01)
        with lock:
            running[0] -= 1

    run_all(note, range(12), 3)
    assert most[0] <= 3 and names and threading.current_thread().name not in names


@pytest.mark.parametrize("workers", [0, 1])
def test_one_worker_runs_in_the_callers_thread(workers):
    assert run_all(lambda _: threading.current_thread().name, "ab", workers) == \
        [threading.current_thread().name] * 2


def test_the_first_failure_is_raised_and_later_items_are_skipped():
    started = []

    def fail_at_two(n: int) -> int:
        started.append(n)
        if n == 2:
            raise ValueError("item 2 is bad")
        time.sleep(0.005)
        return n

    with pytest.raises(ValueError, match="item 2 is bad"):
        run_all(fail_at_two, range(200), 2)
    assert 2 in started and len(started) < 200
    wait_helpers_idle()


def test_helpers_are_reused_from_one_map_to_the_next():
    run_all(abs, range(8), 2)
    wait_helpers_idle()
    before = helper_threads()
    for _ in range(50):
        assert run_all(abs, range(-4, 4), 2) == [4, 3, 2, 1, 0, 1, 2, 3]
    wait_helpers_idle()
    assert helper_threads() == before >= 2


def test_nested_maps_each_get_their_own_helpers():
    assert run_all(lambda n: sum(run_all(abs, range(-n, 0), 2)), range(1, 6), 2) == \
        [1, 3, 6, 10, 15]


INTERRUPTED = r"""
import faulthandler, random, signal, sys, time
from collections import deque
from snapops.formats.workers import HelperPool, run_all

armed = False

def interrupt(*_):
    # a timer that fired as a run ended is handled wherever Python is next: only a run is hit
    if armed:
        raise KeyboardInterrupt

def interrupted_runs(run, seed):
    # 400 runs, each interrupted at a random moment: how many were
    global armed
    rng, interrupted = random.Random(seed), 0
    for i in range(400):
        try:
            armed = True
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 0.002))
            try:
                run()
            finally:
                armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            interrupted += 1
        except RuntimeError as exc:     # Future.result interrupted inside Condition.wait
            if not isinstance(exc.__context__, KeyboardInterrupt):
                raise
            interrupted += 1
    return interrupted

def streaming(pool):
    # a window of futures, as the WTXT writer and reader keep
    try:
        window = deque()
        for n in range(64):
            window.append(pool.submit(lambda n: time.sleep(0.0001) or n, n))
            if len(window) > 4:
                window.popleft().result()
        while window:
            window.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

signal.signal(signal.SIGALRM, interrupt)
faulthandler.dump_traceback_later(60, exit=True)
"""


def assert_never_hangs(runs: str) -> None:
    """``runs`` (source text ending in a call of ``interrupted_runs``) in a child, whose
    stack is dumped and which exits when anything hangs for 60 s."""
    done = subprocess.run([sys.executable, "-c", INTERRUPTED + f"print({runs})"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) > 200, done.stdout


def test_ctrl_c_anywhere_in_the_caller_never_hangs_the_map():
    assert_never_hangs("interrupted_runs(lambda: run_all(lambda n: time.sleep(0.0001) or n, "
                       "range(64), 2), 3)")


def test_an_idle_helper_holds_no_reference_to_the_last_call():
    class Piece:
        def __call__(self) -> None:
            ran.put(True)

    ran: queue.SimpleQueue = queue.SimpleQueue()
    helper, piece = lend_helper(), Piece()
    gone = weakref.ref(piece)
    helper.calls.put(piece)
    del piece
    assert ran.get(timeout=10)
    give_back(helper, now=True)
    deadline = time.monotonic() + 10
    while gone() is not None:       # the helper drops the call as soon as it returned
        assert time.monotonic() < deadline, "an idle helper keeps its last call alive"
        gc.collect()
        time.sleep(0.005)


# -- HelperPool: the executor of the streaming pools ---------------------------------------


def test_a_helper_pool_runs_calls_on_helpers_at_most_workers_at_once():
    running, most, lock = [0], [0], threading.Lock()

    def note(n):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.005)
        with lock:
            running[0] -= 1
        return threading.current_thread().name, n

    with HelperPool(2) as pool:
        futures = [pool.submit(note, n) for n in range(10)]
        results = [f.result(timeout=30) for f in futures]
    assert [n for _, n in results] == list(range(10))
    assert {name for name, _ in results} == {"helper"} and most[0] == 2
    with HelperPool(2) as pool:
        assert list(pool.map(lambda n: n + 1, range(5))) == [1, 2, 3, 4, 5]
    wait_helpers_idle()


def test_a_helper_pool_reports_failures_cancels_what_waits_and_refuses_after_shutdown():
    gate = threading.Event()
    pool = HelperPool(1)
    failing = pool.submit(lambda: 1 / 0)
    blocking = pool.submit(gate.wait, 30)
    waiting = [pool.submit(lambda: "never") for _ in range(3)]
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        failing.result(timeout=30)
    gate.set()
    pool.shutdown(wait=True, cancel_futures=True)
    assert blocking.result() is True
    assert all(f.cancelled() or f.result() == "never" for f in waiting)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)
    wait_helpers_idle()


def test_shutdown_returns_though_a_ctrl_c_left_a_futures_lock_taken():
    """What a Ctrl-C inside ``result()`` can leave behind: the future's lock, taken by the
    caller. The helper then cannot set the future; the pool's shutdown does not wait for
    that (a ThreadPoolExecutor joins its thread: forever)."""
    pool = HelperPool(1)
    started = threading.Event()
    future = pool.submit(lambda: started.set() or time.sleep(0.05) or 7)
    assert started.wait(30)
    future._condition.acquire()          # as if interrupted right after taking it
    ended = threading.Event()
    threading.Thread(target=lambda: pool.shutdown(wait=True) or ended.set(),
                     daemon=True).start()
    try:
        assert ended.wait(30), "shutdown waited for a future nobody can set"
    finally:
        future._condition.release()
    assert future.result(timeout=30) == 7


def test_ctrl_c_anywhere_in_a_streaming_loop_never_hangs_its_pool():
    assert_never_hangs("interrupted_runs(lambda: streaming(HelperPool(2)), 5)")
