"""Git LFS pointer files: what the Git tree holds in place of a large object.

Only the canonical form git-lfs writes is accepted (three lines, in this order, LF ends):

>>> text = render_pointer("a" * 64, 12)
>>> text
b'version https://git-lfs.github.com/spec/v1\\noid sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\\nsize 12\\n'
>>> parse_pointer(text)
Pointer(oid='aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', size=12)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from snapops.formats.errors import FormatError

VERSION_LINE = b"version https://git-lfs.github.com/spec/v1\n"
MAX_POINTER = 1024     # git-lfs itself never reads more than this as a pointer
_POINTER = re.compile(rb"version https://git-lfs\.github\.com/spec/v1\n"
                      rb"oid sha256:(?P<oid>[0-9a-f]{64})\nsize (?P<size>0|[1-9][0-9]{0,17})\n")


@dataclass(frozen=True)
class Pointer:
    oid: str        # SHA-256 of the object's bytes
    size: int


def render_pointer(oid: str, size: int) -> bytes:
    return VERSION_LINE + f"oid sha256:{oid}\nsize {size}\n".encode("ascii")


def is_pointer(data: bytes) -> bool:
    return data.startswith(VERSION_LINE)


def parse_pointer(data: bytes, path: str = "pointer") -> Pointer:
    """The pointer in ``data``; FormatError naming ``path`` for anything else."""
    m = _POINTER.fullmatch(data[:MAX_POINTER + 1])
    if m is None:
        raise FormatError("not a Git LFS pointer file", path=path, offset=0, check="lfs-pointer",
                          expected="version/oid sha256:/size lines",
                          got=repr(data[:60]) if data else "an empty file")
    return Pointer(m["oid"].decode(), int(m["size"]))
