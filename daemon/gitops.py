"""The snapshot repository: commit a generation atomically, tag it, push it to remotes.

Every write runs the real ``git`` through :func:`snapops.formats.gitcmd.run_git` (its own
process group, killed with the daemon; stall detection for pushes). Apart from the shard packs
below, nothing is written by a reimplementation, so what lands in the repository is exactly
what ``git`` itself would write.
Reads of the repository's own objects, refs and config (the last MANIFEST, tags, commit
messages, the identity) go through gitpython's object database, which keeps one ``git cat-file
--batch`` process open instead of starting a git process per question.

A generation is committed with plumbing, in an order that never leaves a partial commit:

1. the index is reset to the branch tip (``read-tree -m``: a failed earlier attempt cannot leak
   staged files into this commit, and stat info of unchanged entries is kept);
2. exactly the given paths are staged (``add -A -f``; paths missing from the work tree are
   staged as removals with ``rm --cached``);
3. ``write-tree``, ``commit-tree`` and an annotated tag object (``hash-object -t tag``, which
   checks the tag's format) are written as loose objects: unreachable until step 4;
4. one ``update-ref --stdin`` transaction moves the branch and creates the tag together.

A crash or error before step 4 leaves only unreachable objects (``git gc`` removes them); the
same call repeated later starts again from step 1. If the tag exists, the call returns its commit
without committing again; if the branch tip already is this generation's commit but the tag is
missing (a crash inside step 4), the tip is tagged instead of committing twice.

Before step 1, large shards may be stored in a pack the daemon writes (sparsely changed ones
as git deltas of their versions at the tip, the others whole: :meth:`SnapshotRepo.pack_shards`,
:mod:`snapops.daemon.shardpack`): the one place where the daemon writes objects itself, a pack
and its index in git's own format, checked against git in tests and read back through git
before step 2 stages them by object id.

The remote side (pushes, a remote's refs) is :mod:`snapops.daemon.gitremote`.

Example::

    repo = SnapshotRepo("snapshot-repo", branch="main")
    sha = repo.commit_generation(["snapshots/run1/MANIFEST"], "gen 1", "run1/gen-000001")
    repo.push("/srv/remote.git", ["run1/gen-000001"], branch_commit=sha, stall=120)
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterable, Iterator, Mapping

import git

from snapops.formats.errors import GitError
from snapops.formats.gitcmd import GitExit, GitResult, run_git

from .shardpack import (
    CONVERSIONS, MIN_SIZE, Candidate, ShardPack, converted, tip_blobs, write_shard_pack,
)
from .localhistory import add_shallow, object_bytes, object_counts, repack_dropping, shallow
from .objectreader import ObjectReader
from .gitlocks import lock_candidates, remove_dead_locks, remove_locks
from .gitremote import RemoteMixin

__all__ = ["SnapshotRepo"]

log = logging.getLogger("snapops.daemon.gitops")
# gitpython's persistent ``git cat-file`` helpers (attributes of ``git.Repo.git``)

# The daemon's paths are literal paths, never pathspec magic.
_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}


class SnapshotRepo(RemoteMixin):
    """A non-bare work tree holding the snapshots; created (``git init -b branch``) if missing.

    The branch must be the checked-out one (HEAD). Methods are thread-safe: commits are
    serialized by a lock; pushes and reads run concurrently with them (git's own ref locking
    keeps a concurrent push consistent); :meth:`maintenance` excludes both.

    Example::

        repo = SnapshotRepo(tmp / "repo")
        repo.head_file("ledger/run1.ledger") is None
        # -> True
    """

    def __init__(self, path: str | os.PathLike, *, branch: str = "main",
                 author_name: str = "snapops", author_email: str = "snapops@localhost") -> None:
        self.path = Path(path).absolute()
        self.branch = branch
        self._lock = threading.Lock()           # commits (and maintenance)
        self._pushes = 0                        # pushes running
        self._maintaining = False
        self._activity = threading.Condition()  # guards the two fields above
        self._objects = ObjectReader(self.path)
        self._check_ref(f"refs/heads/{branch}", "branch")
        self.git_dir = self._open_or_init()
        self._set_identity(author_name, author_email)
        self._check_head()

    # -- setup -----------------------------------------------------------------------------

    def _open_or_init(self) -> Path:
        """The repository's git folder, after creating the repository if there is none."""
        # Only the folder itself may be the repository, never one of its parents.
        ceiling = {"GIT_CEILING_DIRECTORIES": str(self.path.parent)}
        if self.path.is_dir():
            found = self._run("rev-parse", "--is-bare-repository", "--absolute-git-dir",
                              check=False, env=ceiling)
            if found is not None:
                return self._opened(*found.splitlines()[:2])
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise GitError(f"{self.path}: cannot create the snapshot repository: "
                           f"{err.strerror or err}") from err
        self._run("init", "-q", "-b", self.branch, what="init (create the snapshot repository)")
        return self.path / ".git"

    def _opened(self, bare: str, git_dir: str) -> Path:
        if bare == "true":
            raise GitError(f"{self.path}: is a bare repository; the snapshot repository "
                           "needs a work tree")
        top = self._run("rev-parse", "--show-toplevel", what="rev-parse")
        if Path(top).resolve() != self.path.resolve():
            raise GitError(f"{self.path}: not the top of a work tree (top is {top})")
        return Path(git_dir)

    def _set_identity(self, name: str, email: str) -> None:
        wanted = {"user.name": name, "user.email": email, "core.autocrlf": "false"}
        listing = self._run("config", "--local", "--list", "-z", check=False) or ""
        current = dict(item.split("\n", 1) for item in listing.split("\0") if "\n" in item)
        for key, value in wanted.items():
            if current.get(key) != value:
                self._run("config", "--local", key, value, what=f"set {key}")

    def _check_head(self) -> None:
        head = self._run("symbolic-ref", "-q", "HEAD", check=False)
        want = f"refs/heads/{self.branch}"
        if head == want:
            return
        if self._rev(want) is None and self._rev("HEAD") is None:
            # A fresh repository created with another default branch: just point HEAD at ours.
            self._run("symbolic-ref", "HEAD", want, what="set HEAD")
            return
        raise GitError(f"{self.path}: HEAD is {head or 'detached'}, expected {want}; "
                       f"check out {self.branch!r} or configure repo.branch")

    def close(self) -> None:
        """End gitpython's persistent cat-file processes."""
        self._objects.close()

    def __enter__(self) -> "SnapshotRepo":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level ---------------------------------------------------------------------------

    def _result(self, *args: str, what: str | None = None, check: bool = True,
                data: bytes | None = None, env: dict | None = None, cwd=None,
                error: type[GitError] = GitError, context: str | None = None,
                **limits) -> GitResult:
        """Run ``git args`` in the work tree (or ``cwd``); raise ``error`` on failure."""
        return run_git(args, cwd=self.path if cwd is None else cwd, input=data, env=env,
                       check=check, error=error, what=what or args[0],
                       where=context or str(self.path), **limits)

    def _run(self, *args: str, check: bool = True, raw: bool = False, **options):
        """stdout of ``git args`` as str without the final newline (bytes if ``raw``);
        ``check=False``: None instead of an error when git fails."""
        result = self._result(*args, check=check, **options)
        if not result.ok:
            return None
        return result.stdout if raw else result.text

    def _rev(self, spec: str) -> str | None:
        """The object a revision names, or None if it does not exist."""
        out = self._run("rev-parse", "-q", "--verify", "--end-of-options", spec, check=False)
        return out or None

    def _check_ref(self, ref: str, kind: str) -> None:
        if self._run("check-ref-format", ref, check=False, cwd=self.path.anchor) is None:
            raise GitError(f"{self.path}: invalid {kind} name {ref!r}")

    def _check_path(self, rel: str) -> str:
        """A safe relative POSIX path inside the work tree, or GitError."""
        if not isinstance(rel, str) or not rel or "\0" in rel:
            raise GitError(f"{self.path}: invalid path {rel!r}")
        pure = PurePosixPath(rel)
        if pure.is_absolute() or rel.startswith("/"):
            raise GitError(f"{self.path}: refusing absolute path {rel!r}")
        parts = pure.parts
        if not parts or ".." in parts:
            raise GitError(f"{self.path}: refusing path {rel!r} (escapes the work tree)")
        if any(p.lower() == ".git" for p in parts):
            raise GitError(f"{self.path}: refusing path {rel!r} (inside .git)")
        # A symlinked folder could still lead outside: check where the parent really is.
        root = self.path.resolve()
        parent = (root / pure).parent.resolve()
        if parent != root and root not in parent.parents:
            raise GitError(f"{self.path}: refusing path {rel!r} (leads outside the work tree "
                           "through a symbolic link)")
        return str(pure)

    # -- reads -------------------------------------------------------------------------------

    def _commit_of(self, ref: str) -> git.Commit | None:
        return self._objects.read(f"read {ref}",
                                  lambda repo: self._objects.lookup(repo, f"{ref}^{{commit}}"))

    def head_commit(self) -> str | None:
        """The commit at the tip of the branch, or None before the first commit."""
        commit = self._commit_of(f"refs/heads/{self.branch}")
        return commit.hexsha if commit is not None else None

    def head_file(self, relpath: str) -> bytes | None:
        """Content of ``relpath`` at the branch tip (None before the first commit or if absent).

        Example::

            repo.head_file("snapshots/run1/MANIFEST")[:18]   # b'SNAPOPS-MANIFEST 2'
        """
        rel = self._check_path(relpath)

        def read(repo: git.Repo) -> bytes | None:
            commit = self._objects.lookup(repo, f"refs/heads/{self.branch}^{{commit}}")
            if commit is None:
                return None
            try:
                blob = commit.tree / rel
            except KeyError:
                return None
            return blob.data_stream.read() if blob.type == "blob" else None

        return self._objects.read(f"read {rel}", read)

    def tag_object(self, tag: str) -> str | None:
        """The object ``refs/tags/<tag>`` names (the annotated tag itself), or None."""
        found = self._objects.read(f"read tag {tag}",
                           lambda repo: self._objects.lookup(repo, f"refs/tags/{tag}"))
        return found.hexsha if found is not None else None

    def tag_commit(self, tag: str) -> str | None:
        """The commit sha ``tag`` points at (through annotated tags), or None."""
        commit = self._commit_of(f"refs/tags/{tag}")
        return commit.hexsha if commit is not None else None

    def _tree_and_message(self, commit: str) -> tuple[str, str]:
        def read(repo: git.Repo) -> tuple[str, str]:
            found = repo.commit(commit)
            return found.tree.hexsha, found.message

        return self._objects.read(f"read commit {commit}", read)

    # -- commit ------------------------------------------------------------------------------

    def commit_generation(self, paths: Iterable[str], message: str, tag: str, *,
                          stored: Mapping[str, str] | None = None) -> str:
        """Commit exactly ``paths`` on the branch, tag it ``tag`` (annotated); return the sha.

        Paths are relative POSIX paths in the work tree; a path that no longer exists is
        committed as a removal. Nothing changed: an empty commit (each generation has its
        commit and tag). ``tag`` already present: its commit is returned, nothing is written.
        ``stored`` maps paths to the object ids of blobs already stored with exactly the
        work-tree file's bytes (:meth:`pack_shards`): staged by id, not hashed again.
        Any failure raises GitError and leaves branch and tags as they were.

        Example::

            repo.commit_generation(["snapshots/run1/s0.wtxt"], "run1 gen 1", "run1/gen-000001")
            # -> '3f1c...'
        """
        if isinstance(paths, str):
            raise GitError(f"{self.path}: paths must be a list of paths, not one string")
        rels = [self._check_path(p) for p in paths]
        if "\0" in message:
            raise GitError(f"{self.path}: commit message contains NUL")
        message = message.rstrip("\n") + "\n"
        self._check_ref(f"refs/tags/{tag}", "tag")
        with self._lock:
            done = self.tag_commit(tag)
            if done is not None:
                return done
            parent = self.head_commit()
            started = time.time()
            try:
                self._reset_index(parent)
                self._stage(rels, stored or {})
                return self._write_commit_and_tag(parent, message, tag)
            except GitError as err:
                if isinstance(err.__cause__, GitExit) and err.__cause__.killed:
                    # Our git died holding its lock files; left there, they would fail every
                    # later commit. Only locks created during this attempt are removed.
                    remove_locks(self._our_locks(tag), newer_than=started - 1.0)
                self._restore_index(parent)
                raise

    def pack_shards(self, paths: Iterable[str], dense: Iterable[str] = ()) -> ShardPack | None:
        """Before committing ``paths``: store the large work-tree files among them in a pack of
        the work repository (those that changed sparsely since the branch tip as git deltas of
        their versions there; ``dense`` ones, new ones and the rest whole), so that the commit
        stages them by id and a push reuses what the pack holds (see
        :mod:`snapops.daemon.shardpack`). Returns what was packed, or None (nothing
        qualified). GitError on failure: nothing is lost, the commit stores them whole.

        Example::

            repo.pack_shards(["snapshots/run1/shards/0000.wtxt"]).paths
            # -> ('snapshots/run1/shards/0000.wtxt',)
        """
        rels = [rel for rel in (self._check_path(p) for p in paths) if self._large(rel)]
        dense = set(dense)
        with self._lock:
            if not rels:
                return None
            tip = self.head_commit()
            listed = b"" if tip is None else self._run("ls-tree", "-r", "-z", "--full-tree",
                                                       tip, raw=True, what="ls-tree")
            attrs = self._run("check-attr", "-z", "--stdin", *CONVERSIONS, raw=True,
                              data=b"\0".join(r.encode() for r in rels) + b"\0",
                              what="check-attr")
            conversions = converted(attrs)
            plain = [rel for rel in rels if rel not in conversions]
            at_tip = tip_blobs(listed, plain)
            candidates = [Candidate(rel, at_tip.get(rel), rel in dense) for rel in plain]
            level = self._run("config", "--int", "pack.compression", check=False)

            def has_blob(oid: str) -> bool:
                return self._rev(f"{oid}^{{blob}}") is not None

            try:
                packed = write_shard_pack(self.git_dir, self.path, candidates,
                                          cat_blob=self._cat_blob, has_object=has_blob,
                                          blob_sizes=self._blob_sizes,
                                          level=int(level) if level else -1)
            except OSError as err:
                raise GitError(f"{self.path}: cannot write a shard pack: {err}") from err
            if packed is not None and packed.deltas:  # the bases' loose copies, if any
                self._run("prune-packed", "-q", what="prune-packed")
            return packed

    def _blob_sizes(self, oids: list[str]) -> dict[str, int | None]:
        """Git's size of each blob (None: missing, or not a blob), from its pack header."""
        out = self._run("cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)",
                        data="".join(f"{oid}\n" for oid in oids).encode(),
                        what="cat-file --batch-check")
        sizes: dict[str, int | None] = dict.fromkeys(oids)
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] in sizes and parts[1] == "blob":
                sizes[parts[0]] = int(parts[2])
        return sizes

    def _large(self, rel: str) -> bool:
        """A work-tree file big enough for the daemon's pack (no git call for a small state)."""
        try:
            return os.lstat(self.path / rel).st_size >= MIN_SIZE
        except OSError:
            return False

    def _cat_blob(self, oid: str, out: BinaryIO) -> None:
        self._result("cat-file", "blob", oid, stdout=out, what=f"cat-file blob {oid}")

    def _our_locks(self, tag: str) -> list[Path]:
        gitdir = self.git_dir
        return [gitdir / "index.lock", gitdir / "HEAD.lock", gitdir / "packed-refs.lock",
                gitdir / "refs" / "heads" / f"{self.branch}.lock",
                gitdir / "refs" / "tags" / f"{tag}.lock"]

    def clear_stale_locks(self, min_age: float = 60.0) -> list[str]:
        """Remove git lock files (index, HEAD, packed-refs, refs) older than ``min_age`` s.

        For daemon start-up after a crash: a git process killed mid-write leaves its ``*.lock``
        behind and git then refuses every later write. Only safe while no other git process
        writes to this repository (the daemon owns it). Returns the removed paths.

        Example::

            repo.clear_stale_locks(min_age=0)
            # -> ['/srv/snap/.git/index.lock']
        """
        with self._lock:
            return remove_locks(lock_candidates(self.git_dir),
                                older_than=time.time() - min_age)

    def clear_dead_locks(self, min_age: float = 1.0) -> tuple[list[str], list[str]]:
        """While the daemon runs, before it retries a failed commit: remove the lock files
        (those of :meth:`clear_stale_locks`) that a git child of this process left when it
        died mid-command; returns (removed paths, why others were kept).

        The start-up sweep's rules, made safe beside live processes: no commit or cleanup of
        this process runs meanwhile (its commit lock is held; every git of this process that
        writes these locks runs under it or on the caller's thread), a lock is removed only if
        it is older than ``min_age`` s and no process has it open, and none at all while a git
        process that is not this process's own (a user's, an orphan of a killed git) works in
        the repository: that one may hold them. Linux only (``/proc``).

        Example::

            repo.clear_dead_locks()
            # -> (['/srv/snap/.git/index.lock'], [])
        """
        with self._lock:
            return remove_dead_locks(self.path, self.git_dir, min_age)

    def _reset_index(self, parent: str | None) -> None:
        if parent is None:
            self._run("read-tree", "--empty", what="read-tree (reset index)")
        elif self._run("read-tree", "-m", parent, check=False) is None:
            # "-m" keeps stat info but refuses an index with conflicts; start over then.
            self._run("read-tree", parent, what="read-tree (reset index)")

    def _restore_index(self, parent: str | None) -> None:
        try:
            self._reset_index(parent)
        except GitError:
            pass  # the next commit resets the index first anyway

    def _stage(self, rels: list[str], stored: Mapping[str, str]) -> None:
        present = [r for r in rels if os.path.lexists(self.path / r)]
        missing = [r for r in rels if r not in present]
        stored = {**self._hash_as_is([r for r in present if r not in stored]), **stored}
        known = [r for r in present if r in stored]
        present = [r for r in present if r not in stored]
        if known:
            self._run("update-index", "--add", "-z", "--index-info", what="update-index",
                      data=b"".join(f"100644 {stored[r]}\t{r}\0".encode() for r in known))
        if present:
            self._run("add", "-A", "-f", "--pathspec-from-file=-", "--pathspec-file-nul",
                      data=b"\0".join(r.encode() for r in present), env=_LITERAL,
                      what="add")
        if missing:
            self._run("rm", "-r", "-q", "--cached", "--ignore-unmatch",
                      "--pathspec-from-file=-", "--pathspec-file-nul",
                      data=b"\0".join(r.encode() for r in missing), env=_LITERAL,
                      what="rm --cached")

    def _hash_as_is(self, rels: list[str]) -> dict[str, str]:
        """Blob ids of the plain files among ``rels``, stored byte for byte: the work tree's
        ``.gitattributes`` follows the branch, and its filters, ``working-tree-encoding`` or
        ``eol`` would otherwise change (or refuse) the sealed MANIFEST and ledger on
        ``git add``. Anything else (a symlink, an executable) is left to ``git add``."""
        plain = [r for r in rels if "\n" not in r and _plain_file(self.path / r)]
        if not plain:
            return {}
        ids = self._run("hash-object", "-w", "--no-filters", "--stdin-paths",
                        data="".join(f"{r}\n" for r in plain).encode(), what="hash-object")
        return dict(zip(plain, ids.split()))

    def _write_commit_and_tag(self, parent: str | None, message: str, tag: str) -> str:
        tree = self._run("write-tree", what="write-tree")
        if parent is not None and self._tree_and_message(parent) == (tree, message):
            commit = parent  # a crash after the branch moved but before the tag was created
        else:
            args = ["commit-tree", "--no-gpg-sign", tree, "-F", "-"]
            if parent is not None:
                args[2:2] = ["-p", parent]
            commit = self._run(*args, data=message.encode(), what="commit-tree")
        ident = self._run("var", "GIT_COMMITTER_IDENT", what="var")
        tag_text = (f"object {commit}\ntype commit\ntag {tag}\ntagger {ident}\n\n{message}")
        tag_obj = self._run("hash-object", "-t", "tag", "-w", "--stdin",
                            data=tag_text.encode(), what="hash-object (tag)")
        zero = "0" * len(commit)
        lines = [f"create refs/tags/{tag} {tag_obj}"]
        if commit != parent:
            lines.insert(0, f"update refs/heads/{self.branch} {commit} {parent or zero}")
        self._run("update-ref", "-m", f"snapops: {tag}", "--stdin",
                  data=("\n".join(lines) + "\n").encode(), what="update-ref")
        return commit

    # -- maintenance -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[bool]:
        """Yield True with no commit and no push running (none can start until the block
        ends), or False at once when one is running: maintenance never waits for a push."""
        if not self._lock.acquire(blocking=False):
            yield False
            return
        try:
            with self._activity:
                self._maintaining = not self._pushes
            if not self._maintaining:
                yield False
                return
            try:
                yield True
            finally:
                with self._activity:
                    self._maintaining = False
                    self._activity.notify_all()
        finally:
            self._lock.release()

    def forget_history(self, keep_from: str, drop_tags: Iterable[str]) -> dict | None:
        """Keep the local history from commit ``keep_from`` on and delete what only older
        commits and ``drop_tags`` used: the work repository stays bounded.

        ``keep_from`` becomes a shallow boundary (``.git/shallow``: git treats its parents as
        absent), the tags are deleted, reflogs expired and unreachable objects pruned (packs,
        if any, rewritten without them). Only for history every remote already has: a shallow
        repository pushes to a remote holding the older commits, not to an empty one. Returns
        None (doing nothing) while a commit or push runs; else the sizes before and after.

        Example::

            repo.forget_history(repo.tag_commit("run1/gen-000040"), ["run1/gen-000039"])
            # -> {'before': 1503238553, 'after': 187904819}
        """
        with self._exclusive() as free:
            if not free:
                return None
            if not self.is_ours(keep_from):
                raise GitError(f"{self.path}: {keep_from} is not on {self.branch}; "
                               "history not cut")
            before = object_bytes(self._run)
            listed = self._run("for-each-ref", "--format=%(refname)", "refs/tags/")
            present = set(listed.splitlines())
            doomed = [ref for ref in (f"refs/tags/{t}" for t in drop_tags) if ref in present]
            if not doomed and keep_from in shallow(self.git_dir):
                return {"before": before, "after": before}  # cut here already
            if doomed:
                self._run("update-ref", "--stdin", what="update-ref (drop old tags)",
                          data="".join(f"delete {ref}\n" for ref in doomed).encode())
            add_shallow(self.git_dir, keep_from)
            self._run("reflog", "expire", "--expire=now", "--all", what="reflog expire")
            self._run("prune", "--expire=now", what="prune")
            if object_counts(self._run).get("packs", "0") != "0":
                repack_dropping(self.git_dir, self._run)
            return {"before": before, "after": object_bytes(self._run)}


def _plain_file(path: Path) -> bool:
    """A regular, non-executable file (what ``git add`` stores as mode 100644)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and not info.st_mode & 0o111
