"""Check a ledger blob against the version before it: append-only, chained, and each new entry
matching the snapshot it names in the same tree.

* **append-only**: every line of the previous version (HEAD for a commit being made, the first
  parent for a pushed commit, the old tip for a moved ref) is, byte for byte, the same line of
  the new version; only lines after them are new. A deleted ledger is refused too.
* **chain**: every line parses, its ``chain`` follows from the line before, ``merkle_prev`` is
  the previous ``merkle_this``, ``merkle_this`` re-derives, gen strictly increases
  (:func:`snapops.daemon.ledger.check_link`).
* **file**: each new entry's snapshot is in the tree and its header (or WSUM) carries the
  entry's gen, ts, build, sha256_all, merkle_prev, merkle_this and keyid.

Both versions are streamed line by line from ``git cat-file``.

Example::

    report = check_ledger(ctx, git.index(), "ledger/run1.ledger", new_oid, head_oid, "HEAD")
    [str(p) for p in report.problems]
    # -> ['ledger/run1.ledger:2: [append-only] line 2 of HEAD was changed: ...']
"""

from __future__ import annotations

import contextlib
from typing import BinaryIO, Iterator

from snapops.daemon.entry_values import check_values
from snapops.daemon.ledger import (
    MAX_LINE, LedgerLine, LedgerReport, check_link, iter_lines,
)
from snapops.formats.errors import FormatError, LedgerError

from .gitio import Tree
from .snapshot_check import Context

LEDGER_SUFFIX = ".ledger"


def is_ledger(path: str) -> bool:
    return path.endswith(LEDGER_SUFFIX)


def _raw(rec: LedgerLine) -> bytes:
    return rec.body + b" chain=" + rec.chain.encode() + b"\n"


def _old_lines(stream: BinaryIO | None) -> Iterator[bytes]:
    while stream is not None and (line := stream.readline(MAX_LINE + 1)):
        yield line


def _short(line: bytes | None) -> str:
    if line is None:
        return "nothing"
    text = line.rstrip(b"\n").decode("ascii", "backslashreplace")
    return text if len(text) <= 90 else text[:87] + "..."


def deleted_ledger(path: str, before: str) -> LedgerReport:
    report = LedgerReport(path=path, format="ledger", checks=["append-only"])
    report.problem(LedgerError(f"ledger deleted (it existed in {before}); ledgers are "
                               "append-only", path=path, check="append-only",
                               expected="the ledger kept", got="deleted"))
    return report


def check_ledger(ctx: Context, tree: Tree, path: str, new: str, old: str | None,
                 before: str, *, links: bool = True, entries: bool = True) -> LedgerReport:
    """Check the ledger blob ``new`` at ``path`` of ``tree`` against ``old`` (the version in
    ``before``; None when it is new). ``links=False, entries=False``: append-only only."""
    report = LedgerReport(path=path, format="ledger",
                          checks=["append-only", "grammar"]
                          + (["order", "chain", "merkle"] if links else [])
                          + (["file"] if entries else []))
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(ctx.git.open_blob(new))
        previous = stack.enter_context(ctx.git.open_blob(old)) if old else None
        olds = _old_lines(previous)
        prev, kept, rewritten = None, 0, False
        try:
            for rec in iter_lines(stream, path):
                report.entries += 1
                was = next(olds, None)
                if was is not None:
                    kept += 1
                    if was != _raw(rec) and not rewritten:  # the first rewritten line is named
                        report.problem(_rewritten(rec.line_no, before, was, _raw(rec)))
                        rewritten = True
                elif entries:
                    _problem(report, check_entry(ctx, tree, rec))
                if links:
                    _problem(report, check_link(rec, prev))
                prev = rec
        except FormatError as exc:  # unparsable line: what follows cannot be placed
            report.problem(exc)
            return report
        _removed_tail(report, olds, kept, before)
        report.head = prev.chain if prev else report.head
        report.last_gen = prev.entry.gen if prev else None
    return report


def _problem(report: LedgerReport, error: FormatError | None) -> None:
    if error is not None:
        report.problem(error)


def _rewritten(line_no: int, before: str, was: bytes, now: bytes) -> LedgerError:
    """Name the first field that differs (whole lines look alike: same gen, same ts...)."""
    old_fields, new_fields = was.rstrip(b"\n").split(b" "), now.rstrip(b"\n").split(b" ")
    at = next((i for i, (a, b) in enumerate(zip(old_fields, new_fields)) if a != b),
              min(len(old_fields), len(new_fields)))
    return LedgerError(f"line {line_no} of {before} was changed (history rewritten; a ledger "
                       "only grows at the end)", line=line_no, check="append-only",
                       expected=_short(b" ".join(old_fields[at:at + 1]) or None),
                       got=_short(b" ".join(new_fields[at:at + 1]) or None))


def _removed_tail(report: LedgerReport, olds: Iterator[bytes], kept: int, before: str) -> None:
    missing = sum(1 for _ in olds)
    if missing:
        report.problem(LedgerError(
            f"{missing} line(s) of {before} removed (a ledger only grows at the end)",
            line=kept + 1, check="append-only",
            expected=f"at least the {kept + missing} lines of {before}", got=f"{kept} lines"))


class TreeSource:
    """Snapshot files of a Git tree, for :func:`snapops.daemon.entry_values.check_values`."""

    def __init__(self, ctx: Context, tree: Tree) -> None:
        self.ctx, self.tree = ctx, tree

    def open(self, rel: str):
        oid = self.tree.blob(rel)
        if oid is None:
            raise FormatError("no such file", path=rel, check="missing")
        return self.ctx.git.open_blob(oid)

    def read(self, rel: str, limit: int) -> bytes | None:
        oid = self.tree.blob(rel)
        return None if oid is None else self.ctx.git.read_blob(oid, limit)


def check_entry(ctx: Context, tree: Tree, rec: LedgerLine) -> LedgerError | None:
    """The snapshot a new entry names must be in ``tree`` and carry the entry's values."""
    e, n = rec.entry, rec.line_no
    if tree.blob(e.path) is None:
        return LedgerError(f"snapshot {e.path} named by this new entry is not in {tree.label}",
                           line=n, check="missing", expected=f"{e.path} committed with its "
                           "entry", got="no such file")
    return check_values(rec, TreeSource(ctx, tree), f"in {tree.label}")
