"""Install and uninstall the git hooks that call ``snapops hook NAME``.

Each hook is a small POSIX shell script that records the absolute command of the snapops that
installed it (falling back to ``snapops`` on PATH when that one is gone). A hook that already
exists and is not ours is kept: it moves to ``NAME.snapops-chained``, our script runs it first
with the same arguments and standard input, and refuses when it does; uninstall moves it back.
Installing twice changes nothing; installing with another snapops updates our scripts only.
Hooks go where git looks for them (``core.hooksPath`` is honoured). In a bare repository (a
server) it also sets ``receive.fsckObjects true``, so git itself refuses malformed objects such
as trees with ``..`` or ``.git`` entries before any hook runs, and ``core.looseCompression 0``:
pre-receive reads every pushed blob, and inflating a 256 MiB blob costs git 1.0-1.3 s of CPU
where reading a stored one costs 0.1-0.2 s (the price: loose objects take up to a third more
disk until ``git gc`` packs them, compressed, as always).

Example::

    install_hooks(".")
    # -> [HookAction(name='pre-commit', action='installed', ...), ...]
    uninstall_hooks(".")
    # -> [HookAction(name='pre-commit', action='removed', ...), ...]
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.errors import ConfigError

from .gitio import Git

MARKER = "# snapops-hook v1"
MKTEMP_TEMPLATE = "X" * 6  # mktemp wants at least six trailing Xs
CHAINED_SUFFIX = ".snapops-chained"
CLIENT_HOOKS = ("pre-commit", "pre-push")
SERVER_HOOKS = ("pre-receive",)
STDIN_HOOKS = frozenset({"pre-push", "pre-receive"})
SERVER_CONFIG = {  # key: (value, why), set in bare repositories
    "receive.fsckObjects": ("true", "git refuses malformed objects, e.g. trees with '..' "
                            "entries, before the hook runs"),
    "core.looseCompression": ("0", "pushed blobs are stored, not deflated: the hook reads "
                              "them 5-8x faster; git gc still packs them compressed"),
}


@dataclass(frozen=True)
class HookAction:
    name: str
    # installed | updated | unchanged | chained | removed | restored | absent | foreign;
    # configured | kept (a git config setting: ``name`` is its key)
    action: str
    path: Path


def snapops_command() -> list[str]:
    """How this snapops was started, as an absolute command for a hook to run."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "snapops" and os.access(argv0, os.X_OK):
        return [os.fspath(argv0.resolve() if not argv0.is_absolute() else argv0)]
    beside = Path(sys.executable).with_name("snapops")
    if os.access(beside, os.X_OK):
        return [os.fspath(beside)]
    return [sys.executable, "-m", "snapops"]


def hook_script(name: str, command: list[str]) -> str:
    """The script for hook ``name``; ``command`` is the recorded snapops."""
    exe = shlex.quote(command[0])
    recorded = " ".join(shlex.quote(c) for c in command)
    lines = [
        "#!/bin/sh",
        f"{MARKER} (installed by `snapops hooks install`; `snapops hooks uninstall` removes it)",
        f"# {name}: verify snapshot files and ledgers (snapops hook {name})",
        "snapops_run() {",
        "    # one OpenBLAS thread: snapops runs no large BLAS, and idle OpenBLAS threads cost",
        "    # a hook 0.1 CPU-s at start-up (only snapops gets it, not a chained hook)",
        '    blas="${OPENBLAS_NUM_THREADS:-1}"',
        f"    if [ -x {exe} ]; then OPENBLAS_NUM_THREADS=\"$blas\" {recorded} \"$@\";",
        '    else OPENBLAS_NUM_THREADS="$blas" snapops "$@"; fi',
        "}",
        f"chained=\"$(dirname \"$0\")/{name}{CHAINED_SUFFIX}\"",
    ]
    if name in STDIN_HOOKS:  # both the chained hook and snapops read the ref lines
        lines += [
            f'input="$(mktemp "${{TMPDIR:-/tmp}}/snapops-hook.{MKTEMP_TEMPLATE}")" || exit 1',
            "trap 'rm -f \"$input\"' EXIT",
            'cat > "$input" || exit 1',
            'if [ -x "$chained" ]; then "$chained" "$@" < "$input" || exit $?; fi',
            f'snapops_run hook {name} "$@" < "$input"',
        ]
    else:
        lines += [
            'if [ -x "$chained" ]; then "$chained" "$@" || exit $?; fi',
            f'snapops_run hook {name} "$@"',
        ]
    return "\n".join(lines) + "\n"


def is_ours(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return MARKER.encode() in f.read(4096)
    except OSError:
        return False


def default_hooks(git: Git) -> tuple[str, ...]:
    """A work tree's hooks; a bare repository has no commits of its own to check (no
    pre-commit), but receives pushes and may push on (a mirror)."""
    return ("pre-push",) + SERVER_HOOKS if git.is_bare() else CLIENT_HOOKS


def install_hooks(repo: str | os.PathLike = ".", *, hooks: tuple[str, ...] | None = None,
                  command: list[str] | None = None) -> list[HookAction]:
    """Install (or update) our hooks in ``repo``; idempotent."""
    git = Git(repo)
    folder = git.hooks_dir()
    folder.mkdir(parents=True, exist_ok=True)
    command = command or snapops_command()
    actions = [_install_one(folder, name, hook_script(name, command))
               for name in hooks or default_hooks(git)]
    return actions + (_configure_server(git) if git.is_bare() else [])


def _configure_server(git: Git) -> list[HookAction]:
    """Settings a receiving repository needs besides the hook (idempotent)."""
    actions = []
    for key, (value, _why) in SERVER_CONFIG.items():
        current = git.text("config", "--get", key, check=False)
        if current != value:
            git.run("config", key, value)
        actions.append(HookAction(key, "kept" if current == value else "configured",
                                  git.git_dir() / "config"))
    return actions


def _install_one(folder: Path, name: str, script: str) -> HookAction:
    path, chained = folder / name, folder / (name + CHAINED_SUFFIX)
    action = "installed"
    if path.exists() or path.is_symlink():
        if is_ours(path):
            if path.read_text() == script and os.access(path, os.X_OK):
                return HookAction(name, "unchanged", path)
            action = "updated"
        elif chained.exists() or chained.is_symlink():
            raise ConfigError(f"{path} is not a snapops hook but {chained.name} exists too: "
                              "merge them by hand, then run `snapops hooks install` again")
        else:
            os.replace(path, chained)  # same folder: atomic; keeps its mode and content
            action = "chained"
    atomic_write_bytes(path, script.encode(), mode=0o755)
    os.chmod(path, 0o755)  # umask may have masked the mode
    return HookAction(name, action, path)


def uninstall_hooks(repo: str | os.PathLike = ".", *,
                    hooks: tuple[str, ...] | None = None) -> list[HookAction]:
    """Remove our hooks; a chained original goes back to its name. Foreign hooks stay."""
    git = Git(repo)
    folder = git.hooks_dir()
    return [_uninstall_one(folder, name) for name in hooks or CLIENT_HOOKS + SERVER_HOOKS]


def _uninstall_one(folder: Path, name: str) -> HookAction:
    path, chained = folder / name, folder / (name + CHAINED_SUFFIX)
    if not (path.exists() or path.is_symlink()):
        return HookAction(name, "absent", path)
    if not is_ours(path):
        return HookAction(name, "foreign", path)
    if chained.exists() or chained.is_symlink():
        os.replace(chained, path)
        return HookAction(name, "restored", path)
    path.unlink()
    return HookAction(name, "removed", path)
