"""What a reader of an LFS-store generation needs besides its tree: the LFS endpoint, the token,
the run's retention record. One rule for every reader (restore, verify --fetch-lfs, CI).

The endpoint is the one given (``--lfs-url``), else the ``url`` of the ``.lfsconfig`` at the top
of the generation's tree (the daemon commits it), else git-lfs's discovery from the remote URL
(``<remote>[.git]/info/lfs``, HTTP(S) remotes only). The token file holds one line (a bearer
token); the token goes into request headers only and no message shows it or the file's bytes.
Whoever pushed the tree wrote its ``.lfsconfig``: from a network remote, the token goes to an
endpoint named there only on that remote's host (``token_for``); elsewhere the user names it
with ``--lfs-url``.
Every URL in a message is redacted (``http://***@host/...``). The retention record
(``retention/<run>.retention``) is the work tree's file, else the one in the default branch's
commit (pruning commits it after the generations it names).

>>> lfsconfig_url(b"[lfs]\\n\\turl = https://lfs.example/o/r.git/info/lfs\\n")
'https://lfs.example/o/r.git/info/lfs'
>>> choose_endpoint(None, None, "https://git.example/o/r")
('https://git.example/o/r.git/info/lfs', 'derived from https://git.example/o/r')
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Callable

from snapops.daemon.redact import redact_url
from snapops.formats.errors import ConfigError, GitError, LfsError
from snapops.formats.generation.source import FolderSource
from snapops.formats.keys import read_key_file

from .client import LfsClient, lfs_url_for
from .retention import MAX_RECORD, RetentionRecord, parse_record, record_path

MAX_LFSCONFIG = 64 << 10
FROM_TREE = "the tree's .lfsconfig"
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([^:/]+):")
_URL_LINE = re.compile(r"(?m)^\s*url\s*=\s*(\S+)\s*$")


def lfsconfig_url(data: bytes) -> str | None:
    """The ``url = ...`` of an ``.lfsconfig``'s text, or None."""
    found = _URL_LINE.search(data[:MAX_LFSCONFIG].decode("utf-8", "replace"))
    return found[1] if found else None


def commit_file(git, rev: str, path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``path`` in commit ``rev`` of the repository
    behind ``git`` (a :class:`~snapops.hooks.gitio.Git`); None when absent."""
    try:
        commit = git.resolve(f"{rev}^{{commit}}")
        oid = git.commit(commit).blob(path) if commit else None
        return git.read_blob(oid, limit) if oid else None
    except GitError:
        return None


def read_record(git, worktree: str | os.PathLike | None, run: str,
                rev: str = "HEAD") -> RetentionRecord | None:
    """The retention record of ``run``: the file in ``worktree`` (when given and present), else
    commit ``rev``'s; None when neither holds one. FormatError for a malformed one, and for a
    work-tree file that is not a regular file (a symlink, a FIFO) or is over ``MAX_RECORD``."""
    path = record_path(run)
    # a checked-out tree: a symlink there (the file or its folder) may point anywhere
    data = FolderSource(worktree).read_present(path, MAX_RECORD) if worktree is not None \
        else None
    if data is None:
        data = commit_file(git, rev, path, MAX_RECORD + 1)
    return parse_record(data, path) if data is not None else None


def read_token(path: str | os.PathLike | None, what: str = "LFS token file") -> str | None:
    """The bearer token in the file at ``path`` (one line); ConfigError naming ``what`` and the
    path, never the content."""
    if not path:
        return None
    token = read_key_file(path, "LFS token").decode("ascii", "replace").strip()
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"{what} {os.fspath(path)}: expected one line holding a bearer token")
    return token


def choose_endpoint(given: str | None, lfsconfig: bytes | None,
                    remote: str | None) -> tuple[str | None, str]:
    """(endpoint or None, where it came from): ``given``, else the ``.lfsconfig``'s url, else
    git-lfs's discovery from an HTTP(S) ``remote``."""
    if given:
        return given, "--lfs-url"
    url = lfsconfig_url(lfsconfig) if lfsconfig else None
    if url:
        return url, FROM_TREE
    if remote:
        try:
            return lfs_url_for(remote), f"derived from {redact_url(remote)}"
        except LfsError:
            pass
    return None, "none"


def token_for(token: str | None, url: str, origin: str, remote: str | None) -> str | None:
    """``token``, if it may be sent to ``url`` (found in ``origin``, as ``choose_endpoint``
    says). An endpoint the user named or derived from the remote gets it, and so does one
    from the tree's ``.lfsconfig`` of a repository on this machine (no host: a local path or
    ``file://``). From a network remote's tree (a CI checkout of a pull request, say), whose
    ``.lfsconfig`` whoever pushed wrote, only an endpoint on that remote's host: a pushed
    ``.lfsconfig`` must not collect the token. ConfigError, naming the endpoint and what to
    do, otherwise."""
    ours = url_host(remote)
    if token is None or origin != FROM_TREE or ours is None or url_host(url) == ours:
        return token
    raise ConfigError(
        f"the tree's .lfsconfig names the LFS endpoint {redact_url(url)[:200]!r}, not on the "
        f"remote's host {ours}: the token is only sent to an endpoint on it or one you name: "
        "expected --lfs-url (lfs_url) with that endpoint, if you trust it")


def url_host(url: str | None) -> str | None:
    """The host of a remote or endpoint URL (``scheme://host``, or git's ``user@host:path``);
    None for a local path or ``file://``."""
    if not url:
        return None
    if "://" in url:
        host = urllib.parse.urlsplit(url).hostname
        return host.lower() if host and not url.startswith("file:") else None
    found = _SCP_LIKE.match(url)
    return found[1].lower() if found and not os.path.isabs(url) else None


def open_client(url: str, token: str | None, origin: str,
                progress: Callable[[int], object] | None = None) -> LfsClient:
    """An LFS client for ``url`` (``progress``: as :class:`LfsClient` takes it); ConfigError
    (URL redacted, where it came from) for one that is not http(s)."""
    try:
        return LfsClient(url, token, progress=progress)
    except LfsError:
        raise ConfigError(f"LFS endpoint {redact_url(url)[:200]!r} ({origin}): expected an "
                          "http(s):// Git LFS endpoint (.../info/lfs)") from None
