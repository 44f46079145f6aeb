"""Snapshot repositories for the hook tests, driven with the real git CLI: generations are
written exactly as the daemon writes them (``write_generation`` + ``seal_in_ledger``), committed
with ``git commit`` and tagged ``<run>/gen-N``; remotes are bare repositories with the installed
hooks, which run the installed ``snapops`` (this venv's bin first on PATH)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from snapops.formats.generation.manifest import gen_text
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
from snapops.formats.keys import load_hmac_key
from snapops.hooks.install import install_hooks
from tests.daemon.daemon_env import state_for

TS = "2026-01-02T03:04:05Z"
RUN = "run1"
MANIFEST = f"snapshots/{RUN}/MANIFEST"
LEDGER = f"ledger/{RUN}.ledger"
VENV_BIN = Path(sys.executable).parent
SNAPOPS = str(VENV_BIN / "snapops")


def git_env(tmp_path: Path) -> dict[str, str]:
    """A git environment free of the user's config, with this venv's snapops first on PATH,
    and a private TMPDIR (where the hooks' scratch folders go)."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "SNAPOPS_"))}
    return keep | {
        "HOME": str(home), "TMPDIR": str(tmp), "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e", "GIT_AUTHOR_DATE": TS, "GIT_COMMITTER_DATE": TS}


def state(gen: int, rows: int = 64) -> dict[str, np.ndarray]:
    """A small state (16 columns, 8 biases); each gen changes one row and the step."""
    return state_for(gen, rows, cols=16, bias=8)


class Repo:
    """A repository (work tree or bare) driven with the real git CLI."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path, self.env = path, env

    def git(self, *args: str, check: bool = True, input: str | bytes | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(["git", *args], cwd=self.path, env=env or self.env,
                              text=not isinstance(input, bytes), capture_output=True,
                              input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def out(self, *args: str) -> str:
        return self.git(*args).stdout.strip()

    def head(self) -> str:
        return self.out("rev-parse", "HEAD")

    def snapops(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([SNAPOPS, *args], cwd=self.path, env=self.env, text=True,
                              capture_output=True)


class GenRepo(Repo):
    """A work tree where generations are committed as the daemon commits them."""

    def __init__(self, path: Path, env: dict[str, str], keys: Path, fmt: str = "wtxt",
                 **spec) -> None:
        super().__init__(path, env)
        self.keys, self.fmt, self.extra = keys, fmt, spec

    def spec(self, keys: Path | None = None) -> GenerationSpec:
        keys = keys or self.keys
        return GenerationSpec(run=RUN, format=self.fmt, shard_max=1024, build="b1",
                              sign_key=keys / "signing.key",
                              hmac_key=load_hmac_key(keys / "hmac.key"), **self.extra)

    def previous(self) -> bytes | None:
        proc = self.git("show", f"HEAD:{MANIFEST}", check=False, input=b"")
        return proc.stdout if proc.returncode == 0 else None

    def write(self, gen: int, arrays=None, keys: Path | None = None) -> None:
        written = write_generation(self.path, self.spec(keys), gen, TS,
                                   arrays if arrays is not None else state(gen),
                                   self.previous())
        seal_in_ledger(self.path, RUN, written)

    def commit(self, message: str, *extra: str, check: bool = True):
        self.git("add", "-A")
        return self.git("commit", "-q", "-m", message, *extra, check=check)

    def generation(self, gen: int, arrays=None, keys: Path | None = None, *extra: str):
        """Write, commit (through the pre-commit hook when installed) and tag ``gen``."""
        self.write(gen, arrays, keys)
        self.commit(f"gen {gen}", *extra)
        self.git("tag", "-a", "-m", f"gen {gen}", tag(gen))
        return self.head()

    def push(self, *refspecs: str, verify: bool = False):
        flags = [] if verify else ["--no-verify"]
        return self.git("push", *flags, "origin", *refspecs, check=False)


def tag(gen: int) -> str:
    return f"{RUN}/gen-{gen_text(gen)}"


def make_repo(path: Path, env: dict[str, str], *, bare: bool = False) -> Repo:
    args = ["git", "init", "-q", "-b", "main"] + (["--bare"] if bare else []) + [str(path)]
    subprocess.run(args, check=True, env=env)
    return Repo(path, env)


def guarded_remote(path: Path, env: dict[str, str], keys: Path, *, fsck: bool = True) -> Repo:
    """A bare remote with the installed pre-receive requiring signatures by the keys in
    ``keys``' trusted folder and HMACs (keys outside the repository)."""
    bare = make_repo(path, env, bare=True)
    install_hooks(bare.path, command=[SNAPOPS])
    trusted = keys.parent / f"{keys.name}-trusted"
    trusted.mkdir(exist_ok=True)
    (trusted / "signing.pub").write_bytes((keys / "signing.pub").read_bytes())
    for key, value in (("snapops.trustedKeys", str(trusted)),
                       ("snapops.requireSignature", "true"),
                       ("snapops.hmacKey", str(keys / "hmac.key")),
                       ("snapops.requireHmac", "true"),
                       ("receive.fsckObjects", "true" if fsck else "false")):
        bare.git("config", key, value)
    return bare


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def tree_with(repo: Repo, tree: str | None, parts: list[str], mode: str, oid: str) -> str:
    """A copy of ``tree`` (None: empty) with ``mode oid`` at ``parts``, made with ``git
    mktree``, which takes any entry name: crafted trees with ``..`` or ``.git`` entries."""
    entries = {}
    if tree is not None:
        for line in filter(None, repo.git("ls-tree", "-z", tree).stdout.split("\0")):
            meta, name = line.split("\t", 1)
            entries[name] = meta
    kind = {"040000": "tree", "160000": "commit"}.get(mode, "blob")
    if len(parts) > 1:
        sub = entries.get(parts[0])
        sub_oid = sub.split()[2] if sub and sub.split()[1] == "tree" else None
        oid, mode, kind = tree_with(repo, sub_oid, parts[1:], mode, oid), "040000", "tree"
    entries[parts[0]] = f"{mode} {kind} {oid}"
    text = "".join(f"{meta}\t{name}\0" for name, meta in entries.items())
    return repo.git("mktree", "-z", "--missing", input=text).stdout.strip()


def commit_with(repo: Repo, path: str, mode: str, oid: str, message: str) -> str:
    """A commit on top of HEAD whose tree adds ``mode oid`` at ``path`` (split on ``/``, so
    ``..`` components stay entries); the branch moves to it."""
    root = repo.out("rev-parse", "HEAD^{tree}")
    tree = tree_with(repo, root, path.split("/"), mode, oid)
    commit = repo.out("commit-tree", tree, "-p", "HEAD", "-m", message)
    repo.git("update-ref", "HEAD", commit)
    return commit


def sealed_work_repo(root: Path, keys: Path, states) -> GenRepo:
    """A work repository requiring signatures and HMACs by ``keys``, holding generation 1, 2,
    ... of ``states`` (each a dict of arrays), committed as the daemon commits them."""
    env = git_env(root)
    make_repo(root / "work", env)
    repo = GenRepo(root / "work", env, keys)
    for key, value in (("snapops.trustedKeys", str(keys / "signing.pub")),
                       ("snapops.requireSignature", "true"),
                       ("snapops.hmacKey", str(keys / "hmac.key")),
                       ("snapops.requireHmac", "true")):
        repo.git("config", key, value)
    for gen, arrays in enumerate(states, start=1):
        repo.generation(gen, arrays)
    return repo
