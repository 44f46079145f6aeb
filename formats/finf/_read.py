"""Reading FINF: the file is mmapped; opening parses the header, the tree and the block headers
(O(tree + number of blocks), no block data touched); an array is a read-only view on the map.

Arrays: every ``!ndarray`` under the root's ``arrays`` mapping keeps its key as its name (the
layout snapops writes); one found anywhere else is named by its path (``data``,
``group/0/weights``), so files laid out like the spec's example load too. zstd blocks are
decompressed on first use and cached; big-endian arrays are returned as native copies.
"""

from __future__ import annotations

import mmap
import os
from typing import Any, Iterator

import numpy as np

from ..model import ArrayMapping, close_map
from ..errors import FormatError, TruncatedError
from ..iosafe import open_input
from . import _spec as S
from ._blocks import Block, decode, iter_blocks, zstd_bound
from ._header import Sections, locate
from ._ndarray import NDArrayRef
from ._uri import resolve_uri
from ._yaml import Root, Tagged, load_tree, plain_value


def read_tree(buf, sections: Sections, limits: S.Limits) -> Root:
    """Decode and parse the tree (an empty Root when the file has none)."""
    if not sections.has_tree:
        return Root()
    raw = bytes(buf[sections.tree_start:sections.tree_end])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError("tree is not UTF-8", offset=sections.tree_start + exc.start,
                          expected="UTF-8 text", got=raw[exc.start:exc.start + 4]) from exc
    return load_tree(text, limits, line_base=1)


def _walk(value: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], NDArrayRef]]:
    if isinstance(value, NDArrayRef):
        yield path, value
    elif isinstance(value, Tagged):
        yield from _walk(value.value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, path + (str(key),))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, path + (str(i),))


def collect_refs(root: Root) -> dict[str, NDArrayRef]:
    """Name -> ``!ndarray`` entry, in document order."""
    out: dict[str, NDArrayRef] = {}
    arrays = root.get("arrays")
    if arrays is not None:
        if not isinstance(arrays, dict):
            raise FormatError("'arrays' must be a mapping of !ndarray entries",
                              expected="a mapping", got=type(arrays).__name__)
        for name, ref in arrays.items():
            if not isinstance(name, str) or not isinstance(ref, NDArrayRef):
                raise FormatError("every 'arrays' entry must be a named !ndarray",
                                  expected="name: !ndarray {...}", got=f"{name!r}: "
                                  f"{type(ref).__name__}", line=getattr(ref, "line", None))
            out[name] = ref
    for key, value in root.items():
        if key == "arrays":
            continue
        for path, ref in _walk(value, (str(key),)):
            name = "/".join(path)
            if name in out:
                raise FormatError("two arrays with the same name", line=ref.line,
                                  expected="unique names", got=name)
            out[name] = ref
    return out


def tree_meta(root: Root) -> dict:
    meta = root.get("meta", {})
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise FormatError("'meta' must be a mapping with string keys", expected="a mapping",
                          got=type(meta).__name__)
    return plain_value(meta)


