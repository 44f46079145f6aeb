"""snapops hook NAME: what installed git hooks run (exit 0 accept, 1 refuse, 2 error)."""

from __future__ import annotations

from ._common import add_command
from ._paths import check_folder

HOOKS = ("pre-commit", "pre-push", "pre-receive", "pre-commit-framework")


def run(args) -> int:
    from snapops.formats.gitcmd import run_as_hook
    from snapops.hooks.runner import run_hook

    run_as_hook()    # git's GIT_DIR, GIT_INDEX_FILE, quarantine... are this hook's
    check_folder(args.repo)
    return run_hook(args.name, args.args, repo=args.repo)


def register(sub) -> None:
    p = add_command(
        sub, "hook", help="run a git hook's checks (called by installed hooks)",
        description="Every generation a tree changes is verified as a whole (sealed MANIFEST, "
                    "exact file set, every shard, chain to the parent, ledger). pre-commit "
                    "checks the index against HEAD; pre-push and pre-receive read git's ref "
                    "lines on stdin, check every new commit and the ref rules (protected "
                    "branch, generation tags), naming commit, file, line and rule; "
                    "pre-commit-framework serves the pre-commit framework "
                    "(.pre-commit-hooks.yaml).",
        example="printf '%s %s refs/heads/main\\n' \"$OLD\" \"$NEW\" | snapops hook pre-receive",
        func=run)
    p.add_argument("name", choices=HOOKS, metavar="NAME", help=", ".join(HOOKS))
    p.add_argument("args", nargs="*", metavar="ARG", help="the hook's arguments from git")
    p.add_argument("--repo", default=".", help="repository (default: the current folder)")
