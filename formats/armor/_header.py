"""Bounds on an untrusted age header, checked before pyrage sees it.

pyrage (rage) parses the header again from its start after each 8 KiB read, so its cost grows
with the square of the header size (measured: 1 MB of stanzas, 35 s; 4 MB, over 2 min), and
it runs scrypt at any work factor up to about 4 above what takes 1 s on the machine (2^22: a
4 GiB allocation). Both are refused here with a typed error instead.
"""

from __future__ import annotations

from ..errors import FormatError, LimitError, TruncatedError

MAGIC = b"age-encryption.org/v1\n"
# A recipient stanza takes 100 (X25519) to 700 (ssh-rsa 4096) bytes: room for about 90 to 650
# recipients, while a hostile header of this size costs pyrage under 0.3 s.
MAX_HEADER_BYTES = 64 * 1024
# 2^20 * 1 KiB = 1 GiB of scrypt memory, ~4 s here; age itself encrypts at 2^18, rage at ~1 s.
MAX_WORK_FACTOR = 20


def header_end(data: bytes) -> int | None:
    """The offset just past the header's ``--- MAC`` line in ``data``; None if not there yet."""
    mac = data.find(b"\n--- ")
    if mac < 0:
        return None
    end = data.find(b"\n", mac + 1)
    return None if end < 0 else end + 1


def check_start(data: bytes, name: str) -> None:
    """Refuse input that is not age at all, naming what it starts with (pyrage says only
    'failed to fill whole buffer' for an empty or whitespace-only file)."""
    if not data.startswith(MAGIC):
        raise FormatError("not a valid age file", path=name, offset=0,
                          expected="'age-encryption.org/v1' or an armored age file",
                          got=repr(data[:24]) if data else "an empty file")


def check_header_size(data: bytes, name: str, at_eof: bool) -> int | None:
    """The header's length once ``data`` holds all of it; None while more input is needed."""
    end = header_end(data)
    if end is not None and end <= MAX_HEADER_BYTES:
        return end
    if end is not None or len(data) > MAX_HEADER_BYTES:
        raise LimitError("age header too large", path=name, offset=MAX_HEADER_BYTES,
                         expected=f"the '---' MAC line within {MAX_HEADER_BYTES} bytes",
                         got=f"{end or len(data)}+ bytes")
    if at_eof:
        raise TruncatedError("age header ends early", path=name, offset=len(data),
                             expected="a '---' MAC line", got="end of input")
    return None


def check_work_factors(header: bytes, name: str, max_work_factor: int) -> None:
    """Refuse an scrypt stanza whose work factor exceeds ``max_work_factor``, before any of
    that work is done (pyrage would try up to what its timing allows)."""
    offset = 0
    for line in header.split(b"\n"):
        args = line.split(b" ")
        if args[:2] == [b"->", b"scrypt"] and len(args) == 4:
            factor = _work_factor(args[3])
            if factor is not None and factor > max_work_factor:
                raise LimitError("scrypt work factor too high in the age header", path=name,
                                 offset=offset, expected=f"at most {max_work_factor}",
                                 got=factor if factor < 1000 else "1000 or more")
        offset += len(line) + 1


def _work_factor(arg: bytes) -> int | None:
    """The decimal work factor, 1000 for any longer number; None if not a number (pyrage
    refuses it then, and ``int`` would refuse more than 4300 digits)."""
    if not arg.isdigit():
        return None
    return int(arg) if len(arg) <= 3 else 1000
