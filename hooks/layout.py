"""The layout of a snapshot repository: which changed paths belong to which generation.

A commit may change these paths, and nothing else under ``snapshots/``, ``ledger/`` or
``retention/``:

==============================  ===============================================================
``snapshots/<run>/...``         a file of run ``<run>``'s generation: the run is verified as a
                                whole (its MANIFEST says which files exist, in which format;
                                companions such as WSUM are the MANIFEST's ``file`` lines)
``ledger/<run>.ledger``         the run's ledger: append-only, and the run is verified as a whole
``retention/<run>.retention``   the LFS store's retention record (``snapops lfs prune``): a
                                regular file that parses and prunes no generation its own policy
                                keeps, nor the run's generation in the same tree
anything else                   not snapops' business
==============================  ===============================================================

Every changed path, anywhere in the tree, must be a plain relative path
(:func:`~snapops.formats.generation.source.safe_relpath`): a crafted tree with ``..`` or
``.git`` entries is refused before anything is read. Symlinks and submodules are changes like
any other (the generation verifier refuses them where a file belongs).

Example::

    sorted(sort_changes(tree_changes(git, parent, commit)).runs)
    # -> ['run1']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from snapops.formats.errors import FormatError, LimitError
from snapops.formats.generation import valid_run
from snapops.formats.generation.source import FILE, entry_kind, safe_relpath

from .gitio import diff_trees

SNAPSHOTS, LEDGERS, RETENTION = "snapshots", "ledger", "retention"
LEDGER_SUFFIX, RECORD_SUFFIX = ".ledger", ".retention"


@dataclass(frozen=True)
class TreeChange:
    """One path that differs between two trees (``old``/``new``: object ids, None when the
    path is absent on that side; ``kind``: what the new side is, see ``entry_kind``)."""

    path: str
    old: str | None
    new: str | None
    old_kind: str | None
    new_kind: str | None


@dataclass
class Sorted:
    """A commit's changes sorted by rule: runs touched, their ledgers, refusals."""

    runs: set[str] = field(default_factory=set)
    ledgers: dict[str, TreeChange] = field(default_factory=dict)  # run -> ledger change
    records: dict[str, TreeChange] = field(default_factory=dict)  # run -> retention record
    problems: list[FormatError] = field(default_factory=list)


def tree_changes(git, old_tree: str, new_tree: str, *pathspecs: str) -> list[TreeChange]:
    """Every path (under ``pathspecs``) that differs between two tree-ish objects, whatever
    its kind (regular files, symlinks and submodules alike; a rename is a delete and an add),
    at most ``snapops.maxPaths`` on each side (:func:`~snapops.hooks.gitio.diff_trees`)."""
    return [TreeChange(d.path, d.old and d.old.oid, d.new and d.new.oid,
                       d.old and entry_kind(d.old.mode), d.new and entry_kind(d.new.mode))
            for d in diff_trees(git, old_tree, new_tree, *pathspecs)]


def sort_changes(changes: list[TreeChange]) -> Sorted:
    """Apply the layout rules; each path no rule recognises becomes a problem."""
    result = Sorted()
    for change in changes:
        try:
            _sort_one(change, result)
        except FormatError as exc:
            result.problems.append(exc)
    return result


def _sort_one(change: TreeChange, result: Sorted) -> None:
    path = safe_relpath(change.path)
    top, _, rest = path.partition("/")
    if top.lower() not in (SNAPSHOTS, LEDGERS, RETENTION):
        return
    if top == SNAPSHOTS and "/" in rest and valid_run(rest.split("/", 1)[0]):
        result.runs.add(rest.split("/", 1)[0])
        return
    run = rest.removesuffix(LEDGER_SUFFIX)
    if top == LEDGERS and rest.endswith(LEDGER_SUFFIX) and valid_run(run):
        if change.new is not None and change.new_kind != FILE:
            raise FormatError(f"a ledger must be a regular file, not a {change.new_kind}",
                              path=path, check="layout", expected="a regular file",
                              got=change.new_kind)
        result.runs.add(run)
        result.ledgers[run] = change
        return
    run = rest.removesuffix(RECORD_SUFFIX)
    if top == RETENTION and rest.endswith(RECORD_SUFFIX) and valid_run(run):
        if change.new is not None and change.new_kind != FILE:
            raise FormatError(f"a retention record must be a regular file, not a "
                              f"{change.new_kind}", path=path, check="layout",
                              expected="a regular file", got=change.new_kind)
        result.records[run] = change
        return
    raise FormatError("no rule allows this path (a generation lives in snapshots/<run>/, its "
                      "ledger in ledger/<run>.ledger, its retention record in "
                      "retention/<run>.retention)", path=path, check="layout",
                      expected="snapshots/<run>/<file>, ledger/<run>.ledger or "
                      "retention/<run>.retention", got=path[:120])


def small_blob(git, spec: str, limit: int) -> bytes | None:
    """The blob ``spec`` (``REV:PATH``) names, if it is a blob of at most ``limit`` bytes;
    None when it is absent, not a blob, or larger (then not read)."""
    return git.small_blobs([spec], limit).get(spec)


def check_blob_sizes(git, changes: list[TreeChange], limit: int) -> list[FormatError]:
    """Refuse every new blob under snapshots/ or ledger/ larger than ``limit``
    (``snapops.maxBlobSize``), from one ``cat-file --batch-check``: nothing is read."""
    ours = [c for c in changes if c.new is not None and c.new_kind == FILE
            and c.path.split("/", 1)[0].lower() in (SNAPSHOTS, LEDGERS)]
    if not ours:
        return []
    query = "".join(f"{c.new}\n" for c in ours).encode("ascii")
    sizes = git.run("cat-file", "--batch-check=%(objectsize)", input=query).split()
    problems = []
    for change, size in zip(ours, sizes):
        if int(size) > limit:
            problems.append(LimitError("blob larger than snapops.maxBlobSize (raise it with "
                                       "git config snapops.maxBlobSize if this is intended)",
                                       path=change.path, expected=f"at most {limit} bytes",
                                       got=f"{int(size)} bytes"))
    return problems
