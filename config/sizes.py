"""The one size parser, shared by the config file, SNAPOPS_* variables and CLI flags.

Decimal units are powers of 1000 (``K``, ``KB``, ``M``, ``MB``...), binary units powers of
1024 (``KiB``, ``MiB``...); case is ignored; a bare number is bytes.

>>> parse_size("32M"), parse_size("32MiB"), parse_size("1.5GB"), parse_size(4096)
(32000000, 33554432, 1500000000, 4096)
>>> parse_size("32 parsecs")
Traceback (most recent call last):
snapops.formats.errors.ConfigError: not a size: '32 parsecs' (try 32MiB, 256M or 1GB)
"""

from __future__ import annotations

import re

from snapops.formats.errors import ConfigError, short_repr

_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
MAX_SIZE = 2**63 - 1          # bytes: what a file offset can hold
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_size(value: str | int) -> int:
    """Bytes in ``value`` (an int, or text like ``256MiB``); ConfigError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        size = value
    else:
        match = _SIZE.fullmatch(str(value).strip()) if isinstance(value, str) else None
        if not match:
            raise ConfigError(f"not a size: {short_repr(value)} (try 32MiB, 256M or 1GB)")
        unit = (match.group(2) or "").lower().removesuffix("b")
        size = float(match.group(1)) * _UNITS[unit]      # inf for a number too long to hold
    if not size <= MAX_SIZE:
        raise ConfigError(f"size {short_repr(value)}: larger than any file (at most 8 EiB)")
    return int(size)

