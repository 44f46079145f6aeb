"""A ledger blob against the version before it: append-only.

Every line of the previous version (HEAD for a commit being made, the first parent for a pushed
commit, the old tip or the protected branch for a moved or created ref) must be, byte for byte,
the same line of the new version; only lines after them are new. A deleted ledger is refused.
Whether the lines chain and whether the last one seals the generation's MANIFEST is the
generation verifier's job (:func:`snapops.formats.generation.verify.check_ledger_seal`).

Both versions are streamed line by line from ``git cat-file``, each line bounded.

Example::

    report = check_append_only(git, "ledger/run1.ledger", new_oid, head_oid, "HEAD")
    [str(p) for p in report.problems], report.details["new_lines"]
    # -> (['ledger/run1.ledger:2: [append-only] line 2 of HEAD was changed: ...'], 1)
"""

from __future__ import annotations

import contextlib
from typing import BinaryIO, Iterator

from snapops.formats.errors import FormatError, LedgerError
from snapops.formats.ledger import MAX_LINE, LedgerLine, LedgerReport, iter_lines


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


def check_append_only(git, path: str, new: str | None, old: str | None,
                      before: str) -> LedgerReport:
    """Check the ledger blob ``new`` at ``path`` against ``old`` (the version in ``before``;
    None when there was none). ``report.details["new_lines"]``: how many lines were added."""
    if new is None:
        return deleted_ledger(path, before)
    report = LedgerReport(path=path, format="ledger", checks=["append-only", "grammar"])
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(git.open_blob(new))
        previous = stack.enter_context(git.open_blob(old)) if old else None
        olds = _old_lines(previous)
        kept, rewritten, last = 0, False, None
        try:
            for rec in iter_lines(stream, path):
                report.entries += 1
                last = rec
                was = next(olds, None)
                if was is None:
                    continue
                kept += 1
                if was != _raw(rec) and not rewritten:  # the first rewritten line is named
                    report.problem(_rewritten(rec.line_no, before, was, _raw(rec)))
                    rewritten = True
        except FormatError as exc:  # unparsable line: what follows cannot be placed
            report.problem(exc)
            return report
        _removed_tail(report, olds, kept, before)
    report.details["new_lines"] = report.entries - kept
    report.head = last.chain if last else report.head
    report.last_gen = last.entry.gen if last else None
    return report


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
