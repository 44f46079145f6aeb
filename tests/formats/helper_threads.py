"""The reusable helper threads of formats/workers.py, as tests see them."""

from __future__ import annotations

import threading
import time

from snapops.formats.workers import idle_helpers


def helper_threads() -> int:
    return len([t for t in threading.enumerate() if t.name == "helper"])


def wait_helpers_idle(*, but_for: str | None = None) -> None:
    """Every helper is back in the idle queue (it goes back once its calls ran), and no
    thread whose name starts with ``but_for`` is alive."""
    deadline = time.monotonic() + 10
    while helper_threads() != idle_helpers() or (but_for is not None and [
            t for t in threading.enumerate() if t.name.startswith(but_for)]):
        assert time.monotonic() < deadline, "a helper stayed busy, or a thread outlived its use"
        time.sleep(0.005)
