"""``verify``: every check a FINF file allows, composed into one Report (never raises on bad
input).

Layers: structure (header, tree, block walk, no trailing bytes: done on open), extents (every
``!ndarray`` inside its block; URIs inside the folder), checksums (MD5 of each block's used
bytes, on worker threads), encodings (each zstd block decodes to what its arrays need), and
the exploded block files the tree points to, verified the same way.
"""

from __future__ import annotations

import os

from ..errors import FormatError
from ..report import Report
from ..workers import run_all
from . import _spec as S
from ._blocks import check_checksum
from ._read import FinfFile
from ._write import default_workers


def _check_blocks(f: FinfFile, report: Report, workers: int | None) -> tuple[int, int]:
    """Checksums of every block (parallel); returns (checked, unchecked)."""
    buf = f.buffer()
    results = run_all(lambda b: check_checksum(buf, b), f.blocks,
                      workers or default_workers())
    return sum(results), len(results) - sum(results)


def _verify_file(f: FinfFile, report: Report, workers: int | None, seen: set[str]) -> None:
    checked, unchecked = _check_blocks(f, report, workers)
    report.passed("checksum")
    report.details["blocks_checked"] = report.details.get("blocks_checked", 0) + checked
    if unchecked:
        report.notes.append(f"{os.path.basename(f.path)}: {unchecked} block(s) carry no "
                            "checksum (0): their bytes are unchecked")
    referenced = set()
    for name, ref in f.refs.items():
        if ref.is_external:
            ext = f.external(ref)
            if ext.path not in seen:
                seen.add(ext.path)
                _verify_file(ext, report, workers, seen)
            ext.block_content(0, ref.offset + ref.nbytes)
            report.passed("uri")
        else:
            referenced.add(ref.source)
            f.block_content(ref.source)
        f.array(name)
    report.passed("extents")
    if any(b.encoding == S.ENCODING_ZSTD for b in f.blocks):
        report.passed("zstd")
    spare = len(f.blocks) - len(referenced)
    if f.sections.has_tree and spare:
        report.notes.append(f"{os.path.basename(f.path)}: {spare} block(s) referenced by no "
                            "array")


def verify_file(path: str | os.PathLike, *, workers: int | None = None,
                limits: S.Limits = S.DEFAULT_LIMITS) -> Report:
    """Check structure, extents, checksums and encodings; ``report.ok`` tells the outcome
    (the format contract's ``verify`` calls this).

    Example::

        verify_file("model.finf", limits=Limits(max_nodes=1000)).ok
    """
    name = os.fspath(path)
    report = Report(path=name, format="finf")
    try:
        with FinfFile(name, limits=limits) as f:
            report.passed("structure")
            report.arrays = len(f.refs)
            report.raw_bytes = sum(r.nbytes for r in f.refs.values())
            report.details.update(version=".".join(map(str, f.sections.version)),
                                  blocks=len(f.blocks),
                                  unused_after_tree=f.sections.tree_space
                                  - (f.sections.tree_end - f.sections.tree_start))
            f.meta()
            _verify_file(f, report, workers, {os.path.realpath(name)})
    except FormatError as exc:
        report.fail(exc)
    return report
