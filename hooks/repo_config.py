"""Per-repository hook settings, read with ``git config`` (so they live in ``.git/config``, the
server's bare repository config, or ``git -c`` for one run) and passed around frozen.

* ``snapops.trustedKeys`` (path, repeatable with ``git config --add``): a PEM Ed25519 public
  key or a folder of ``*.pub``. Relative paths are resolved against the work tree's root (a
  bare repository: its own folder). Giving keys makes every MANIFEST need a signature by one.
* ``snapops.requireSignature`` (bool): refuse unsigned generations (fails when no key is set).
* ``snapops.hmacKey`` (path): HMAC key file (64 hex + LF); every MANIFEST's HMAC is checked.
* ``snapops.requireHmac`` (bool): refuse arrays without an HMAC (needs ``snapops.hmacKey``).
* ``snapops.useWorktree`` (bool, default true): pre-commit reads a work-tree file that hashes
  to the staged blob id in place instead of inflating the blob (faster; a local check).
* ``snapops.maxBlobSize`` (int, ``k``/``m``/``g`` suffixes; default 4 GiB): the largest blob a
  hook reads or writes to its scratch folder; a larger one is refused before it is read.
* ``snapops.maxPaths`` (int; default 200,000): the most paths one listing of a tree (a
  commit's changes, a run's folder) may name; more is refused, since a pushed tree of a few
  hundred bytes can stand for billions of paths.
* ``snapops.protectedBranch`` (branch name; default: the branch HEAD names): a created ref must
  extend its ledgers, and it cannot be deleted.
* ``snapops.verbose`` (bool): print one line per verified generation, with its notes.

On a server, point ``snapops.trustedKeys`` at keys outside the repository: a pushed tree must
never decide which keys are trusted.

Example::

    cfg = load_repo_config(Git("."))
    cfg.require_signature, cfg.trusted_keys
    # -> (True, ('/srv/keys',))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from snapops.formats.errors import ConfigError
from snapops.formats.generation.source import DEFAULT_MAX_BLOB
from snapops.formats.generation.verify import GenerationOptions
from snapops.formats.gitcmd import MAX_LISTED_PATHS
from snapops.formats.keys import coerce_hmac_key, coerce_trusted

from .gitio import Git

KEYS = ("snapops.trustedKeys", "snapops.requireSignature", "snapops.hmacKey",
        "snapops.requireHmac", "snapops.useWorktree", "snapops.maxBlobSize", "snapops.maxPaths",
        "snapops.protectedBranch", "snapops.verbose")


@dataclass(frozen=True)
class RepoConfig:
    trusted_keys: tuple[str, ...] = ()
    require_signature: bool = False
    hmac_key: str | None = None
    require_hmac: bool = False
    use_worktree: bool = True
    max_blob_size: int = DEFAULT_MAX_BLOB
    max_paths: int = MAX_LISTED_PATHS
    protected_branch: str | None = None
    verbose: bool = False

    def generation_options(self, **extra) -> GenerationOptions:
        """What every generation must satisfy, keys loaded once (KeyMaterialError if a key
        file is bad); ``extra``: expect_prev, memo..."""
        return GenerationOptions(trusted_keys=coerce_trusted(list(self.trusted_keys)),
                                 hmac_key=coerce_hmac_key(self.hmac_key),
                                 require_signature=self.require_signature,
                                 require_hmac=self.require_hmac, **extra)

    def overridden(self, *, trusted_keys=(), require_signature=False, hmac_key=None,
                   require_hmac=False) -> "RepoConfig":
        """Flags on top of the repository's config: keys add up, requirements only tighten."""
        return replace(self, trusted_keys=self.trusted_keys + tuple(map(os.fspath, trusted_keys)),
                       require_signature=self.require_signature or require_signature,
                       hmac_key=os.fspath(hmac_key) if hmac_key else self.hmac_key,
                       require_hmac=self.require_hmac or require_hmac)


def _values(git: Git, key: str, kind: str | None) -> list[str]:
    typed = [f"--type={kind}"] if kind else []
    out = git.run("config", *typed, "--get-all", key, check=False)
    if out:
        return out.decode("utf-8", "surrogateescape").splitlines()
    # exit 1 = unset; any other failure (a bad bool, a broken config file) must not pass silently
    probe = git.run("config", "--get-all", key, check=False)
    if probe:
        raise ConfigError(f"git config {key}: not a valid {kind}: "
                          f"{probe.decode('utf-8', 'replace').strip()!r}")
    return []


def _bool(git: Git, key: str, default: bool) -> bool:
    values = _values(git, key, "bool")
    return values[-1] == "true" if values else default


def _size(git: Git, key: str, default: int) -> int:
    values = _values(git, key, "int")
    if not values:
        return default
    value = int(values[-1])
    if value < 1:
        raise ConfigError(f"git config {key}: must be at least 1, got {value}")
    return value


def _branch(git: Git) -> str | None:
    values = _values(git, "snapops.protectedBranch", None)
    if not values:
        return None
    name = values[-1].removeprefix("refs/heads/")
    if git.run("check-ref-format", "--branch", name, check=False).strip() != name.encode():
        raise ConfigError(f"git config snapops.protectedBranch: {name!r} is not a branch name")
    return name


def _anchor(git: Git, value: str, key: str) -> str:
    path = Path(value)
    if not path.is_absolute():
        path = (git.toplevel() or git.git_dir()) / path
    if not path.exists():
        raise ConfigError(f"git config {key}: {path} does not exist")
    return os.fspath(path)


def load_repo_config(git: Git) -> RepoConfig:
    """Read every ``snapops.*`` hook setting; ConfigError names the key that is wrong."""
    keys = tuple(_anchor(git, v, "snapops.trustedKeys")
                 for v in _values(git, "snapops.trustedKeys", "path"))
    hmac = _values(git, "snapops.hmacKey", "path")
    cfg = RepoConfig(
        trusted_keys=keys,
        require_signature=_bool(git, "snapops.requireSignature", False),
        hmac_key=_anchor(git, hmac[-1], "snapops.hmacKey") if hmac else None,
        require_hmac=_bool(git, "snapops.requireHmac", False),
        use_worktree=_bool(git, "snapops.useWorktree", True),
        max_blob_size=_size(git, "snapops.maxBlobSize", DEFAULT_MAX_BLOB),
        max_paths=_size(git, "snapops.maxPaths", MAX_LISTED_PATHS),
        protected_branch=_branch(git),
        verbose=_bool(git, "snapops.verbose", False),
    )
    if cfg.require_hmac and cfg.hmac_key is None:
        raise ConfigError("snapops.requireHmac is true but snapops.hmacKey is not set")
    return cfg
