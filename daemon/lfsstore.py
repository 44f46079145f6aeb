"""The daemon's LFS store (``[repo] store = "lfs"``): its endpoint, token, object cache, and
the work-repository settings and committed files that go with it.

The token is read from ``lfs_token_file`` (one line, a bearer token such as a JWT with write
scope on the repository only) and kept in the client's request headers; it appears in no log,
status or error. The endpoint is ``lfs_url``, or git-lfs's discovery from the first HTTP(S)
remote. ``.gitattributes`` marks the run's shards ``filter=lfs diff=lfs merge=lfs -text`` so that
clones with git-lfs see pointers and can ``git lfs pull`` them, and ``.lfsconfig`` names the
endpoint (without credentials) for those clones. In the daemon's own work repository the LFS
filters are switched off: the daemon writes pointer files itself and must never smudge.
"""

from __future__ import annotations

from pathlib import Path

from snapops.config.loader import resolve
from snapops.config.schema import Config
from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.errors import ConfigError, FormatError, LfsError
from snapops.formats.gitcmd import run_git
from snapops.formats.iosafe import read_small_text
from snapops.formats.lfs.access import read_token
from snapops.formats.lfs.client import LfsClient, lfs_url_for
from snapops.formats.lfs.objects import ObjectStore
from snapops.formats.lfs.stash import LfsStash

from .redact import redact_url
from .worktree import ATTRIBUTES, write_attributes_block

LFSCONFIG = ".lfsconfig"
_BEGIN = "# >>> snapops: shards in the Git LFS store >>>"
_END = "# <<< snapops lfs <<<"


def lfs_endpoint(config: Config) -> str:
    if config.repo.lfs_url:
        return config.repo.lfs_url
    if not config.repo.remotes:
        raise ConfigError("repo.lfs_url: needed with repo.store = \"lfs\" and no remote")
    try:
        return lfs_url_for(config.repo.remotes[0].url)
    except LfsError as exc:
        raise ConfigError(f"repo.lfs_url: {exc}") from None


def lfs_token(config: Config) -> str | None:
    if not config.repo.lfs_token_file:
        return None
    return read_token(resolve(config, config.repo.lfs_token_file), "repo.lfs_token_file")


def open_stash(config: Config, state_dir: Path) -> LfsStash | None:
    """The stash the generation writer uploads through; None for ``store = "git"``."""
    if config.repo.store != "lfs":
        return None
    client = LfsClient(lfs_endpoint(config), lfs_token(config))
    return LfsStash(ObjectStore(state_dir / "lfs", client),
                    keyframe_every=config.repo.keyframe_every)


def switch_off_filters(repo: Path) -> None:
    """No git-lfs clean/smudge in the daemon's work repository (whatever the global config)."""
    for key, value in (("filter.lfs.process", ""), ("filter.lfs.clean", "cat"),
                       ("filter.lfs.smudge", "cat"), ("filter.lfs.required", "false")):
        run_git(("config", key, value), cwd=repo, what="git config", where=str(repo))


def write_lfs_files(repo: Path, config: Config) -> list[str]:
    """``.gitattributes`` (a block of its own) and ``.lfsconfig``; the paths to commit."""
    run = config.snapshot.run
    write_attributes_block(repo, _BEGIN, _END,
                           [f"/snapshots/{run}/shards/** filter=lfs diff=lfs merge=lfs -text"])
    url = lfs_endpoint(config)
    if redact_url(url) != url:  # credentials in the URL: never committed
        return [ATTRIBUTES]
    lfsconfig = f"[lfs]\n\turl = {url}\n"
    try:
        current = read_small_text(repo / LFSCONFIG, len(lfsconfig))
    except FormatError:   # a symlink, a FIFO, a huge file... a remote's tree planted: replaced
        current = None
    if current != lfsconfig:
        atomic_write_bytes(repo / LFSCONFIG, lfsconfig.encode())
    return [ATTRIBUTES, LFSCONFIG]
