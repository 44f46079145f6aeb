"""The checks behind ``snapops hook pre-commit | pre-push | pre-receive`` and
``snapops verify --ci --range``: one code path, the generation verifier, for every tree.

For a tree (the index against HEAD, or a commit against its first parent):

1. the layout rules (:mod:`.layout`): every changed path is safe, every changed path under
   ``snapshots/`` and ``ledger/`` belongs to a run, no such blob is larger than
   ``snapops.maxBlobSize`` (sizes read from git; nothing is read or written before);
2. each run it touches commits a new generation: its ledger keeps every line of the parent's
   and adds exactly one (:mod:`.ledger_check`), and the generation is verified as a whole by
   :func:`~snapops.formats.generation.verify.verify_generation` from a
   :class:`~snapops.formats.generation.source.GitTreeSource` (exact file set, each shard against
   its declared format and sealed digest, the seal by a trusted key, the chain to the parent's
   MANIFEST, the ledger's last line sealing it), with the keys and requirements of
   :mod:`.repo_config`.

Then each moved ref follows the rules of :mod:`.refs`. Blobs are only ever materialised in one
private scratch folder (mode 0700) that is removed afterwards.

Example::

    with Checker.open(Git(".")) as checker:
        outcome = checker.check_index()
    outcome.ok, [str(p) for p in outcome.problems()]
    # -> (False, ['snapshots/run1/MANIFEST:3: [chain] the MANIFEST does not chain ...'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from snapops.formats.errors import FormatError, LimitError
from snapops.formats.generation.manifest import MAX_BYTES, parse_manifest
from snapops.formats.generation.source import GitTreeSource
from snapops.formats.generation.verify import (
    manifest_path, remember_verified, verify_generation,
)
from snapops.formats.ledger import LedgerReport
from snapops.formats.lfs.retention import MAX_RECORD, check_not_pruned, parse_record
from snapops.formats.report import Report

from .gitio import Git
from .layout import TreeChange, check_blob_sizes, small_blob, sort_changes, tree_changes
from .ledger_check import check_append_only
from .refs import RefUpdate, check_ref
from .repo_config import RepoConfig, load_repo_config


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

    def refuse(self, problems: Iterable[FormatError], kind: str) -> None:
        for problem in problems:
            self.reports.append(Report(path=problem.path or self.where, format=kind)
                                .fail(problem))

    def to_dict(self) -> dict:
        return {"where": self.where, "commit": self.commit, "ok": self.ok,
                "files": [r.to_dict() for r in self.reports]}


class Checker:
    """Checks trees and refs of one repository with its settings, in one scratch folder."""

    def __init__(self, git: Git, cfg: RepoConfig, scratch: str, lfs=None) -> None:
        self.git, self.cfg, self.scratch = git, cfg, scratch
        git.max_paths = cfg.max_paths
        self.lfs = lfs  # (source, run) -> an LfsSource: LFS-store contents fetched, verified
        # keys loaded once; a shard verified in one commit is not verified again in the next
        self.options = cfg.generation_options(memo={})
        self.trusted_parents: set[str] = set()

    @classmethod
    @contextlib.contextmanager
    def open(cls, git: Git, cfg: RepoConfig | None = None, lfs=None) -> Iterator["Checker"]:
        cfg = cfg if cfg is not None else load_repo_config(git)
        with tempfile.TemporaryDirectory(prefix="snapops-hook-") as tmp:  # mode 0700
            yield cls(git, cfg, tmp, lfs)

    def source(self, tree_ish: str, label: str | None = None) -> GitTreeSource:
        return GitTreeSource(self.git, tree_ish, self.scratch, max_blob=self.cfg.max_blob_size,
                             label=label)

    def check_tree(self, source: GitTreeSource, parent: str | None, outcome: Outcome,
                   before: str) -> Outcome:
        """Every run the tree of ``source`` changes against commit ``parent`` (None: none)."""
        try:
            changes = tree_changes(self.git, parent or self.git.empty_tree(), source.commit)
        except LimitError as exc:   # a tree bomb: nothing of it is read
            outcome.refuse([exc], "tree")
            return outcome
        runs = sort_changes(changes)
        refused = runs.problems + check_blob_sizes(self.git, changes, self.cfg.max_blob_size)
        if refused:  # nothing of this tree is read
            outcome.refuse(refused, "tree")
            return outcome
        for run in sorted(runs.runs):
            ledger = runs.ledgers.get(run)
            if ledger is not None:
                outcome.reports.append(self._ledger(ledger, before))
            outcome.reports.append(self._generation(source, run, parent, changes))
        for run, change in sorted(runs.records.items()):
            if change.new is not None:
                outcome.reports.append(self._retention(source.commit, run, change.path))
        return outcome

    def _retention(self, tree: str, run: str, path: str) -> Report:
        """A pushed retention record parses, prunes nothing its policy keeps, and not the
        run's generation in the same tree (the newest: every policy keeps it)."""
        report = Report(path=path, format="retention")
        try:
            data = small_blob(self.git, f"{tree}:{path}", MAX_RECORD)
            if data is None:
                raise FormatError("larger than any retention record", path=path, check="limit",
                                  expected=f"at most {MAX_RECORD} bytes", got="more")
            record = parse_record(data, path)
            manifest = small_blob(self.git, f"{tree}:{manifest_path(run)}", MAX_BYTES)
            if manifest is None:
                raise FormatError(f"a retention record of run {run}, which has no generation "
                                  "in this tree", path=path, check="retention",
                                  expected=f"{manifest_path(run)}", got="none")
            check_not_pruned(record, parse_manifest(manifest, manifest_path(run)).header.gen,
                             path)
        except FormatError as exc:
            return report.fail(exc)
        report.passed("retention")
        return report

    def _ledger(self, change: TreeChange, before: str) -> Report:
        report = check_append_only(self.git, change.path, change.new, change.old, before)
        if report.ok and report.details["new_lines"] > 1:
            report.problem(FormatError("a commit adds one ledger line, the one of its "
                                       "generation", path=change.path, check="ledger",
                                       expected="1 new line",
                                       got=f"{report.details['new_lines']} new lines"))
        return report

    def _generation(self, source: GitTreeSource, run: str, parent: str | None,
                    changes: list[TreeChange]) -> Report:
        path = manifest_path(run)
        if self.lfs is not None:
            source = self.lfs(source, run)
        if not any(c.path == path and c.new is not None for c in changes):
            # not a new generation: name what is wrong with the files if anything is
            report = verify_generation(source, run, self.options)
            return report if not report.ok else report.fail(FormatError(
                f"files of run {run} changed without a new generation (a changed MANIFEST and "
                "its ledger line)", path=path, check="generation",
                expected="a new sealed MANIFEST", got="the parent's MANIFEST"))
        previous = small_blob(self.git, f"{parent}:{path}", MAX_BYTES) if parent else None
        if parent in self.trusted_parents:
            remember_verified(self.source(parent), run, self.options.memo)
        options = dataclasses.replace(self.options, expect_prev=previous)
        return verify_generation(source, run, options)

    def check_index(self) -> Outcome:
        """What ``git commit`` is about to record, against HEAD."""
        worktree = self.git.toplevel() if self.cfg.use_worktree else None
        source = GitTreeSource.staged(self.git, self.scratch, max_blob=self.cfg.max_blob_size,
                                      worktree=worktree)
        head = self.git.resolve("HEAD^{commit}")
        return self.check_tree(source, head, Outcome("the index"), "HEAD")

    def check_commit(self, commit: str) -> Outcome:
        parents = self.git.parents(commit)
        parent = parents[0] if parents else None
        before = f"parent {parent[:12]}" if parent else "the empty tree (root commit)"
        subject = self.git.subject(commit)
        where = f'commit {commit[:12]} "{subject[:72]}{"..." if len(subject) > 72 else ""}"'
        return self.check_tree(self.source(commit), parent, Outcome(where, commit), before)

    def trust_known_parents(self, commits: dict[str, None]) -> None:
        """Parents the receiving side already has (not new in this push) passed this check
        when they arrived: their generation's shards need not be read again."""
        if not commits:
            return
        listing = self.git.run("rev-list", "--no-walk", "--parents", "--stdin",
                               input="".join(f"{c}\n" for c in commits).encode("ascii"))
        for line in listing.decode("ascii").splitlines():
            self.trusted_parents.update(p for p in line.split()[1:] if p not in commits)

    def check_refs(self, updates: list[RefUpdate], protected: str | None,
                   protected_tip: str | None) -> Outcome:
        outcome = Outcome("refs")
        for update in updates:
            outcome.refuse(check_ref(self.git, update, protected, protected_tip), "ref")
        return outcome

    def check_updates(self, updates: list[RefUpdate], exclude: list[str], *,
                      protected: str | None = None, protected_tip: str | None = None,
                      progress: Callable[[list[str]], Iterable[str]] = iter) -> list[Outcome]:
        """Every commit new to the receiving side (``exclude``: rev-list arguments for what it
        already has), oldest first, then the rules for each moved ref."""
        commits: dict[str, None] = {}  # ordered set: oldest first, each commit once
        for up in updates:
            if up.new is not None and self.git.resolve(f"{up.new}^{{commit}}"):
                commits.update(dict.fromkeys(self.git.commits(up.new, "--not", *exclude)))
        self.trust_known_parents(commits)
        outcomes = [self.check_commit(commit) for commit in progress(list(commits))]
        outcomes.append(self.check_refs(updates, protected, protected_tip))
        return outcomes


def parse_updates(text: str, null: str, *, push: bool) -> list[RefUpdate]:
    """Ref updates from a pre-push (``lref lsha rref rsha``) or pre-receive (``old new ref``)
    standard input."""
    updates = []
    # cut only where git does (LF, SP): split() and splitlines() also cut at the U+00A0 or
    # U+2028 a ref name may hold, and the rules would check another ref than git updates
    for line in text.split("\n"):
        if not line:
            continue
        fields = line.split(" ")
        if push and len(fields) == 4:
            ref, old, new = fields[2], fields[3], fields[1]
        elif not push and len(fields) == 3:
            old, new, ref = fields
        else:
            old = new = ""
        if not (_is_oid(old, null) and _is_oid(new, null)):
            raise FormatError("malformed hook input", check="input",
                              expected="<local ref> <local sha> <remote ref> <remote sha>"
                              if push else "<old sha> <new sha> <ref>", got=line[:120] if line.isprintable() else ascii(line[:120]))
        updates.append(RefUpdate(ref, None if old == null else old, None if new == null else new))
    return updates


def _is_oid(text: str, null: str) -> bool:
    return len(text) == len(null) and all(c in "0123456789abcdef" for c in text)

