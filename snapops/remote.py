"""Find a generation in a repository or at a URL and read it from the commit's tree.

A local repository (work tree or bare) is read in place, and so is a repository that a
``file://`` URL names on this machine (bare, or a work tree's top or ``.git`` folder). From any
other URL (``file://``, ``git://``, ``http(s)://``, ``ssh://``, ``user@host:path``) only what
one generation needs is fetched: a shallow fetch (depth 1) of its tag, branch or commit into a
private temporary bare repository, removed afterwards; never a clone of the history. A run in
the LFS store needs two more things, each fetched the same way (depth 1, one ref) and only when
asked: the MANIFESTs of the older generations its residual chains start from (their tags,
:meth:`Repository.manifests`) and the retention record on the default branch
(:meth:`Repository.retention`). Every name is untrusted: run names and gens are checked before
any git call, a revision starting with ``-`` is refused (and git is told where options end), a
revision fetched from a URL must be a ref name or a full object id, and URLs are redacted in
every message.

Example::

    with open_repository("git://127.0.0.1:9418/snapshots.git") as repo:
        repo.generations("run1")                  # newest first, from the remote's tags
        # -> [3, 2, 1]
        with repo.tree("run1", gen=3) as (source, where):
            where                                 # -> 'tag run1/gen-000003 (commit 5e1c0a9b7d2f)'
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from snapops.daemon.redact import redact_url
from snapops.formats.errors import ConfigError, GitError
from snapops.formats.generation import gen_text, valid_run
from snapops.formats.generation.manifest import parse_gen_text
from snapops.formats.generation.source import GitTreeSource
from snapops.formats.gitcmd import ref_lines, run_git
from snapops.formats.gitwatch import DiskLow, fetch_floor
from snapops.formats.iosafe import PATH_MAX, shown, user_path
from snapops.formats.lfs.access import read_record
from snapops.formats.lfs.retention import RetentionRecord
from snapops.formats.lfs.source import tag_manifests
from snapops.hooks.gitio import Git

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SCP = re.compile(r"[A-Za-z0-9_.-]+@[A-Za-z0-9_.-]+:")    # user@host:path (ssh)
_HEX_OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_GEN_REF = re.compile(r"refs/tags/(?P<run>[^\s]+)/gen-(?P<gen>\S+)")
FETCHED = "refs/snapops/restore"
HEAD_FETCHED = "refs/snapops/head"
SCHEMES = ("file", "git", "http", "https", "ssh", "git+ssh", "ssh+git")
# Keep the received pack as it is (no loose copy of every blob, recompressed) and stream big
# blobs instead of holding them in memory.
FETCH_CONFIG = ("-c", "fetch.unpackLimit=1", "-c", "core.bigFileThreshold=1")
# A local remote's upload-pack runs here: no delta search among shards and no deflate of
# bytes that do not compress (a 128 MiB generation: 83 s -> 3.5 s on a loaded 2-core VM).
LOCAL_UPLOAD_PACK = "git -c pack.window=0 -c pack.compression=0 upload-pack"
# A remote that accepts the connection and then sends nothing (or stops mid-pack) would hold
# ls-remote or fetch forever: git has no such limit for git:// or ssh://, nor by default for
# http(s)://. Seconds without a byte moved by git or its helpers, as the daemon's ls-remote.
STALL_SECONDS = 60.0


class NotACommit(ConfigError):
    """A tag, branch or revision that exists but names no commit (a tree, a blob): that
    generation's fault, so ``latest_verified`` skips it instead of giving up."""


def gen_tag(run: str, gen: int) -> str:
    """``run1/gen-000042``: the tag the daemon gives generation ``gen`` of ``run``."""
    return f"{run}/gen-{gen_text(gen)}"


def check_run(run: str) -> str:
    if not isinstance(run, str) or not valid_run(run):
        raise ConfigError(f"run {str(run)[:80]!r}: not a run name ([A-Za-z0-9][A-Za-z0-9_.-]*, "
                          "no '..', at most 128 characters)")
    return run


def check_gen(gen) -> int:
    if isinstance(gen, bool) or not isinstance(gen, int) or not 0 <= gen < 10 ** 20:
        raise ConfigError(f"gen {str(gen)[:40]!r}: expected a generation number (0 or more)")
    return gen


def check_rev(rev: str) -> str:
    if not isinstance(rev, str) or not rev or rev.startswith("-") or len(rev) > 1024 \
            or any(c in rev for c in "\0\n\r") or not rev.isprintable():
        raise ConfigError(f"rev {str(rev)[:80]!r}: expected a commit-ish (a tag, a branch, a "
                          "commit id), not an option or control characters")
    return rev


def is_url(text: str) -> bool:
    """A remote to fetch from (a scheme, or scp-like ``user@host:path``), not a local path."""
    return bool(_SCHEME.match(text)) or (bool(_SCP.match(text)) and not os.path.exists(text))


