"""Run the daemon (and, by inheritance, its git children) below the training process without
starving it: a CPU niceness, a CPU scheduling policy and an I/O class.

At nice 19 a daemon next to a training loop that saturates every core gets ~1.5% of a core
(CFS weight 15 against 1024) and a commit of a 128 MiB state took 47 s instead of 9 s; at nice
10 (weight 110) it keeps ~10%, enough for generations to keep flowing. ``SCHED_BATCH`` keeps
the weight but never preempts the trainer when the daemon wakes up. The I/O class
``best-effort`` at its lowest level yields the disk without ever starving (``idle`` only gets
disk time nobody else wants, which a data loader may never leave).

Called from the main thread before any other thread starts: Linux keeps these per thread and
every later thread and child inherits them, and nothing can take them back (so the example is
not a doctest: it would slow down whatever the test process runs next).

Example::

    lower_priority(nice=10, cpu_policy="batch", io_class="best-effort")
    # -> ['nice 10', 'cpu policy batch', 'io class best-effort 7']
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

__all__ = ["lower_priority"]

log = logging.getLogger(__name__)

_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "arm64": 30, "riscv64": 30, "ppc64le": 273,
               "ppc64": 273, "s390x": 282, "i686": 289, "i386": 289}
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_CLASS = {"best-effort": (2, 7), "idle": (3, 0)}
_IOPRIO_CLASS_SHIFT = 13


def _set_nice(nice: int) -> str | None:
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice <= current:
        return None  # never raise our priority back (an operator may have lowered it more)
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    return f"nice {nice}"


def _set_cpu_policy(policy: str) -> str | None:
    if policy != "batch" or not hasattr(os, "SCHED_BATCH"):
        return None
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    return "cpu policy batch"


def _set_io_class(io_class: str) -> str | None:
    number = _IOPRIO_SET.get(platform.machine())
    if io_class not in _IOPRIO_CLASS or number is None:
        return None
    klass, level = _IOPRIO_CLASS[io_class]
    # the C library this process already has (ctypes.util.find_library runs ldconfig)
    libc = ctypes.CDLL(None, use_errno=True)
    value = (klass << _IOPRIO_CLASS_SHIFT) | level
    if libc.syscall(number, _IOPRIO_WHO_PROCESS, 0, value) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return f"io class {io_class} {level}"


def lower_priority(*, nice: int, cpu_policy: str = "normal", io_class: str = "none"
                   ) -> list[str]:
    """Apply what the config asks for; what could not be applied is logged, not fatal.
    Returns what was applied."""
    applied = []
    for setter, value in ((_set_nice, nice), (_set_cpu_policy, cpu_policy),
                          (_set_io_class, io_class)):
        try:
            done = setter(value)
        except OSError as err:
            log.warning("cannot apply %s=%s: %s", setter.__name__[5:], value, err)
            continue
        if done:
            applied.append(done)
    return applied
