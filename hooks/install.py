"""Install and uninstall the git hooks that call ``snapops hook NAME``.

Each hook is a small POSIX shell script that records the absolute command of the snapops that
installed it (falling back to ``snapops`` on PATH when that one is gone). A hook that already
exists and is not ours is kept: it moves to ``NAME.snapops-chained``, our script runs it first
with the same arguments and standard input, and refuses when it does; uninstall moves it back.
Installing twice changes nothing; installing with another snapops updates our scripts only;
when neither that snapops nor one on PATH is there at hook time, the hook refuses with one
line saying to install again. Hooks go where git looks for them (``core.hooksPath`` is
honoured), but a hook file tracked in the work tree (a shared ``.githooks``) is refused: the
next commit would carry this machine's snapops path. In a bare repository (a
server) it also sets ``receive.fsckObjects true``, so git itself refuses malformed objects such
as trees with ``..`` or ``.git`` entries before any hook runs, and ``core.looseCompression 0``:
pre-receive reads every pushed blob, and inflating a 256 MiB blob costs git 1.0-1.3 s of CPU
where reading a stored one costs 0.1-0.2 s (the price: loose objects take up to a third more
disk until ``git gc`` packs them, compressed, as always). A value it replaces is recorded in
``snapops.replacedConfig`` (``KEY=OLD``, or ``KEY`` when it was unset) and uninstalling
``pre-receive`` puts it back, unless it was changed since. Nothing is written before every hook
is known to install: a conflict found for the second hook leaves the first untouched.

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
REPLACED_KEY = "snapops.replacedConfig"  # KEY=OLD (or KEY: it was unset), one per changed key


@dataclass(frozen=True)
class HookAction:
    name: str
    # installed | updated | unchanged | chained | removed | restored | absent | foreign;
    # a git config setting (``name`` is its key, ``value`` its value now):
    # configured | kept (install), restored | unset | kept (uninstall)
    action: str
    path: Path
    value: str | None = None
    note: str = ""


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
        "    elif command -v snapops >/dev/null 2>&1; then",
        '        OPENBLAS_NUM_THREADS="$blas" snapops "$@";',
        f"    else echo {shlex.quote(_missing_snapops(name, command[0]))} >&2; exit 2; fi",
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


def _missing_snapops(name: str, recorded: str) -> str:
    return (f"snapops {name} hook: cannot run snapops: {recorded} is gone and no snapops is "
            "on PATH; run `snapops hooks install` again with the snapops to use")


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
    """Install (or update) our hooks in ``repo``; idempotent. ConfigError before anything
    is written when one of them cannot be installed."""
    git = _repository(repo)
    folder = git.hooks_dir()
    names = hooks or default_hooks(git)
    for name in names:
        _check_installable(folder, name)
    _refuse_tracked(git, [folder / name for name in names])
    folder.mkdir(parents=True, exist_ok=True)
    command = command or snapops_command()
    actions = [_install_one(folder, name, hook_script(name, command)) for name in names]
    return actions + (_configure_server(git) if git.is_bare() else [])


def _repository(repo: str | os.PathLike) -> Git:
    git = Git(repo)
    if git.run("rev-parse", "--git-dir", check=False) == b"":
        raise ConfigError(f"{os.fspath(repo)}: not a git repository; name a repository's "
                          "folder (a work tree or a bare repository), or `git init` it first")
    return git


def _configure_server(git: Git) -> list[HookAction]:
    """Settings a receiving repository needs besides the hook (idempotent); the value each
    replaces is recorded for uninstall."""
    actions = []
    for key, (value, why) in SERVER_CONFIG.items():
        config = git.git_dir() / "config"
        if git.text("config", "--get", key, check=False) == value:
            actions.append(HookAction(key, "kept", config, value, why))
            continue
        old = _local_value(git, key)
        git.run("config", "--unset-all", REPLACED_KEY, _record_pattern(key), check=False)
        git.run("config", "--add", REPLACED_KEY, key if old is None else f"{key}={old}")
        git.run("config", key, value)
        was = "unset: uninstall unsets it" if old is None else f"{old}: uninstall restores it"
        actions.append(HookAction(key, "configured", config, value, f"was {was}; {why}"))
    return actions


def _local_value(git: Git, key: str) -> str | None:
    """The repository's own value of ``key`` (not a global one), None when unset."""
    out = git.run("config", "--local", "--get", key, check=False)
    return out.decode("utf-8", "surrogateescape").rstrip("\n") if out else None


