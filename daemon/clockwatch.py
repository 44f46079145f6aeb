"""Steps of the wall clock under a running daemon, and moving what was scheduled by it.

apscheduler 3 schedules by the wall clock: when the clock is set back an hour (an NTP
correction at boot, a VM resumed from a snapshot, ``date -s``), a push retry due in three
seconds runs an hour late, and a cleanup too. The daemon's loop asks :class:`ClockWatch` on
every pass whether the wall clock moved against the monotonic one; on a step,
:func:`shift_jobs` moves every scheduled job by the same amount, so each still runs after its
real delay. NTP's slewing moves the clock by at most half a millisecond a second, far below
``TOLERANCE``.

>>> wall = iter([100.0, 101.0, 3702.0]).__next__
>>> mono = iter([50.0, 51.0, 52.0]).__next__
>>> watch = ClockWatch(wall, mono)
>>> watch.look(), watch.look()
((101.0, 0.0), (3702.0, 3600.0))
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable

from apscheduler.jobstores.base import JobLookupError

TOLERANCE = 2.0      # seconds of disagreement taken as a step, not as drift
CHECK_EVERY = 5.0    # seconds between looks while a push retry is scheduled


class ClockWatch:
    """The wall clock's offset from the monotonic clock, remembered from look to look."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self._wall, self._mono = wall, mono
        self._offset = wall() - mono()

    def look(self) -> tuple[float, float]:
        """The wall clock now, and the seconds it jumped since the last look (negative: set
        back; 0.0 below ``TOLERANCE``), from one reading: a time compared with a WAL stamp
        is never read across a step not yet seen."""
        wall = self._wall()
        offset = wall - self._mono()
        moved, self._offset = offset - self._offset, offset
        return wall, moved if abs(moved) >= TOLERANCE else 0.0


def shift_jobs(scheduler, seconds: float) -> int:
    """Move every job of ``scheduler`` (apscheduler 3) by ``seconds``; how many moved."""
    moved = 0
    for job in scheduler.get_jobs():
        if job.next_run_time is None:
            continue
        try:
            job.modify(next_run_time=job.next_run_time + timedelta(seconds=seconds))
        except JobLookupError:        # a one-off job that ran meanwhile
            continue
        except OverflowError:         # a step beyond the years datetime holds: left as it was
            continue
        moved += 1
    return moved
