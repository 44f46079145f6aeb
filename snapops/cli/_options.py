"""argparse types for numeric options: each takes only what lies in its range and refuses
anything else with one line naming the range. ``nan`` and infinities are refused too: ``nan``
compares false with every bound, so a guard given ``nan`` would silently switch itself off.

>>> integer_in(1)("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected an integer >= 1, got '0'
>>> number_in(1)("nan")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a finite number >= 1, got 'nan'
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

from ._common import parse_size


def integer_in(low: int, high: int | None = None, *, what: str = "an integer"
               ) -> Callable[[str], int]:
    """argparse type: an integer in ``low..high`` (no upper bound when ``high`` is None);
    ``what`` names it in the message."""
    expected = f"{what} {_bounds(low, high)}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _refused(expected, text) from None
        if value < low or (high is not None and value > high):
            raise _refused(expected, text)
        return value

    return parse


def number_in(low: float, high: float | None = None, *, above: bool = False
              ) -> Callable[[str], float]:
    """argparse type: a finite number ``>= low`` (``> low`` with ``above``), ``<= high``."""
    expected = f"a finite number {_bounds(low, high, above=above)}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _refused(expected, text) from None
        too_low = value <= low if above else value < low
        if not math.isfinite(value) or too_low or (high is not None and value > high):
            raise _refused(expected, text)
        return value

    return parse


def generation(text: str) -> int:
    """argparse type: a generation number, 0 up to the largest a tag ``gen-NNNNNN`` spells
    (imported on use: the generation modules take 60 ms to load)."""
    from snapops.formats.generation.manifest import GEN_MAX

    return integer_in(0, GEN_MAX, what="a generation number")(text)


def size_at_least(low: int, why: str) -> Callable[[str], int]:
    """argparse type: a size (``256MiB``, ``32M``) of at least ``low`` bytes; ``why`` says
    what the smallest one is."""

    def parse(text: str) -> int:
        value = parse_size(text)
        if value < low:
            raise argparse.ArgumentTypeError(
                f"expected at least {low} byte{'s' if low != 1 else ''} ({why}), got {text!r}")
        return value

    return parse


def _bounds(low: float, high: float | None, *, above: bool = False) -> str:
    low_text, high_text = _number(low), _number(high)
    if high is not None:
        return f"> {low_text} and <= {high_text}" if above else f"in {low_text}..{high_text}"
    return f"> {low_text}" if above else f">= {low_text}"


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _refused(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")


# --max-expansion: below 1 no compressed member would pass; nan would switch the zip-bomb
# guard off
expansion_ratio = number_in(1)

# --threads: as every format's ``workers`` (formats/options.py WORKERS)
worker_threads = integer_in(1, 1024)
