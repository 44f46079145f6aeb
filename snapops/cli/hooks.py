"""snapops hooks install/uninstall: put the verifying git hooks into a repository."""

from __future__ import annotations

import sys

from ._common import EXIT_INPUT, EXIT_OK, add_command
from ._paths import check_folder

HOOK_NAMES = ("pre-commit", "pre-push", "pre-receive")


def describe(action) -> str:
    """One line per hook (its path) or git config setting (``key=value in config (note)``)."""
    from snapops.hooks.install import SERVER_CONFIG

    if action.name not in SERVER_CONFIG:
        return f"{action.action:<9} {action.path}"
    setting = action.name if action.value is None else f"{action.name}={action.value}"
    note = f" ({action.note})" if action.note else ""
    return f"{action.action:<9} {setting} in {action.path}{note}"


def run_install(args) -> int:
    from snapops.hooks.install import install_hooks

    check_folder(args.repo)
    for action in install_hooks(args.repo, hooks=tuple(args.hook) or None):
        print(describe(action))
    return EXIT_OK


def run_uninstall(args) -> int:
    from snapops.hooks.install import uninstall_hooks

    check_folder(args.repo)
    for action in uninstall_hooks(args.repo, hooks=tuple(args.hook) or None):
        print(describe(action))
    return EXIT_OK


def register(sub) -> None:
    p = add_command(
        sub, "hooks", help="install or uninstall the snapshot-verifying git hooks",
        description="Hooks call `snapops hook NAME`; settings come from `git config snapops.*` "
                    "(trustedKeys, requireSignature, hmacKey, requireHmac, maxBlobSize, maxPaths, "
                    "protectedBranch, useWorktree, verbose).",
        example="snapops hooks install . && git config snapops.trustedKeys keys/", func=None)

    def run_help(args) -> int:
        p.print_help(sys.stderr)
        return EXIT_INPUT

    p.set_defaults(func=run_help)
    hsub = p.add_subparsers(dest="hooks_command", metavar="ACTION")
    i = add_command(
        hsub, "install", help="install pre-commit and pre-push (bare: pre-push and pre-receive)",
        description="Idempotent. An existing hook that is not ours is kept as "
                    "NAME.snapops-chained and still runs first; its failure refuses too. "
                    "The hook records the absolute path of this snapops. In a bare repository "
                    "it also sets receive.fsckObjects true and core.looseCompression 0, and "
                    "prints the value each replaces. Hooks go where git looks for them "
                    "(core.hooksPath); one tracked in the work tree is refused. A conflict "
                    "leaves everything as it was.",
        example="snapops hooks install /srv/git/snapshots.git", func=run_install)
    u = add_command(
        hsub, "uninstall", help="remove our hooks, restoring chained originals",
        description="Removes only hooks snapops installed; a chained original gets its "
                    "name back. Removing pre-receive also puts back the receive.fsckObjects "
                    "and core.looseCompression values install replaced (unless changed "
                    "since).", example="snapops hooks uninstall .", func=run_uninstall)
    for q in (i, u):
        q.add_argument("repo", nargs="?", default=".", metavar="REPO",
                       help="repository (work tree or bare; default: .)")
        q.add_argument("--hook", action="append", default=[], choices=HOOK_NAMES,
                       help="only this hook (repeatable; default: all that apply)")