@contextlib.contextmanager
def open_repository(repo_or_url: str | os.PathLike) -> Iterator[Repository]:
    """A local repository read in place, or a URL with a private temporary repository that
    receives shallow fetches (removed when the block ends)."""
    # a str is checked here (its message redacted: it may be a URL with a password); anything
    # else must be a path (None, bytes, a number: ConfigError naming the type)
    target = repo_or_url if isinstance(repo_or_url, str) else user_path(repo_or_url,
                                                                        "repository")
    if not target or target.startswith("-") or any(c in target for c in "\0\n\r") \
            or len(target) > PATH_MAX:
        raise ConfigError(f"{redact_url(target)[:200]!r}: expected a repository path or a URL")
    scheme = target.split("://", 1)[0].lower() if _SCHEME.match(target) else None
    if scheme is not None and scheme not in SCHEMES:
        raise ConfigError(f"{redact_url(target)[:200]}: unsupported URL scheme {scheme!r}; "
                          f"expected one of {', '.join(SCHEMES)}")
    local = local_repository(target) if scheme == "file" else None
    if local is not None:
        with _private_folder() as work:
            yield Repository(local, None, redact_url(target), work, origin=target)
        return
    if not is_url(target):
        if not os.path.isdir(target):
            raise ConfigError(f"{shown(target)}: not a repository (give a work tree, a bare "
                              "repository or a URL)")
        git = Git(target)
        if git.text("rev-parse", "--is-inside-work-tree", check=False) != "true" \
                and git.text("rev-parse", "--is-bare-repository", check=False) != "true":
            raise ConfigError(f"{shown(target)}: not a git repository")
        with _private_folder() as work:
            yield Repository(git, None, target, work)
        return
    with _private_folder() as work:
        run_git(["init", "-q", "--bare", "--template=", os.fspath(work / "fetch.git")],
                what="init")
        yield Repository(Git(work / "fetch.git"), target, redact_url(target), work)


def local_repository(url: str) -> Git | None:
    """The repository a ``file://`` URL names on this machine (empty host or ``localhost``;
    the path percent-decoded, as git decodes it), to be read in place like its path instead of
    fetched through upload-pack (which re-packs every object: 47 MB/s against ~1 GB/s in place
    for a 1 GiB generation): a bare repository, a work tree's top folder or its ``.git``
    folder (each of which git's own transport opens as that repository). None for anything else
    (another host, a folder inside a repository, no repository: git's transport then answers).
    Only committed objects are read, as a fetch would: never the work tree's files."""
    rest = url.split("://", 1)[1]
    host, slash, path = rest.partition("/")
    if host.lower() not in ("", "localhost") or not slash:
        return None
    path = os.fsdecode(urllib.parse.unquote_to_bytes("/" + path))
    if "\0" in path or len(path) > PATH_MAX or not os.path.isdir(path):
        return None
    git = Git(path)
    # a bare repository or a .git folder answers the first two lines (and refuses the third)
    answer = git.text("rev-parse", "--is-bare-repository", "--absolute-git-dir",
                      "--show-toplevel", check=False).split("\n")
    if answer[0] not in ("true", "false"):
        return None
    named = {os.path.realpath(p) for p in answer[1:3]}   # the git dir, and a work tree's top
    return git if os.path.realpath(path) in named else None


