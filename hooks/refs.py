"""Rules for moving refs (pre-push, pre-receive): what commits cannot say on their own.

* **deleting** the protected branch or a generation tag ``<run>/gen-N`` is refused (deleting and
  pushing again is how history would otherwise be replaced);
* a **generation tag** names the commit of generation N: it must point (through annotated tags)
  at a commit whose ``snapshots/<run>/MANIFEST`` says gen N, and it never moves;
* a **branch** that moves keeps every ledger line of its old tip; a branch that is **created**
  keeps every ledger line of the protected branch (so a new branch cannot start a rewritten
  history). The protected branch is ``snapops.protectedBranch``, by default the one HEAD names
  (in a bare repository: the repository's default branch).

Example::

    [str(p) for p in check_ref(git, RefUpdate("refs/tags/run1/gen-000002", None, oid), ...)]
    # -> ['refs/tags/run1/gen-000002: [tag] expected a commit of generation 000002, got gen 000001']
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from snapops.formats.errors import FormatError, LimitError
from snapops.formats.generation import gen_text, parse_manifest, valid_run
from snapops.formats.generation.manifest import MAX_BYTES, parse_gen_text
from snapops.formats.generation.verify import manifest_path
from snapops.formats.gitcmd import ref_lines

from .layout import LEDGER_SUFFIX, LEDGERS, small_blob, tree_changes
from .ledger_check import check_append_only

BRANCH_PREFIX, TAG_PREFIX, REMOTES_PREFIX = "refs/heads/", "refs/tags/", "refs/remotes/"
GEN_TAG = re.compile(r"refs/tags/(?P<run>.+)/gen-(?P<gen>[^/]*)")


@dataclass(frozen=True)
class RefUpdate:
    """A ref moving from ``old`` to ``new`` (None: created / deleted)."""

    ref: str
    old: str | None
    new: str | None


def ref_problem(update: RefUpdate, message: str, check: str = "ref", **where) -> FormatError:
    return FormatError(message, path=update.ref, check=check, **where)


def protected_branch(git, configured: str | None, symref: str = "HEAD") -> str | None:
    """The protected branch's short name: configured, else what ``symref`` names."""
    if configured:
        return configured
    target = git.text("symbolic-ref", "-q", symref, check=False)
    if target.startswith(BRANCH_PREFIX):          # HEAD of this repository
        return target[len(BRANCH_PREFIX):]
    if target.startswith(REMOTES_PREFIX):         # refs/remotes/<remote>/HEAD
        return target[len(REMOTES_PREFIX):].partition("/")[2] or None
    return None


def check_deletion(update: RefUpdate, protected: str | None) -> list[FormatError]:
    if protected and update.ref == BRANCH_PREFIX + protected:
        return [ref_problem(update, "deleting the protected branch is refused "
                            "(snapops.protectedBranch)")]
    if GEN_TAG.fullmatch(update.ref):
        return [ref_problem(update, "deleting a generation tag is refused (tags name sealed "
                            "generations for good)", check="tag")]
    return []


def check_gen_tag(git, update: RefUpdate) -> list[FormatError]:
    """A ``<run>/gen-N`` tag: created once, pointing at generation N of ``run``."""
    m = GEN_TAG.fullmatch(update.ref)
    if m is None:
        return []
    run, gen = m["run"], m["gen"]
    if not valid_run(run) or parse_gen_text(gen) is None:
        return [ref_problem(update, "malformed generation tag", check="tag",
                            expected="refs/tags/<run>/gen-<gen, 6+ digits>", got=update.ref)]
    if update.old is not None and update.old != update.new:
        return [ref_problem(update, "a generation tag never moves", check="tag",
                            expected=f"it stays at {update.old[:12]}", got=update.new[:12])]
    path = manifest_path(run)
    data = small_blob(git, f"{update.new}^{{commit}}:{path}", MAX_BYTES)
    if data is None:
        return [ref_problem(update, f"the tag's commit has no {path}", check="tag",
                            expected=f"a commit of generation {gen}", got="no MANIFEST")]
    try:
        found = parse_manifest(data, path).header.gen
    except FormatError as exc:
        return [exc]
    if gen_text(found) != gen:
        return [ref_problem(update, "the tag does not name its generation", check="tag",
                            expected=f"a commit of generation {gen}",
                            got=f"gen {gen_text(found)}")]
    return []


def check_ledgers_kept(git, update: RefUpdate, base: str, before: str) -> list[FormatError]:
    """Every ledger at ``base`` is kept, line for line, at the new tip (one ``diff-tree``
    finds the ledgers that differ)."""
    problems: list[FormatError] = []
    try:
        changes = tree_changes(git, base, update.new, LEDGERS)
    except LimitError as exc:   # a tree bomb under ledger/
        return [exc]
    for change in changes:
        top, _, rest = change.path.partition("/")
        if top != LEDGERS or not rest.endswith(LEDGER_SUFFIX) or change.old is None:
            continue
        report = check_append_only(git, change.path, change.new, change.old, before)
        problems += report.problems
    return problems


def check_ref(git, update: RefUpdate, protected: str | None,
              protected_tip: str | None) -> list[FormatError]:
    """Every rule for one ref update; ``protected_tip``: the commit a created branch must
    extend (the protected branch as the receiving side has it; None: no check)."""
    if update.new is None:
        return check_deletion(update, protected)
    if git.resolve(f"{update.new}^{{object}}") is None:     # fail closed, whatever git allows
        return [ref_problem(update, "the new value names no object in this repository",
                            expected="an object id the push brought", got=update.new[:40])]
    if update.ref.startswith(TAG_PREFIX):
        return check_gen_tag(git, update)
    if not update.ref.startswith(BRANCH_PREFIX):
        return []
    if git.resolve(f"{update.new}^{{commit}}") is None:
        return [ref_problem(update, "a branch must point at a commit", expected="a commit",
                            got=git.text("cat-file", "-t", update.new, check=False) or "?")]
    if update.old is not None and git.resolve(update.old):
        return check_ledgers_kept(git, update, update.old,
                                  f"the old tip {update.old[:12]} of {update.ref}")
    if protected_tip is not None and update.ref != BRANCH_PREFIX + protected:
        return check_ledgers_kept(git, update, protected_tip,
                                  f"the protected branch {protected} ({protected_tip[:12]})")
    return []


def gen_tags_at(git, commits: set[str]) -> list[RefUpdate]:
    """The generation tags of the repository that point (through any number of tag objects)
    at one of ``commits`` (CI: the tags of a verified range), as creations to check."""
    listed = git.run("for-each-ref", "--format=%(refname)", TAG_PREFIX)
    refs = [ref for ref in ref_lines(listed) if GEN_TAG.fullmatch(ref)]
    if not refs:
        return []
    peeled = git.run("cat-file", "--batch-check=%(objectname)",
                     input="".join(f"{ref}^{{commit}}\n" for ref in refs).encode()).split(b"\n")
    return [RefUpdate(ref, None, git.resolve(ref)) for ref, commit in zip(refs, peeled)
            if commit.decode("ascii", "replace").strip() in commits]
