"""What a running ``git push --progress`` has done so far, read from its progress lines.

git prints (CR-separated, at least once a second while bytes move)::

    Writing objects:  66% (12/18), 21.09 MiB | 1.83 MiB/s

:func:`parse_progress` turns one such line into its phase, percent and byte counts;
:class:`PushProgress` keeps the latest of them for one push (what ``daemon status`` shows as
the push in flight), and :func:`drain_estimate` turns bytes and a rate into seconds.

>>> parse_progress("Writing objects:  66% (12/18), 21.09 MiB | 1.83 MiB/s")
{'phase': 'Writing objects', 'percent': 66, 'sent': 22114468, 'rate': 1918894}
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

__all__ = ["PushProgress", "drain_estimate", "parse_progress"]

_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_LINE = re.compile(
    r"(?:remote: )?(?P<phase>[A-Z][A-Za-z ]+?):\s+(?P<percent>\d{1,3})% \(\d+/\d+\)"
    r"(?:, (?P<sent>[\d.]+) (?P<unit>bytes|[KMGT]iB)"
    r"(?: \| (?P<rate>[\d.]+) (?P<runit>bytes|[KMGT]iB)/s)?)?")


def _bytes(number: str | None, unit: str | None) -> int | None:
    if number is None or unit is None:
        return None
    return round(float(number) * _UNITS[unit])


def parse_progress(line: str) -> dict | None:
    """Phase, percent, bytes sent and rate (bytes/s) from one progress line, or None for any
    other line. Keys whose value git did not print are left out."""
    match = _LINE.match(line.strip())
    if match is None:
        return None
    found = {"phase": match["phase"], "percent": int(match["percent"]),
             "sent": _bytes(match["sent"], match["unit"]),
             "rate": _bytes(match["rate"], match["runit"])}
    return {key: value for key, value in found.items() if value is not None}


def drain_estimate(remaining: int, rate: float | None) -> float | None:
    """Seconds to send ``remaining`` bytes at ``rate`` bytes/s (None without a rate).

    >>> drain_estimate(3 << 20, 1 << 20)
    3.0
    """
    if not rate or rate <= 0:
        return None
    return max(0.0, remaining / rate)


@dataclass
class PushProgress:
    """One push: its generations, their estimated bytes, and the latest progress git printed.

    ``feed`` is called from the pushing thread; ``snapshot`` from any thread.

    >>> progress = PushProgress([3, 4], 2_000_000, started=100.0)
    >>> progress.feed("Writing objects:  50% (2/4), 1.00 MiB | 512.00 KiB/s")
    True
    >>> progress.snapshot(now=102.0)["sent"]
    1048576
    """

    gens: list[int]
    bytes: int
    started: float
    phase: str = "connecting"
    percent: int | None = None
    sent: int = 0
    rate: int | None = None
    last_line: str = ""
    mono: float = field(default_factory=time.monotonic)  # for durations
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def feed(self, line: str) -> bool:
        """Take one line of git's stderr; True when it was a progress line."""
        parsed = parse_progress(line)
        with self._lock:
            self.last_line = line[-200:]
            if parsed is None:
                return False
            self.phase = parsed["phase"]
            self.percent = parsed["percent"]
            if parsed["phase"] == "Writing objects":
                self.sent = max(self.sent, parsed.get("sent", 0))
                self.rate = parsed.get("rate", self.rate)
        return True

    def snapshot(self, now: float) -> dict:
        with self._lock:
            return {"gens": list(self.gens), "bytes": self.bytes, "started": self.started,
                    "seconds": max(0.0, now - self.started), "phase": self.phase,
                    "percent": self.percent, "sent": self.sent, "rate": self.rate,
                    "last_line": self.last_line}