def _record_pattern(key: str) -> str:
    return "^" + key.replace(".", "\\.") + "(=|$)"


def _restore_server_config(git: Git) -> list[HookAction]:
    """Put back what :func:`_configure_server` replaced, unless it was changed since."""
    actions = []
    for record in _values(git, REPLACED_KEY):
        key, has_old, old = record.partition("=")
        if key not in SERVER_CONFIG:
            continue
        config = git.git_dir() / "config"
        now = _local_value(git, key)
        if now != SERVER_CONFIG[key][0]:
            actions.append(HookAction(key, "kept", config, now, "changed since install"))
        elif has_old:
            git.run("config", key, old)
            actions.append(HookAction(key, "restored", config, old))
        else:
            git.run("config", "--unset-all", key)
            actions.append(HookAction(key, "unset", config))
    git.run("config", "--unset-all", REPLACED_KEY, check=False)
    return actions


def _values(git: Git, key: str) -> list[str]:
    out = git.run("config", "--local", "--get-all", key, check=False)
    return out.decode("utf-8", "surrogateescape").splitlines()


def _check_installable(folder: Path, name: str) -> None:
    """ConfigError when ``name`` holds a hook of the user's that cannot be chained."""
    path, chained = folder / name, folder / (name + CHAINED_SUFFIX)
    if (path.exists() or path.is_symlink()) and not is_ours(path) \
            and (chained.exists() or chained.is_symlink()):
        raise ConfigError(f"{path} is not a snapops hook but {chained.name} exists too: "
                          "merge them by hand, then run `snapops hooks install` again "
                          "(nothing was installed)")


def _refuse_tracked(git: Git, paths: list[Path]) -> None:
    """ConfigError when a hook to replace is a file of the work tree's history (a
    ``core.hooksPath`` such as ``.githooks`` shared through the repository): replacing it
    would put this machine's snapops path into the next commit."""
    top = git.toplevel()
    inside = [p for p in paths if top is not None and p.is_relative_to(top)]
    if not inside:
        return
    specs = [f":(top,literal){p.relative_to(top).as_posix()}" for p in inside]
    tracked = git.run("ls-files", "-z", "--full-name", "--", *specs).split(b"\0")
    for path in inside:
        if path.relative_to(top).as_posix().encode() in tracked:
            raise ConfigError(f"{path} is tracked by git (core.hooksPath points into the work "
                              f"tree): add `snapops hook {path.name} \"$@\"` to it yourself "
                              "(pre-push and pre-receive: with git's lines on stdin), or install "
                              "only the other hooks with --hook NAME; nothing was installed")


def _install_one(folder: Path, name: str, script: str) -> HookAction:
    path, chained = folder / name, folder / (name + CHAINED_SUFFIX)
    action = "installed"
    if path.exists() or path.is_symlink():
        if is_ours(path):
            if path.read_text() == script and os.access(path, os.X_OK):
                return HookAction(name, "unchanged", path)
            action = "updated"
        else:
            _check_installable(folder, name)
            os.replace(path, chained)  # same folder: atomic; keeps its mode and content
            action = "chained"
    atomic_write_bytes(path, script.encode(), mode=0o755)
    os.chmod(path, 0o755)  # umask may have masked the mode
    return HookAction(name, action, path)


def uninstall_hooks(repo: str | os.PathLike = ".", *,
                    hooks: tuple[str, ...] | None = None) -> list[HookAction]:
    """Remove our hooks; a chained original goes back to its name. Foreign hooks stay.
    Removing ``pre-receive`` also puts back the server settings install replaced."""
    git = _repository(repo)
    folder = git.hooks_dir()
    names = hooks or CLIENT_HOOKS + SERVER_HOOKS
    actions = [_uninstall_one(folder, name) for name in names]
    return actions + (_restore_server_config(git) if "pre-receive" in names else [])


def _uninstall_one(folder: Path, name: str) -> HookAction:
    path, chained = folder / name, folder / (name + CHAINED_SUFFIX)
    if not (path.exists() or path.is_symlink()):
        if chained.exists() or chained.is_symlink():   # our hook was deleted by hand
            os.replace(chained, path)
            return HookAction(name, "restored", path)
        return HookAction(name, "absent", path)
    if not is_ours(path):
        return HookAction(name, "foreign", path)
    if chained.exists() or chained.is_symlink():
        os.replace(chained, path)
        return HookAction(name, "restored", path)
    path.unlink()
    return HookAction(name, "removed", path)