class FinfFile(ArrayMapping):
    """An open FINF file: ``names``, ``f[name]`` (a read-only view), ``meta()``, ``blocks``.

    Example::

        with FinfFile("model.finf") as f:
            w = f["layer.0.weight"]
    """

    def __init__(self, path: str | os.PathLike, *, limits: S.Limits = S.DEFAULT_LIMITS) -> None:
        self.path = os.fspath(path)
        self.limits = limits
        self._externals: dict[str, FinfFile] = {}
        self._decoded: dict[int, bytes] = {}
        try:
            with open_input(self.path) as handle:
                self.size = os.fstat(handle.fileno()).st_size
                if self.size == 0:
                    raise TruncatedError("empty file", path=self.path, offset=0,
                                         expected="'%FINF 0.1.0' header line", got="0 bytes")
                self._mm: mmap.mmap | None = mmap.mmap(handle.fileno(), 0,
                                                       access=mmap.ACCESS_READ)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror}", path=self.path) from exc
        try:
            self._parse()
        except FormatError as exc:
            self.close()
            raise exc.located(self.path)

    def _parse(self) -> None:
        mm = self._mm
        self.sections = locate(mm, self.limits)
        self.tree = read_tree(mm, self.sections, self.limits)
        self.blocks: tuple[Block, ...] = tuple(
            iter_blocks(mm, self.sections.first_block, self.limits))
        self.refs = collect_refs(self.tree)
        self._need = self._check_refs()

    def _check_refs(self) -> dict[int, int]:
        """Bounds of every local entry against its block; URIs checked against the folder."""
        need: dict[int, int] = {}
        folder = os.path.dirname(os.path.abspath(self.path))
        for name, ref in self.refs.items():
            end = ref.offset + ref.nbytes
            if ref.is_external:
                resolve_uri(ref.source, folder, ref.line)
                continue
            if ref.source >= len(self.blocks):
                raise FormatError("ndarray source points past the last block", line=ref.line,
                                  array=name, expected=f"< {len(self.blocks)}", got=ref.source)
            block = self.blocks[ref.source]
            room = block.used if block.encoding == S.ENCODING_RAW else zstd_bound(block.used)
            if end > room:
                raise FormatError("ndarray runs past its block", line=ref.line, array=name,
                                  chunk=block.index, expected=f"offset + nbytes <= {room}",
                                  got=end, check="extents")
            need[ref.source] = max(need.get(ref.source, 0), end)
        return need

    # -- blocks -------------------------------------------------------------------------------
    def buffer(self):
        if self._mm is None:
            raise FormatError("file is closed", path=self.path)
        return self._mm

    def block_content(self, index: int, need: int | None = None):
        """Block ``index``'s content: a view (raw) or decoded bytes (zstd, cached)."""
        block = self.blocks[index]
        want = self._need.get(index, 0) if need is None else need
        if block.encoding == S.ENCODING_RAW:
            return decode(self.buffer(), block, want)
        if index not in self._decoded:
            self._decoded[index] = decode(self.buffer(), block, want)
        content = self._decoded[index]
        if len(content) < want:
            raise FormatError("block holds fewer bytes than its arrays need", path=self.path,
                              chunk=index, expected=f">= {want}", got=len(content))
        return content

    def external(self, ref: NDArrayRef) -> "FinfFile":
        """The single-block file an exploded entry points to (opened once)."""
        uri = ref.source
        if uri not in self._externals:
            target = resolve_uri(uri, os.path.dirname(os.path.abspath(self.path)), ref.line)
            try:
                present = target.is_file()
            except OSError as exc:           # a path too long for the file system, say
                raise FormatError(f"exploded block file unreadable: {exc.strerror}",
                                  path=self.path, line=ref.line, check="uri",
                                  expected=f"a FINF file at {uri}", got=exc.strerror) from None
            if not present:
                raise FormatError("exploded block file missing", path=self.path, line=ref.line,
                                  expected=f"a FINF file at {uri}", got="nothing", check="uri")
            ext = FinfFile(target, limits=self.limits)
            if not ext.blocks:
                ext.close()
                raise FormatError("exploded block file holds no block", path=str(target),
                                  expected="one block", got="0")
            self._externals[uri] = ext
        return self._externals[uri]

    # -- arrays ---------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.refs)

    def _ref(self, name: str) -> NDArrayRef:
        if name not in self.refs:
            raise FormatError("no such array", path=self.path, array=name,
                              expected=f"one of {len(self.refs)} arrays", got=name)
        return self.refs[name]

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        ref = self._ref(name)
        return ref.np_dtype.newbyteorder("="), tuple(ref.shape)

    def array(self, name: str) -> np.ndarray:
        """Array ``name``: a read-only view on the map for raw little-endian blocks."""
        ref = self._ref(name)
        try:
            if ref.is_external:
                content = self.external(ref).block_content(0, ref.offset + ref.nbytes)
            else:
                content = self.block_content(ref.source)
        except FormatError as exc:
            if exc.array is None:
                exc.array = name
                exc.args = (str(exc),)
            raise exc.located(self.path)
        if ref.count == 0:
            out = np.zeros(ref.shape, ref.np_dtype.newbyteorder("="))
            out.flags.writeable = False
            return out
        out = np.frombuffer(content, dtype=ref.np_dtype, count=ref.count, offset=ref.offset)
        if not out.dtype.isnative:
            out = out.astype(out.dtype.newbyteorder("="))
            out.flags.writeable = False
        return out.reshape(ref.shape)

    def meta(self) -> dict:
        try:
            return tree_meta(self.tree)
        except FormatError as exc:
            raise exc.located(self.path)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        for ext in self._externals.values():
            ext.close()
        self._externals = {}
        mm, self._mm = self._mm, None
        close_map(mm)

