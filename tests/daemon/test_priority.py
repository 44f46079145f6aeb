"""The daemon's priority settings, applied in a child process (they cannot be undone) and read
back from the kernel: niceness, scheduling policy and I/O class."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

READ_BACK = r"""
import ctypes, json, os, sys
from snapops.daemon.priority import lower_priority
applied = lower_priority(**json.loads(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
ioprio = libc.syscall(252, 1, 0)      # ioprio_get(IOPRIO_WHO_PROCESS, this process)
print(json.dumps({"applied": applied, "nice": os.getpriority(os.PRIO_PROCESS, 0),
                  "policy": os.sched_getscheduler(0), "io": [ioprio >> 13, ioprio & 0xFF]}))
"""

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="reads the I/O class with x86-64's ioprio_get number")


def applied_in_a_child(**settings) -> dict:
    out = subprocess.run([sys.executable, "-c", READ_BACK, json.dumps(settings)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(out)


BASE = os.getpriority(os.PRIO_PROCESS, 0)      # what a child starts with (0 unless niced)


def test_nice_batch_policy_and_best_effort_io_are_what_the_kernel_reports():
    got = applied_in_a_child(nice=10, cpu_policy="batch", io_class="best-effort")
    assert got["applied"] == ["nice 10"] * (BASE < 10) + ["cpu policy batch",
                                                           "io class best-effort 7"]
    assert got["nice"] == max(10, BASE) and got["policy"] == os.SCHED_BATCH
    assert got["io"] == [2, 7]


def test_idle_io_class_and_defaults_leave_the_rest_alone():
    got = applied_in_a_child(nice=0, io_class="idle")
    assert got["applied"] == ["io class idle 0"]
    assert got["nice"] == BASE and got["policy"] == os.sched_getscheduler(0)
    assert got["io"] == [3, 0]


def test_a_niceness_already_lower_is_never_raised_back():
    proc = subprocess.run(["nice", "-n", "15", sys.executable, "-c", READ_BACK,
                           json.dumps({"nice": 10})],
                          capture_output=True, text=True, check=True, timeout=60)
    got = json.loads(proc.stdout)
    assert got["applied"] == [] and got["nice"] == min(19, BASE + 15)
