"""``run_all``: a parallel map that a Ctrl-C in the caller cannot wedge (formats.workers)."""

from __future__ import annotations

import gc
import queue
import subprocess
import sys
import threading
import time
import weakref

import pytest

from snapops.formats.workers import give_back, lend_helper, run_all
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


INTERRUPTED_MAPS = r"""
import faulthandler, random, signal, sys, time
from snapops.formats.workers import run_all

def interrupt(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
faulthandler.dump_traceback_later(60, exit=True)
rng, interrupted = random.Random(3), 0
for i in range(400):
    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 0.002))
    try:
        run_all(lambda n: time.sleep(0.0001) or n, range(64), 2)
    except KeyboardInterrupt:
        interrupted += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
print(interrupted)
"""


def test_ctrl_c_anywhere_in_the_caller_never_hangs_the_map():
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_MAPS], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) > 200, done.stdout


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
