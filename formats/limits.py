"""Bounds on what a file may declare before anything is decompressed or allocated.

An archive member declares its uncompressed size; a hostile one declares (or expands to)
gigabytes from a few compressed megabytes (a "zip bomb"). ``check_member`` refuses, from the
declarations alone, members larger than an absolute bound and members that expand more than
a ratio beyond a small floor (small members may compress very well: an all-zero buffer
deflates about 1000:1). ``check_declared`` bounds a size computed from a declared shape,
``check_shape`` computes that size exactly (no int64 overflow) and also refuses more bytes
than the file can hold; ``zstd_decompressor`` is every zstd reader's decoder, with a bounded
window (each caller also bounds the output by what the file declares).

>>> check_shape("w", (10**6, 10**6), 4, available=1 << 20)
... # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
LimitError: [limit] array w: expected at most 1048576 bytes (what the file holds) (...)

>>> check_member("w.npy", declared=4_500_000_000, compressed=3_000_000)
... # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
LimitError: [limit] array w.npy: expected at most 100x expansion (...)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import LimitError


@dataclass(frozen=True)
class DeclaredLimits:
    """``max_bytes``: largest uncompressed member or array; ``max_expansion``: largest
    uncompressed / compressed ratio, checked for members over ``expansion_floor`` bytes."""

    max_bytes: int = 64 << 30
    max_expansion: float = 100.0
    expansion_floor: int = 64 << 20
    max_zstd_window: int = 1 << 27      # zstd's own default; a frame asking more is refused


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


def shape_nbytes(shape: Iterable[int], itemsize: int) -> int:
    """The exact byte size of ``shape`` (Python integers: a hostile shape cannot overflow)."""
    return math.prod(int(d) for d in shape) * int(itemsize)


def check_dims(name: str | None, shape: tuple[int, ...], itemsize: int = 1,
               limits: DeclaredLimits = DEFAULT_LIMITS, path: str | None = None,
               line: int | None = None) -> None:
    """Refuse a shape whose dimensions other than 0 span more than ``limits.max_bytes``
    (times ``itemsize``): no array holds that many items, and numpy refuses such a shape even
    when another dimension is 0, an array of no bytes (``(0, 2**62)``)."""
    span = math.prod(int(d) for d in shape if d) * int(itemsize)
    if span > limits.max_bytes:
        raise LimitError(path=path, line=line, array=name, check="limit",
                         expected=f"dimensions spanning at most {limits.max_bytes} bytes",
                         got=f"shape {'x'.join(map(str, shape))} of {itemsize}-byte items")


def check_shape(name: str, shape: Iterable[int], itemsize: int, *, available: int | None = None,
                limits: DeclaredLimits = DEFAULT_LIMITS, path: str | None = None) -> int:
    """The byte size of a declared shape, refused (before anything is allocated) when it
    exceeds ``limits.max_bytes`` or ``available``, what the file can hold for it."""
    shape = tuple(shape)
    check_dims(name, shape, itemsize, limits, path)
    nbytes = shape_nbytes(shape, itemsize)
    if available is not None and nbytes > available:
        raise LimitError(path=path, array=name, check="limit",
                         expected=f"at most {available} bytes (what the file holds)",
                         got=f"{nbytes} bytes for shape {'x'.join(map(str, shape)) or 'scalar'}")
    check_declared(name, nbytes, limits, path)
    return nbytes


def zstd_decompressor(limits: DeclaredLimits = DEFAULT_LIMITS):
    """A zstandard decompressor refusing frames whose window exceeds ``max_zstd_window``."""
    import zstandard

    return zstandard.ZstdDecompressor(max_window_size=limits.max_zstd_window)
