"""The snapshot repository: commit a generation atomically, tag it, push it to remotes.

Every operation runs the real ``git`` through gitpython's command wrapper (``Repo.git``); the
pure-Python index and object writers of gitpython are not used, so what lands in the repository
is exactly what ``git`` itself would write.

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

Example::

    repo = SnapshotRepo("snapshot-repo", branch="main")
    sha = repo.commit_generation(["snapshots/run1/MANIFEST"], "gen 1", "run1/gen-000001")
    repo.push("/srv/remote.git", ["run1/gen-000001"], timeout=60)
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Iterable
from urllib.parse import urlsplit, urlunsplit

import git

from snapops.formats.errors import GitError, PushError

__all__ = ["SnapshotRepo", "redact_url", "resolve_url"]

# Environment for every git call: never wait for a password on a terminal, take paths literally.
_ENV = {"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never"}
_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}
_SUMMARY_LINES = 4
_SUMMARY_CHARS = 600


def redact_url(url: str) -> str:
    """``url`` with any password (``https://user:token@host``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def resolve_url(url: str) -> str:
    """A relative local path made absolute (git would resolve it against the work tree)."""
    if "://" in url or os.path.isabs(url):
        return url
    head = url.split("/", 1)[0]
    if ":" in head:  # scp-like "host:path" means ssh to git
        return url
    return os.path.abspath(url)


def _killed(err: BaseException | None) -> bool:
    """Whether a git command ended by a signal (so it could not clean up its lock files)."""
    status = getattr(err, "status", None)
    return isinstance(err, git.GitCommandError) and isinstance(status, int) and status < 0


def _summary(err: BaseException) -> str:
    """The last few meaningful lines git printed (stderr, then stdout), on one line."""
    if isinstance(err, git.GitCommandError):
        texts = [err.stderr, err.stdout]
    else:
        texts = [str(err)]
    lines: list[str] = []
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        text = (text or "").strip()
        for prefix in ("stderr: ", "stdout: "):
            text = text.removeprefix(prefix)
        lines += [ln.strip(" '\t") for ln in text.splitlines() if ln.strip(" '\t")]
    if isinstance(err, git.GitCommandError) and isinstance(err.status, int) and err.status < 0:
        try:
            name = signal.Signals(-err.status).name
        except ValueError:
            name = f"signal {-err.status}"
        lines.append(f"git was killed by {name}")
    elif isinstance(err, git.GitCommandError) and not lines:
        lines = [f"exit status {err.status}"]
    if len(lines) > _SUMMARY_LINES:  # git's first line names the cause, the last ones the end
        lines = lines[:1] + ["..."] + lines[-(_SUMMARY_LINES - 1):]
    text = " | ".join(lines)
    return text if len(text) <= _SUMMARY_CHARS else "..." + text[-_SUMMARY_CHARS:]


class SnapshotRepo:
    """A non-bare work tree holding the snapshots; created (``git init -b branch``) if missing.

    The branch must be the checked-out one (HEAD). Methods are thread-safe: commits are
    serialized by a lock; pushes and reads run concurrently with them (git's own ref locking
    keeps a concurrent push consistent).

    Example::

        repo = SnapshotRepo(tmp / "repo")
        repo.head_file("ledger/run1.ledger") is None
        # -> True
    """

    def __init__(self, path: str | os.PathLike, *, branch: str = "main",
                 author_name: str = "snapops", author_email: str = "snapops@localhost") -> None:
        self.path = Path(path).absolute()
        self.branch = branch
        self._lock = threading.Lock()
        self._git = git.Git()  # for the name check, before a repository is there
        self._check_ref(f"refs/heads/{branch}", "branch")
        self._repo = self._open_or_init()
        self._git = self._repo.git
        self._set_identity(author_name, author_email)
        self._check_head()

    # -- setup -----------------------------------------------------------------------------

    def _open_or_init(self) -> git.Repo:
        try:
            repo = git.Repo(self.path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                return git.Repo.init(self.path, initial_branch=self.branch)
            except (OSError, git.GitCommandError) as err:
                raise GitError(f"{self.path}: cannot create the snapshot repository: "
                               f"{_summary(err)}") from err
        if repo.bare or repo.working_tree_dir is None:
            repo.close()
            raise GitError(f"{self.path}: is a bare repository; the snapshot repository "
                           "needs a work tree")
        if Path(repo.working_tree_dir).resolve() != self.path.resolve():
            repo.close()
            raise GitError(f"{self.path}: not the top of a work tree "
                           f"(top is {repo.working_tree_dir})")
        return repo

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
        """Release gitpython's cached helper processes (safe to call more than once)."""
        self._repo.close()

    def __enter__(self) -> "SnapshotRepo":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level ---------------------------------------------------------------------------

    def _run(self, *args: str, what: str | None = None, check: bool = True,
             data: bytes | None = None, raw: bool = False, env: dict | None = None,
             timeout: float | None = None, error: type[GitError] = GitError,
             context: str | None = None):
        """Run ``git args`` in the work tree; stdout as str (or bytes if ``raw``).

        ``check=False``: return None instead of raising on a non-zero exit.
        """
        stdin = None
        try:
            if data is not None:
                stdin = tempfile.TemporaryFile()
                stdin.write(data)
                stdin.seek(0)
            out = self._git.execute(
                ["git", *args], istream=stdin, env={**_ENV, **(env or {})},
                stdout_as_string=not raw, strip_newline_in_stdout=not raw,
                kill_after_timeout=timeout)
        except git.GitCommandError as err:
            if not check:
                return None
            where = context or str(self.path)
            raise error(f"{where}: git {what or args[0]} failed: {_summary(err)}") from err
        except OSError as err:
            raise error(f"{context or self.path}: git {what or args[0]} failed: {err}") from err
        finally:
            if stdin is not None:
                stdin.close()
        return out

    def _rev(self, spec: str) -> str | None:
        """The object a revision names, or None if it does not exist."""
        out = self._run("rev-parse", "-q", "--verify", "--end-of-options", spec, check=False)
        return out or None

    def _check_ref(self, ref: str, kind: str) -> None:
        if self._run("check-ref-format", ref, check=False) is None:
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

    def head_commit(self) -> str | None:
        """The commit at the tip of the branch, or None before the first commit."""
        return self._rev(f"refs/heads/{self.branch}^{{commit}}")

    def head_file(self, relpath: str) -> bytes | None:
        """Content of ``relpath`` at the branch tip (None before the first commit or if absent).

        Example::

            repo.head_file("snapshots/run1/MANIFEST")[:8]
            # -> b'MANIFEST'
        """
        rel = self._check_path(relpath)
        spec = f"refs/heads/{self.branch}:{rel}"
        if self._run("cat-file", "-e", spec, check=False) is None:
            return None
        return self._run("cat-file", "blob", spec, raw=True, what="cat-file")

    def tag_commit(self, tag: str) -> str | None:
        """The commit sha ``tag`` points at (through annotated tags), or None."""
        return self._rev(f"refs/tags/{tag}^{{commit}}")

    def _tree_and_message(self, commit: str) -> tuple[str, str]:
        body = self._run("cat-file", "commit", commit, raw=True, what="cat-file")
        header, _, message = body.partition(b"\n\n")
        tree = header.split(b"\n", 1)[0].removeprefix(b"tree ").decode("ascii", "replace")
        return tree, message.decode("utf-8", "replace")

    # -- commit ------------------------------------------------------------------------------

    def commit_generation(self, paths: Iterable[str], message: str, tag: str) -> str:
        """Commit exactly ``paths`` on the branch, tag it ``tag`` (annotated); return the sha.

        Paths are relative POSIX paths in the work tree; a path that no longer exists is
        committed as a removal. Nothing changed: an empty commit (each generation has its
        commit and tag). ``tag`` already present: its commit is returned, nothing is written.
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
                self._stage(rels)
                return self._write_commit_and_tag(parent, message, tag)
            except GitError as err:
                if _killed(err.__cause__):
                    # Our git died holding its lock files; left there, they would fail every
                    # later commit. Only locks created during this attempt are removed.
                    self._remove_locks(self._our_locks(tag), newer_than=started - 1.0)
                self._restore_index(parent)
                raise

    def _our_locks(self, tag: str) -> list[Path]:
        gitdir = Path(self._repo.git_dir)
        return [gitdir / "index.lock", gitdir / "HEAD.lock", gitdir / "packed-refs.lock",
                gitdir / "refs" / "heads" / f"{self.branch}.lock",
                gitdir / "refs" / "tags" / f"{tag}.lock"]

    @staticmethod
    def _remove_locks(paths: Iterable[Path], *, newer_than: float = float("-inf"),
                      older_than: float = float("inf")) -> list[str]:
        removed = []
        for lock in paths:
            try:
                mtime = lock.stat().st_mtime
                if newer_than <= mtime <= older_than:
                    lock.unlink()
                    removed.append(str(lock))
            except FileNotFoundError:
                continue
            except OSError as err:
                raise GitError(f"{lock}: cannot remove a stale git lock: {err}") from err
        return removed

    def clear_stale_locks(self, min_age: float = 60.0) -> list[str]:
        """Remove git lock files (index, HEAD, packed-refs, refs) older than ``min_age`` s.

        For daemon start-up after a crash: a git process killed mid-write leaves its ``*.lock``
        behind and git then refuses every later write. Only safe while no other git process
        writes to this repository (the daemon owns it). Returns the removed paths.

        Example::

            repo.clear_stale_locks(min_age=0)
            # -> ['/srv/snap/.git/index.lock']
        """
        gitdir = Path(self._repo.git_dir)
        candidates = [gitdir / "index.lock", gitdir / "HEAD.lock", gitdir / "packed-refs.lock",
                      *(gitdir / "refs").rglob("*.lock")]
        with self._lock:
            return self._remove_locks(candidates, older_than=time.time() - min_age)

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

    def _stage(self, rels: list[str]) -> None:
        present = [r for r in rels if os.path.lexists(self.path / r)]
        missing = [r for r in rels if r not in present]
        if present:
            self._run("add", "-A", "-f", "--pathspec-from-file=-", "--pathspec-file-nul",
                      data=b"\0".join(r.encode() for r in present), env=_LITERAL,
                      what="add")
        if missing:
            self._run("rm", "-r", "-q", "--cached", "--ignore-unmatch",
                      "--pathspec-from-file=-", "--pathspec-file-nul",
                      data=b"\0".join(r.encode() for r in missing), env=_LITERAL,
                      what="rm --cached")

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

    # -- remotes -----------------------------------------------------------------------------

    def push(self, remote_url: str, refs: Iterable[str], *, timeout: float) -> None:
        """Push the branch and the tags ``refs`` (names or ``refs/tags/...``) to ``remote_url``.

        Never forces; a rejected ref, an unreachable remote or ``timeout`` seconds elapsing
        (git and its helpers are killed) raise PushError naming the remote and git's message.

        Example::

            repo.push("git://127.0.0.1:9418/remote.git", ["run1/gen-000001"], timeout=30)
        """
        specs = []
        if self.head_commit() is not None:
            specs.append(f"refs/heads/{self.branch}:refs/heads/{self.branch}")
        for ref in refs:
            full = ref if ref.startswith("refs/") else f"refs/tags/{ref}"
            specs.append(f"{full}:{full}")
        if not specs:
            return
        shown = redact_url(remote_url)
        self._run("push", "--porcelain", resolve_url(remote_url), *specs, timeout=timeout,
                  error=PushError, context=f"push to {shown}", what=f"push ({len(specs)} refs)")

    def remote_tags(self, remote_url: str, *, timeout: float = 60.0) -> set[str]:
        """Names of the tags present on ``remote_url`` (``git ls-remote --tags``)."""
        out = self._run("ls-remote", "--tags", "--refs", resolve_url(remote_url), timeout=timeout,
                        error=PushError, context=f"ls-remote {redact_url(remote_url)}")
        tags = set()
        for line in out.splitlines():
            _, _, ref = line.partition("\t")
            if ref.startswith("refs/tags/"):
                tags.add(ref[len("refs/tags/"):])
        return tags
