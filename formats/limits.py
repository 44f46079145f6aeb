"""Bounds on what a file may declare before anything is decompressed or allocated.

An archive member declares its uncompressed size; a hostile one declares (or expands to)
gigabytes from a few compressed megabytes (a "zip bomb"). ``check_member`` refuses, from the
declarations alone, members larger than an absolute bound and members that expand more than
a ratio beyond a small floor (small members may compress very well: an all-zero buffer
deflates about 1000:1). ``check_declared`` bounds a size computed from a declared shape.

>>> check_member("w.npy", declared=4_500_000_000, compressed=3_000_000)
... # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
LimitError: [limit] array w.npy: expected at most 100x expansion (...)
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LimitError


@dataclass(frozen=True)
class DeclaredLimits:
    """``max_bytes``: largest uncompressed member or array; ``max_expansion``: largest
    uncompressed / compressed ratio, checked for members over ``expansion_floor`` bytes."""

    max_bytes: int = 64 << 30
    max_expansion: float = 100.0
    expansion_floor: int = 64 << 20


DEFAULT_LIMITS = DeclaredLimits()


def check_declared(name: str, nbytes: int, limits: DeclaredLimits = DEFAULT_LIMITS,
                   path: str | None = None) -> None:
    """Refuse an array whose declared size exceeds ``limits.max_bytes``."""
    if nbytes > limits.max_bytes:
        raise LimitError(path=path, array=name, check="limit",
                         expected=f"at most {limits.max_bytes} bytes declared",
                         got=f"{nbytes} bytes")


def check_member(name: str, *, declared: int, compressed: int,
                 limits: DeclaredLimits = DEFAULT_LIMITS, path: str | None = None) -> None:
    """Refuse an archive member from its declared sizes (see the module docstring)."""
    check_declared(name, declared, limits, path)
    if declared > limits.expansion_floor and declared > limits.max_expansion * max(compressed, 1):
        raise LimitError(path=path, array=name, check="limit",
                         expected=f"at most {limits.max_expansion:g}x expansion for members "
                                  f"over {limits.expansion_floor} bytes",
                         got=f"{declared} bytes from {compressed} compressed")
