"""Child processes for crash tests: run a Python script until it prints a line, then SIGKILL."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator


@contextlib.contextmanager
def running_until(script: str, *args: str, ready: str) -> Iterator[subprocess.Popen]:
    """Run ``script`` (``python -c``) until it prints ``ready``; SIGKILLed when the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == ready
        yield proc
    finally:
        proc.kill()
        proc.wait(60)
        proc.stdout.close()


def killed_after(script: str, *args: str, ready: str) -> int:
    """Run ``script`` until it prints ``ready``, SIGKILL it; its pid."""
    with running_until(script, *args, ready=ready) as proc:
        return proc.pid
