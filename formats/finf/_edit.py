"""Editing the tree of an existing file without touching its blocks.

``update_tree(path, {"step": 1200, "old": None})`` sets/removes keys of the tree's ``meta``.
When the new tree fits in the space the old tree and the unused bytes after it occupy, it is
written **in place**: one ``pwrite`` over the old tree (the rest of the old text becomes spaces)
and an ``fsync``; no block moves, so the cost does not depend on the payload. The in-place
write is not crash-atomic: a power cut in the middle of that one write (a few KiB) can leave a
torn tree, which ``verify`` reports; blocks are never at risk. When the tree does not fit,
``rewrite="auto"`` (the default) rewrites the whole file atomically (temp file, fsync,
rename; blocks copied byte for byte, O(payload)); ``rewrite="never"`` raises
:class:`LimitError` instead; ``rewrite="always"`` always takes the atomic path.

When ``meta`` is the last key of a block-style root (as snapops writes it), only that section
is re-emitted, so the rest of the tree keeps its exact text (comments included); otherwise
the whole tree is re-emitted from its data.
"""

from __future__ import annotations

import mmap
import os
import re
from typing import Any, Callable, Mapping

from ..atomic import atomic_write
from ..errors import DataError, FormatError, LimitError
from . import _spec as S
from ._header import Sections, locate
from ._layout import align_up
from ._read import collect_refs
from ._yaml import Root, dump_section, dump_tree, load_tree_node

# YAML 1.1 line breaks, as both PyYAML's reader and libyaml count them
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
_COPY_CHUNK = 64 << 20
_PAGE = 4096
Changes = Mapping[str, Any] | Callable[[Root], Any]


def _apply_meta(meta: Any, changes: Mapping[str, Any]) -> dict:
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise FormatError("'meta' must be a mapping", expected="a mapping",
                          got=type(meta).__name__)
    new = dict(meta)
    for key, value in changes.items():
        if not isinstance(key, str):
            raise DataError(f"meta keys must be str, got {key!r}")
        if value is None:
            new.pop(key, None)
        else:
            new[key] = value
    return new


def _meta_line_start(text: str, node) -> int | None:
    """Offset of the root's last key when it is ``meta`` at column 0 of a block mapping."""
    if getattr(node, "flow_style", True) or not node.value:
        return None
    key = node.value[-1][0]
    if key.value != "meta" or key.style not in (None, "") or key.start_mark.column != 0:
        return None
    pos, line = 0, 0
    for match in _LINE_BREAK.finditer(text):
        if line == key.start_mark.line:
            break
        pos, line = match.end(), line + 1
    if line != key.start_mark.line or not text.startswith("meta:", pos):
        return None
    return pos


def _ref_signature(root: Root) -> list[tuple]:
    return [(name, r.source, r.dtype, r.shape, r.byteorder, r.offset)
            for name, r in collect_refs(root).items()]


def edit_tree_text(text: str | None, changes: Changes, limits: S.Limits) -> str:
    """The new tree text (``text`` None: the file has no tree yet)."""
    if callable(changes):
        root = load_tree_node(text, limits, line_base=1)[0] if text is not None else Root()
        before = _ref_signature(root)
        result = changes(root)
        root = root if result is None else result
        if not isinstance(root, Root):
            root = Root(root)
        if _ref_signature(root) != before:
            raise DataError("update_tree edits metadata only: array entries changed")
        return dump_tree(root)
    if not isinstance(changes, Mapping):
        raise DataError(f"changes must be a mapping or a callable, got {type(changes).__name__}")
    if text is None:
        return dump_tree(Root({"meta": _apply_meta({}, changes)}))
    splice: dict[str, int] = {}

    def select(node):
        # meta last at column 0 of a block root: construct only meta and keep the rest's text
        start = _meta_line_start(text, node)
        if start is None:
            return node
        splice["start"] = start
        return node.value[-1][1]

    data, _ = load_tree_node(text, limits, line_base=1, select=select)
    if "start" in splice:
        new_meta = _apply_meta(data, changes)
        return text[:splice["start"]] + dump_section("meta", new_meta) + "...\n"
    data["meta"] = _apply_meta(data.get("meta"), changes)
    return dump_tree(data)


def _encode(text: str) -> bytes:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"the tree holds text that is not valid Unicode: {exc}") from exc
    match = S.TREE_END_RE.search(data)
    if match is None or match.end() != len(data):
        raise DataError("the edited tree contains an early '...' line")
    return data


def update_tree(path: str | os.PathLike, changes: Changes, *, rewrite: str = "auto",
                reserve: int = S.DEFAULT_RESERVE, limits: S.Limits = S.DEFAULT_LIMITS) -> dict:
    """Edit the tree of ``path``; see the module doc for in-place versus atomic rewrite.

    Example::

        update_tree("m.finf", {"step": 1200})["mode"]
        # -> 'in_place'
    """
    if rewrite not in ("auto", "never", "always"):
        raise DataError(f"rewrite must be 'auto', 'never' or 'always', got {rewrite!r}")
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDWR)
    except OSError as exc:
        raise FormatError(f"cannot open for update: {exc.strerror}", path=name) from exc
    try:
        if os.fstat(fd).st_size == 0:
            raise FormatError("empty file", path=name, offset=0, expected="a FINF file",
                              got="0 bytes", check="truncated")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            sections = locate(mm, limits)
            old = bytes(mm[sections.tree_start:sections.tree_end])
        try:
            text = old.decode("utf-8") if sections.has_tree else None
        except UnicodeDecodeError as exc:
            raise FormatError("tree is not UTF-8", offset=sections.tree_start + exc.start,
                              expected="UTF-8 text", got=old[exc.start:exc.start + 4]) from exc
        new = _encode(edit_tree_text(text, changes, limits))
        if rewrite != "always" and sections.has_tree and len(new) <= sections.tree_space:
            os.pwrite(fd, new + b" " * max(0, len(old) - len(new)), sections.tree_start)
            os.fsync(fd)
            mode = "in_place"
        elif rewrite == "never":
            raise LimitError("the new tree does not fit in the unused space", path=name,
                             offset=sections.tree_start,
                             expected=f"<= {sections.tree_space} bytes", got=len(new))
        else:
            _rewrite(name, fd, sections, new, reserve)
            mode = "rewritten"
    except FormatError as exc:
        raise exc.located(name)
    finally:
        os.close(fd)
    return {"path": name, "mode": mode, "tree_bytes": len(new), "space": sections.tree_space}


def _rewrite(name: str, fd: int, sections: Sections, tree: bytes, reserve: int) -> None:
    """Header + new tree + unused space + the old blocks copied verbatim, atomically.

    The first block keeps its offset modulo the page size, so block data stays aligned.
    """
    start = len(S.HEADER_LINE) + len(tree)
    first = sections.first_block
    with atomic_write(name) as out:
        out.write(S.HEADER_LINE)
        out.write(tree)
        if first is None:
            return
        target = align_up(start + reserve - first % _PAGE, _PAGE) + first % _PAGE
        out.write(b" " * (target - start))
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
            for at in range(first, sections.size, _COPY_CHUNK):
                with view[at:min(at + _COPY_CHUNK, sections.size)] as piece:
                    out.write(piece)
