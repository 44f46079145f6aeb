"""The remote side of the snapshot repository: push generations, read a remote's refs.

:class:`RemoteMixin` gives :class:`snapops.daemon.gitops.SnapshotRepo` its remote methods
(``push``, ``remote_refs``, ``remote_tags``, ``remote_unborn_head``, ``is_ours``,
``generation_bytes``); every URL a git command names is shown redacted in its errors.

A push sends chosen generations only: the branch goes to the newest of them (not to the tip),
with their tags, in one ``--atomic`` push, so a backlog is sent oldest first in pieces that each
complete. Its time limit is a stall limit (no progress output for that long), not a wall clock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from snapops.formats.errors import PushError

from .redact import redact_url

__all__ = ["RemoteMixin", "RemoteRefs", "resolve_url"]

PROBE_PREFIX = "snapops-head-"
PROBE_STALE_SECONDS = 3600    # a probe lives for one clone (stall timeout 60 s)
# HTTP(S) remotes also abort on their own below 1 byte/s for the stall time.
_LOW_SPEED = ("-c", "http.lowSpeedLimit=1", "-c", "http.lowSpeedTime={stall}")


def resolve_url(url: str) -> str:
    """A relative local path made absolute (git would resolve it against the work tree)."""
    if "://" in url or os.path.isabs(url):
        return url
    head = url.split("/", 1)[0]
    if ":" in head:  # scp-like "host:path" means ssh to git
        return url
    return os.path.abspath(url)


@dataclass(frozen=True)
class RemoteRefs:
    """What ``git ls-remote --symref`` says about a remote: where its HEAD points (a ref name,
    or None when HEAD does not resolve), its branches and its tags (name -> object id)."""

    head: str | None = None
    heads: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


class RemoteMixin:
    """The remote methods of :class:`snapops.daemon.gitops.SnapshotRepo`, which provides what
    they use: ``_result``, ``_run``, ``head_commit``, ``tag_commit``, ``path``, ``branch``,
    ``git_dir`` and the push bookkeeping (``_activity``, ``_pushes``, ``_maintaining``)."""

    # -- remotes -----------------------------------------------------------------------------

    def push(self, remote_url: str, refs: Iterable[str], *, branch_commit: str | None = None,
             also_branches: Iterable[str] = (), stall: float | None = None,
             timeout: float | None = None, on_line: Callable[[str], None] | None = None,
             cancel: threading.Event | None = None) -> None:
        """Push the tags ``refs`` (names or ``refs/tags/...``) and the branch to ``remote_url``.

        The branch goes to ``branch_commit`` (default: the tip), and so does every branch in
        ``also_branches`` (full ref names). One ``--atomic`` push: every ref or none. Never
        forces. ``stall``: seconds without progress output before git and its helpers are
        killed (HTTP remotes also get ``http.lowSpeedTime``); ``timeout``: a wall-clock limit
        (None: none); ``on_line`` receives git's progress lines; ``cancel`` set aborts it. A
        rejected ref, an unreachable remote, a stall, a timeout or a cancel raise PushError
        naming the remote.

        Example::

            repo.push("git://127.0.0.1:9418/remote.git", ["run1/gen-000001"], stall=60)
        """
        commit = branch_commit if branch_commit is not None else self.head_commit()
        specs = []
        if commit is not None:
            specs += [f"{commit}:{ref}" for ref in
                      dict.fromkeys([f"refs/heads/{self.branch}", *also_branches])]
        for ref in refs:
            full = ref if ref.startswith("refs/") else f"refs/tags/{ref}"
            specs.append(f"{full}:{full}")
        if not specs:
            return
        config = [part.format(stall=max(1, round(stall))) for part in _LOW_SPEED] if stall else []
        with self._pushing():
            self._result(*config, "push", "--porcelain", "--progress", "--atomic",
                         resolve_url(remote_url), *specs, what=f"push ({len(specs)} refs)",
                         stall=stall, timeout=timeout, on_line=on_line, cancel=cancel,
                         **self._remote_error("push to", remote_url))

    def _remote_error(self, action: str, remote_url: str) -> dict:
        """Error options for a command that names ``remote_url``: the message shows it
        redacted, and git's own output has it redacted too."""
        shown = redact_url(remote_url)
        return {"error": PushError, "context": f"{action} {shown}",
                "redact": {remote_url: shown, resolve_url(remote_url): shown}}

    def remote_refs(self, remote_url: str, *, stall: float | None = 60.0) -> RemoteRefs:
        """The remote's HEAD, branches and tags (``git ls-remote --symref``); PushError if it
        cannot be reached.

        Example::

            repo.remote_refs("/srv/remote.git").head
            # -> 'refs/heads/main'
        """
        out = self._run("ls-remote", "--symref", resolve_url(remote_url), stall=stall,
                        **self._remote_error("ls-remote", remote_url))
        refs = RemoteRefs()
        head = None
        for line in out.splitlines():
            oid, _, name = line.partition("\t")
            if oid.startswith("ref: ") and name == "HEAD":
                head = oid[len("ref: "):]
            elif name.startswith("refs/heads/"):
                refs.heads[name] = oid
            elif name.startswith("refs/tags/") and not name.endswith("^{}"):
                refs.tags[name[len("refs/tags/"):]] = oid
        return RemoteRefs(head if head in refs.heads else None, refs.heads, refs.tags)

    def remote_tags(self, remote_url: str, *, stall: float | None = 60.0) -> set[str]:
        """Names of the tags present on ``remote_url``."""
        return set(self.remote_refs(remote_url, stall=stall).tags)

    def remote_unborn_head(self, remote_url: str, *, stall: float | None = 60.0) -> str | None:
        """The branch a remote's HEAD names when that branch does not exist there (a bare
        repository made with ``-b master`` that only ever received ``main``), else None.

        ``ls-remote`` does not print an unborn HEAD; ``clone`` learns it and names its own
        HEAD after it. Cloning only the unborn branch transfers no object.
        """
        # Inside our own git folder: a daemon killed mid-probe leaves nothing in $TMPDIR,
        # and the next probe sweeps what it left.
        _sweep_probes(self.git_dir)
        with tempfile.TemporaryDirectory(prefix=PROBE_PREFIX, dir=self.git_dir) as tmp:
            probe = Path(tmp) / "probe.git"
            cloned = self._result("clone", "-q", "--bare", "--no-local", "--single-branch",
                                  "--depth", "1", "--no-tags", resolve_url(remote_url),
                                  str(probe), check=False, stall=stall,
                                  **self._remote_error("probe HEAD of", remote_url))
            if not cloned.ok:
                return None
            head = self._run("symbolic-ref", "-q", "HEAD", check=False, cwd=probe)
        return head if head and head.startswith("refs/heads/") else None

    def is_ours(self, commit: str) -> bool:
        """Whether ``commit`` is on our branch (a remote branch there holds only our work)."""
        return self._run("merge-base", "--is-ancestor", commit, f"refs/heads/{self.branch}",
                         check=False) is not None

    def generation_bytes(self, tag: str) -> int | None:
        """Bytes a push of ``tag`` sends when the remote has its parent: the size on disk
        of the objects its commit adds (``rev-list --disk-usage``); None without the tag."""
        commit = self.tag_commit(tag)
        if commit is None:
            return None
        out = self._run("rev-list", "--objects", "--disk-usage", f"{commit}^!", check=False)
        return int(out) if out and out.isdigit() else None

    @contextlib.contextmanager
    def _pushing(self) -> Iterator[None]:
        with self._activity:
            self._activity.wait_for(lambda: not self._maintaining)
            self._pushes += 1
        try:
            yield
        finally:
            with self._activity:
                self._pushes -= 1
                self._activity.notify_all()


def _sweep_probes(git_dir: Path) -> None:
    """Remove probe folders a killed daemon left in ``git_dir`` (older than an hour)."""
    cutoff = time.time() - PROBE_STALE_SECONDS
    for stale in git_dir.glob(PROBE_PREFIX + "*"):
        with contextlib.suppress(OSError):
            if stale.lstat().st_mtime < cutoff and stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)

