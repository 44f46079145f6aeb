"""``snapops textconv FILE``: a deterministic text rendering of any snapshot, for ``git diff``.

Git runs the configured textconv command on both sides of a diff and diffs the text, so the
rendering is made of stable lines that change only where the content changed:

    snapops-textconv 2 format=aero
    meta gen=2
    arr R dtype=f32 shape=32x4 bytes=512
      R[0:8] sha256=0c43f2957858ef1a min=0 max=31 mean=15.5
      R[8:16] sha256=96be9bb47166c801 min=32 max=63 mean=47.5
    endarr R sha256=9a7da1da62b9bde6e5fc843d1003baa8358e30e88e196434321e4235a8d7e435

One line per row-block (WTXT: per chunk, whose SHA-256 is the ch line's; other formats: blocks
of about 32 KiB of whole rows, as WTXT's row blocking would cut them). Arrays have their
original names and logical dtypes, spelled as everywhere else (``f32``, ``bf16``, ``bool``),
whatever the format stores (WTXT: ``layer__0__weight`` as ``u16`` is ``layer.0.weight``,
``bf16``), so the same state renders the same in every format bar the header. Version 2:
version 1 spelled dtypes as numpy does and showed WTXT's stored names and dtypes. The file's
path is never printed: git hands textconv a temporary file.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Iterator

import numpy as np

from snapops.formats.dtypes import dtype_label
from snapops.formats.limits import DEFAULT_LIMITS, DeclaredLimits

from ._compare import compute_dtype
from ._sources import ArraySource, open_snapshot

VERSION = 2
DIGEST_HEX = 16
BATCH_BYTES = 2 << 20
_PLAIN = re.compile(r"[A-Za-z0-9_.:/+-]+")


def textconv_lines(path: str | os.PathLike, *, rows_per_block: int | None = None,
                   limits: DeclaredLimits = DEFAULT_LIMITS) -> Iterator[str]:
    """Yield the rendering of ``path`` line by line (no trailing LF), array by array, reading
    a block of at most about 2 MiB at a time; sizes the file declares are bounded by
    ``limits`` before anything is read (git runs this on untrusted content).

    >>> print("\\n".join(textconv_lines("state.npz")))      # doctest: +SKIP
    """
    from snapops.formats._alloc import tune_allocator

    tune_allocator()
    with open_snapshot(path, rows_per_block=rows_per_block, limits=limits) as snap:
        yield f"snapops-textconv {VERSION} format={snap.format}"
        if snap.header_lines:
            yield from snap.header_lines
        else:
            for key in sorted(snap.meta):
                yield f"meta {quote(key)}={quote(snap.meta[key])}"
        for name in snap.names():
            array = snap.arrays[name]
            try:
                yield from array_lines(array)
            finally:
                array.release()
        yield "end"


def quote(text: str) -> str:
    """``text`` as is when it is a plain token, else as an escaped double-quoted string."""
    text = str(text)
    if _PLAIN.fullmatch(text):
        return text
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


def array_lines(array: ArraySource) -> Iterator[str]:
    """The arr line, one digest line per block, and the whole array's SHA-256 last (it is
    known only after every block was read, unless the file states it)."""
    shape = "x".join(str(d) for d in array.shape) if array.shape else "scalar"
    yield (f"arr {quote(array.name)} dtype={dtype_label(array.dtype)} shape={shape} "
           f"bytes={array.nbytes}")
    layout = array.layout
    whole = hashlib.sha256()
    digests = array.digests() if array.digests is not None else None
    per = max(1, BATCH_BYTES // max(layout.block_elems * array.dtype.itemsize, 1))
    compute = compute_dtype(array.dtype, array.dtype)
    for first in range(0, layout.count, per):
        last = min(first + per, layout.count)
        start, stop = layout.span(first)[0], layout.span(last - 1)[1]
        values = array.read(start, stop)
        for ix in range(first, last):
            s, e = layout.span(ix)
            block = values[s - start:e - start]
            raw = block.view(np.uint8)
            whole.update(raw)
            sha = (bytes(digests[ix]).decode("ascii") if digests is not None
                   else hashlib.sha256(raw).hexdigest())
            yield (f"  {_label(array.name, layout.label(ix))} sha256={sha[:DIGEST_HEX]}"
                   + _stats(block, compute))
    if not layout.count:
        yield "  (empty)"
    yield f"endarr {quote(array.name)} sha256={array.sha256 or whole.hexdigest()}"


def _label(name: str, label: tuple[str, int, int]) -> str:
    kind, start, stop = label
    return f"{quote(name)}[{start}:{stop}]" if kind == "rows" else \
        f"{quote(name)}.flat[{start}:{stop}]"


def _stats(block: np.ndarray, compute) -> str:
    if compute is None or not block.size:
        return ""
    values = block.astype(compute, copy=False)
    lo, hi = values.min(), values.max()
    mean = float(values.mean(dtype=np.float64))
    if block.dtype.kind in "iub":
        return f" min={int(lo)} max={int(hi)} mean={_g(mean)}"
    return f" min={_g(float(lo))} max={_g(float(hi))} mean={_g(mean)}"


def _g(value: float) -> str:
    return format(value, ".7g")


def textconv(path: str | os.PathLike, out, *, rows_per_block: int | None = None,
             limits: DeclaredLimits = DEFAULT_LIMITS) -> int:
    """Write the rendering to the text stream ``out``; returns the number of lines."""
    n = 0
    for line in textconv_lines(path, rows_per_block=rows_per_block, limits=limits):
        out.write(line + "\n")
        n += 1
    return n