@contextlib.contextmanager
def _private_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="snapops-restore-"))  # mode 0700
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Repository:
    """Where generations come from: ``git`` reads objects (the repository itself, or the
    private repository that fetches from ``url``)."""

    def __init__(self, git: Git, url: str | None, shown: str, work: Path, *,
                 origin: str | None = None) -> None:
        self.git, self.url, self.shown, self.work = git, url, shown, work
        self.origin = origin     # a file:// URL read in place: still the remote's URL
        self._redact = {url: shown} if url else {}
        self._records: dict[str, RetentionRecord | None] = {}
        self._lock = threading.Lock()

    def remote_url(self) -> str | None:
        """The URL generations come from: the one given, or a local repository's origin."""
        given = self.url or self.origin
        if given is not None:
            return given
        return self.git.text("config", "--get", "remote.origin.url", check=False) or None

    def manifests(self, run: str) -> Callable[[int], bytes | None]:
        """The MANIFEST of generation ``gen`` of ``run`` (a residual's base) from its tag, or
        None: read in place, or from a URL with that tag alone fetched first (depth 1)."""
        read = tag_manifests(self.git, run)
        if self.url is None:
            return read

        def fetched(gen: int) -> bytes | None:
            with self._lock:    # shards are verified on worker threads: one fetch at a time
                data = read(gen)
                if data is None:
                    ref = f"refs/tags/{gen_tag(run, check_gen(gen))}"
                    if self._fetch(ref, ref, f"tag {gen_tag(run, gen)}", check=False):
                        data = read(gen)
                return data
        return fetched

    def retention(self, run: str) -> RetentionRecord | None:
        """The run's retention record (LFS store): a work tree's file, else the default
        branch's (from a URL: its commit fetched, depth 1); None when there is none."""
        if run not in self._records:
            if self.url is None:
                self._records[run] = read_record(self.git, self.git.toplevel(), run)
            else:
                found = self._fetch("HEAD", HEAD_FETCHED, "HEAD", check=False)
                self._records[run] = read_record(self.git, None, run, HEAD_FETCHED) \
                    if found else None
        return self._records[run]

    def generations(self, run: str) -> list[int]:
        """The gens of ``run``'s generation tags, newest first."""
        check_run(run)
        pattern = f"refs/tags/{run}/gen-*"
        if self.url is None:
            refs = ref_lines(self.git.run("for-each-ref", "--format=%(refname)", pattern))
        else:
            try:
                out = self._git("ls-remote", "--tags", "--refs", "--end-of-options", self.url,
                                pattern, what="ls-remote").stdout
            except GitError as exc:
                raise ConfigError(f"{self.shown}: cannot list the tags of run {run}: "
                                  f"{exc}") from None
            refs = [line.split("\t", 1)[-1] for line in ref_lines(out)]
        gens = set()
        for ref in refs:
            m = _GEN_REF.fullmatch(ref)
            gen = parse_gen_text(m["gen"]) if m and m["run"] == run else None
            if gen is not None:
                gens.add(gen)
        return sorted(gens, reverse=True)

    @contextlib.contextmanager
    def tree(self, run: str, *, gen: int | None = None, rev: str | None = None,
             max_blob: int | None = None) -> Iterator[tuple[GitTreeSource, str]]:
        """The commit of generation ``gen`` (its tag), of ``rev``, or of HEAD (the default
        branch), as a source whose blobs are copied once into a private scratch folder; and a
        label saying which commit it is."""
        check_run(run)
        if gen is not None and rev is not None:
            raise ConfigError("give a gen or a rev, not both")
        if gen is not None:
            what, spec = f"tag {gen_tag(run, check_gen(gen))}", f"refs/tags/{gen_tag(run, gen)}"
        elif rev is not None:
            what, spec = f"rev {check_rev(rev)}", rev
        else:
            what, spec = "HEAD", "HEAD"
        commit = self._commit(spec, what)
        scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=self.work))
        try:
            extra = {} if max_blob is None else {"max_blob": max_blob}
            label = f"{what} (commit {commit[:12]}) of {self.shown}"
            yield GitTreeSource(self.git, commit, scratch, label=label, keep=True, **extra), \
                label
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _commit(self, spec: str, what: str) -> str:
        if self.url is None:
            commit = self.git.resolve(f"{spec}^{{commit}}")
            if commit is None:
                raise NotACommit(f"{self.shown}: no {what} there (or it names no commit)")
            return commit
        if spec != "HEAD" and not _HEX_OID.fullmatch(spec):
            ok = run_git(["check-ref-format", "--allow-onelevel", spec], check=False).ok
            if not ok or spec.startswith("+"):
                raise ConfigError(f"{what}: a revision fetched from a URL must be a ref name "
                                  "(tag or branch) or a full commit id")
        self._fetch(spec, FETCHED, what)
        commit = self.git.resolve(f"{FETCHED}^{{commit}}")
        if commit is None:
            raise NotACommit(f"{self.shown}: {what} does not name a commit")
        return commit

    def _fetch(self, spec: str, ref: str, what: str, *, check: bool = True) -> bool:
        """``spec`` of the URL into the local ``ref``, depth 1; False (``check`` off) or
        ConfigError when it cannot be fetched."""
        local = [f"--upload-pack={LOCAL_UPLOAD_PACK}"] if self.url.startswith("file://") else []
        try:
            self._git(*FETCH_CONFIG, "fetch", "-q", "--depth=1", "--no-tags",
                      "--no-write-fetch-head", *local, "--end-of-options", self.url,
                      f"+{spec}:{ref}", what="fetch", keep_free=fetch_floor(self.git.cwd))
        except GitError as exc:
            if not check and not isinstance(exc, DiskLow):   # DiskLow: not "not there"
                return False
            raise ConfigError(f"{self.shown}: cannot fetch {what}: {exc}") from None
        return True

    def _git(self, *args: str, what: str, keep_free: tuple[str, int] | None = None):
        # http(s) also gives up on its own below 1 byte/s for that long
        low_speed = ("-c", "http.lowSpeedLimit=1",
                     "-c", f"http.lowSpeedTime={max(1, round(STALL_SECONDS))}")
        try:
            return run_git((*low_speed, *args), cwd=self.git.cwd, what=what,
                           stall=STALL_SECONDS, redact=self._redact, keep_free=keep_free)
        except GitError as exc:   # git spells the URL its own way too (a trailing slash...)
            raise type(exc)(redact_url(str(exc))) from None
