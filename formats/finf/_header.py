"""The header line and the sections around the tree: where the tree starts and ends, and where
the first block is (found by scanning for the block magic from the end of the tree).

:func:`locate` is a pure function of a buffer (bytes or mmap): it reads nothing else and
allocates nothing in proportion to the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FormatError, LimitError, TruncatedError, UnsupportedVersionError
from . import _spec as S


@dataclass(frozen=True)
class Sections:
    """Offsets of the parts of a FINF file.

    ``tree_start``/``tree_end`` bound the tree text (``%YAML`` .. the end marker's line
    ending, inclusive); both equal ``header_end`` when there is no tree. ``first_block`` is
    the offset of the first block magic, or None when there are no blocks.
    """

    version: tuple[int, int, int]
    header_end: int
    tree_start: int
    tree_end: int
    first_block: int | None
    size: int

    @property
    def has_tree(self) -> bool:
        return self.tree_end > self.tree_start

    @property
    def tree_space(self) -> int:
        """Bytes the tree may occupy without moving a block (tree + unused space)."""
        end = self.first_block if self.first_block is not None else self.size
        return end - self.tree_start


def parse_header(buf) -> tuple[tuple[int, int, int], int]:
    """The version in the header line and the offset just after it."""
    head = bytes(buf[:S.MAX_HEADER_LINE])
    if not head:
        raise TruncatedError("empty file", offset=0, expected="'%FINF 0.1.0' header line",
                             got="0 bytes")
    if not head.startswith(b"%FINF"):
        if b"%FINF".startswith(head):
            raise TruncatedError("header line cut short", offset=0,
                                 expected="'%FINF 0.1.0' header line", got=head)
        raise FormatError("not a FINF file", offset=0, expected="'%FINF' token", got=head[:8])
    match = S.HEADER_RE.match(head)
    if match is None:
        cls = TruncatedError if b"\n" not in head and len(head) < S.MAX_HEADER_LINE else FormatError
        raise cls("bad header line", offset=0, line=1,
                  expected="'%FINF major.minor.micro' and a line ending",
                  got=head.split(b"\n")[0][:40])
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    if version[:2] != S.VERSION[:2]:
        raise UnsupportedVersionError("unsupported FINF version", offset=6, line=1,
                                      expected="0.1.x", got=".".join(map(str, version)))
    return version, match.end()


def locate(buf, limits: S.Limits = S.DEFAULT_LIMITS) -> Sections:
    """Split ``buf`` (the whole file) into header, tree and blocks."""
    size = len(buf)
    version, header_end = parse_header(buf)
    if header_end == size or bytes(buf[header_end:header_end + 4]) == S.BLOCK_MAGIC:
        # no tree: the first block (if any) follows the header with no padding
        first = header_end if header_end < size else None
        return Sections(version, header_end, header_end, header_end, first, size)
    if S.YAML_DIRECTIVE_RE.match(buf, header_end) is None:
        rest = bytes(buf[header_end:header_end + 11])
        if b"%YAML 1.1\r\n".startswith(rest) or b"%YAML 1.1\n".startswith(rest):
            raise TruncatedError("tree cut short", offset=header_end, line=2,
                                 expected="'%YAML 1.1'", got=rest)
        raise FormatError("the tree must start with the YAML directive", offset=header_end,
                          line=2, expected="'%YAML 1.1' or a block magic", got=rest)
    tree_end = find_tree_end(buf, header_end, limits)
    first = buf.find(S.BLOCK_MAGIC, tree_end)
    return Sections(version, header_end, header_end, tree_end, None if first < 0 else first,
                    size)


def find_tree_end(buf, start: int, limits: S.Limits) -> int:
    """Offset just after the tree's end marker line (``...``), searched within the limit."""
    size = len(buf)
    window_end = min(size, start + limits.max_tree_bytes + 5)
    match = S.TREE_END_RE.search(buf, start, window_end)
    if match is not None and (match.end() < window_end or window_end == size
                              or bytes(buf[match.end() - 1:match.end()]) == b"\n"):
        return match.end()
    if window_end < size:
        raise LimitError("tree too large (or its end marker is missing)", offset=start,
                         expected=f"'...' within {limits.max_tree_bytes} bytes",
                         got=f"{size - start} bytes without one")
    raise TruncatedError("the tree has no end marker", offset=start,
                         expected="'...' on its own line", got="end of file")
