"""The checks behind ``snapops hook pre-commit | pre-push | pre-receive`` and
``snapops verify --ci --range``: one :class:`Checker` verifies the snapshot files and ledgers a
tree changes (the index against HEAD, or a commit against its first parent), and a moved ref's
ledgers against its old tip (which also catches history rewritten by a force push).

What is checked, per changed path:

* a snapshot file of any registered format (recognised by content): every check its format's
  ``verify`` makes, with the repository's keys (:mod:`.repo_config`); a changed ``.wsum``
  re-verifies the ``.wtxt`` beside it;
* a ledger (``*.ledger``): append-only against the version before, chained, and each new entry
  matching the snapshot it names in the same tree (:mod:`.ledger_check`).

Example::

    with Checker.open(Git(".")) as checker:
        outcome = checker.check_index()
    outcome.ok, [str(p) for p in outcome.problems()]
    # -> (False, ['snapshots/run1/s.wtxt:9: [crc32c] array w, chunk 1: expected ..., got ...'])
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from snapops.daemon.ledger import LedgerReport
from snapops.formats.errors import FormatError
from snapops.formats.report import Report

from .gitio import Change, Git, Tree
from .ledger_check import check_ledger, deleted_ledger, is_ledger
from .repo_config import RepoConfig, load_repo_config
from .snapshot_check import WSUM_SUFFIX, Context, verify_blob


@dataclass
class Outcome:
    """The reports for one checked unit: the index, a commit, or a moved ref."""

    where: str
    commit: str | None = None
    reports: list[Report] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)

    def problems(self) -> list[FormatError]:
        found = []
        for r in self.reports:
            if isinstance(r, LedgerReport) and r.problems:
                found.extend(r.problems)
            elif r.failure is not None:
                found.append(r.failure)
        return found

    def to_dict(self) -> dict:
        return {"where": self.where, "commit": self.commit, "ok": self.ok,
                "files": [r.to_dict() for r in self.reports]}


@dataclass(frozen=True)
class RefUpdate:
    """A ref moving from ``old`` to ``new`` (None: created / deleted)."""

    ref: str
    old: str | None
    new: str | None


class Checker:
    """Checks trees of one repository with its settings; owns a private scratch folder."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.git = ctx.git

    @classmethod
    @contextlib.contextmanager
    def open(cls, git: Git, cfg: RepoConfig | None = None) -> Iterator["Checker"]:
        cfg = cfg if cfg is not None else load_repo_config(git)
        with tempfile.TemporaryDirectory(prefix="snapops-hook-") as tmp:  # mode 0700
            yield cls(Context(git, cfg, Path(tmp)))

    def check_changes(self, tree: Tree, changes: list[Change], before: str) -> list[Report]:
        reports: list[Report] = []
        verified: set[str] = set()
        companions: list[str] = []
        for ch in changes:
            if is_ledger(ch.path):
                reports.append(self._ledger(tree, ch, before))
            elif ch.new is not None and ch.path.endswith(WSUM_SUFFIX):
                companions.append(ch.path)
            elif ch.new is not None:
                verified.add(ch.path)
                report = verify_blob(self.ctx, tree, ch.path, ch.new)
                if report is not None:
                    reports.append(report)
        for wsum in companions:
            target = wsum[:-len(WSUM_SUFFIX)]
            if target not in verified:
                reports.append(self._with_snapshot(tree, wsum, target))
        return reports

    def _ledger(self, tree: Tree, ch: Change, before: str) -> Report:
        if ch.new is None:
            return deleted_ledger(ch.path, before)
        return check_ledger(self.ctx, tree, ch.path, ch.new, ch.old, before)

    def _with_snapshot(self, tree: Tree, wsum: str, target: str) -> Report:
        oid = tree.blob(target)
        report = verify_blob(self.ctx, tree, target, oid) if oid else None
        if report is None:
            report = Report(path=wsum, format="wsum").fail(FormatError(
                "a WSUM finalizes the snapshot beside it", path=wsum, line=1, check="wsum",
                expected=f"{target} in {tree.label}", got="no such snapshot file"))
        return report

    def check_index(self) -> Outcome:
        """What ``git commit`` is about to record, against HEAD."""
        tree = self.git.index()
        return Outcome("the index", None, self.check_changes(tree, tree.changes(), "HEAD"))

    def check_commit(self, commit: str) -> Outcome:
        parents = self.git.parents(commit)
        before = f"parent {parents[0][:12]}" if parents else "the empty tree (root commit)"
        where = f'commit {commit[:12]} "{self.git.subject(commit)}"'
        tree = self.git.commit(commit)
        return Outcome(where, commit, self.check_changes(tree, tree.changes(), before))

    def check_ref(self, update: RefUpdate) -> Outcome:
        """Ledgers at the new tip against the old tip: append-only across the whole move
        (chains and entries were checked in the commits that changed them)."""
        outcome = Outcome(f"ref {update.ref} {update.old[:12]}..{update.new[:12]}")
        tree = self.git.commit(update.new)
        before = f"the old tip {update.old[:12]} of {update.ref}"
        for ch in tree.changes(parent=update.old):
            if not is_ledger(ch.path):
                continue
            if ch.new is None:
                outcome.reports.append(deleted_ledger(ch.path, before))
            else:
                outcome.reports.append(check_ledger(self.ctx, tree, ch.path, ch.new, ch.old,
                                                    before, links=False, entries=False))
        return outcome

    def check_updates(self, updates: list[RefUpdate], exclude: list[str],
                      progress: Callable[[list[str]], Iterable[str]] = iter) -> list[Outcome]:
        """Every commit new to the receiving side (``exclude``: rev-list arguments for what it
        already has), then each moved ref's ledgers against its old tip. ``progress`` wraps
        the list of commits (a progress bar)."""
        commits: dict[str, None] = {}  # ordered set: oldest first, each commit once
        for up in updates:
            if up.new is not None:  # a deletion records nothing new
                commits.update(dict.fromkeys(self.git.commits(up.new, "--not", *exclude)))
        outcomes = [self.check_commit(commit) for commit in progress(list(commits))]
        for up in updates:
            if up.new is not None and up.old is not None and self.git.resolve(up.old):
                outcomes.append(self.check_ref(up))
        return outcomes


def parse_updates(text: str, null: str, *, push: bool) -> list[RefUpdate]:
    """Ref updates from a pre-push (``lref lsha rref rsha``) or pre-receive (``old new ref``)
    standard input."""
    updates = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if push and len(fields) == 4:
            ref, old, new = fields[2], fields[3], fields[1]
        elif not push and len(fields) == 3:
            old, new, ref = fields
        else:
            old = new = ""
        if not (_is_oid(old, null) and _is_oid(new, null)):
            raise FormatError("malformed hook input", check="input",
                              expected="<local ref> <local sha> <remote ref> <remote sha>"
                              if push else "<old sha> <new sha> <ref>", got=line)
        updates.append(RefUpdate(ref, None if old == null else old, None if new == null else new))
    return updates


def _is_oid(text: str, null: str) -> bool:
    return len(text) == len(null) and all(c in "0123456789abcdef" for c in text)
