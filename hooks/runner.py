"""Entry points for installed hooks and CI: read git's hook input, run :class:`Checker`, print
one line per problem (naming commit, file, line and check) and return the exit status git
acts on (0 accept, 1 refuse; configuration and git errors exit 2, which refuses too).

Example::

    run_pre_receive(Git("."), "0000... 1a2b... refs/heads/main\\n", sys.stderr)
    # -> 1
"""

from __future__ import annotations

import json
import os
import sys
from typing import Mapping, TextIO

from .check import Checker, Outcome, RefUpdate, parse_updates
from .gitio import Git
from .repo_config import RepoConfig, load_repo_config

REFUSED = {"pre-commit": "commit refused", "pre-push": "push refused",
           "pre-receive": "push rejected", "ci": "verification failed"}


def render(outcomes: list[Outcome], hook: str, out: TextIO, verbose: bool = False) -> int:
    """Print problems (and with ``verbose`` every verified file); return 0 or 1."""
    problems = files = 0
    for outcome in outcomes:
        prefix = f"{outcome.where}: " if outcome.commit or outcome.where.startswith("ref ") \
            else ""
        files += len(outcome.reports)
        for report in outcome.reports if verbose else ():
            if report.ok:
                print(f"snapops {hook}: {prefix}OK {report.path} ({report.format})", file=out)
            for note in report.notes:
                print(f"snapops {hook}: {prefix}  note: {report.path}: {note}", file=out)
        for problem in outcome.problems():
            problems += 1
            print(f"snapops {hook}: {prefix}{problem}", file=out)
    if problems:
        print(f"snapops {hook}: {REFUSED.get(hook, 'refused')}: {problems} problem(s) "
              f"({files} file(s) checked)", file=out)
        return 1
    if files:
        print(f"snapops {hook}: OK, {files} snapshot/ledger file(s) verified", file=out)
    return 0


def progress_bar(out: TextIO, hook: str):
    """A commit progress bar on a terminal (CI logs and hook output over the wire get none)."""
    def wrap(commits: list[str]):
        if len(commits) < 2 or not out.isatty():
            return iter(commits)
        from tqdm import tqdm

        return tqdm(commits, desc=f"snapops {hook}", unit="commit", file=out, leave=False)
    return wrap


def run_pre_commit(git: Git, out: TextIO, cfg: RepoConfig | None = None) -> int:
    cfg = cfg or load_repo_config(git)
    with Checker.open(git, cfg) as checker:
        return render([checker.check_index()], "pre-commit", out, cfg.verbose)


def run_pre_push(git: Git, args: list[str], stdin: str, out: TextIO) -> int:
    """``args``: git's (remote name, URL). Commits the remote's tracking refs already hold
    are not re-checked."""
    cfg = load_repo_config(git)
    updates = parse_updates(stdin, git.null_oid(), push=True)
    known = [u.old for u in updates if u.old and git.resolve(u.old)]
    remote = args[0] if args else ""
    exclude = [*known, f"--remotes={remote}" if remote else "--remotes"]
    with Checker.open(git, cfg) as checker:
        outcomes = checker.check_updates(updates, exclude, progress_bar(out, "pre-push"))
    return render(outcomes, "pre-push", out, cfg.verbose)


def run_pre_receive(git: Git, stdin: str, out: TextIO) -> int:
    """Server side: objects are in git's quarantine area (our git calls inherit its
    environment); ``--not --all`` leaves out what the repository already had."""
    cfg = load_repo_config(git)
    updates = parse_updates(stdin, git.null_oid(), push=False)
    with Checker.open(git, cfg) as checker:
        outcomes = checker.check_updates(updates, ["--all"], progress_bar(out, "pre-receive"))
    return render(outcomes, "pre-receive", out, cfg.verbose)


def run_framework(git: Git, env: Mapping[str, str], out: TextIO) -> int:
    """For the pre-commit framework (``pass_filenames: false``): its pre-push stage passes
    the range in PRE_COMMIT_FROM_REF/TO_REF (or, pushing a whole new history, only the
    branch); any other stage checks the index."""
    frm, to = env.get("PRE_COMMIT_FROM_REF"), env.get("PRE_COMMIT_TO_REF")
    if frm and to:
        return run_range(git, f"{frm}..{to}", out, hook="pre-push")
    branch = env.get("PRE_COMMIT_LOCAL_BRANCH")
    if branch:
        remote = env.get("PRE_COMMIT_REMOTE_NAME", "")
        stdin = f"{branch} {git.resolve(branch)} {branch} {git.null_oid()}\n"
        return run_pre_push(git, [remote] if remote else [], stdin, out)
    return run_pre_commit(git, out)


def parse_range(git: Git, text: str) -> RefUpdate:
    """``BASE..HEAD`` (BASE may be all zeros, as CI systems send for a new branch) or a single
    revision (its whole history)."""
    from snapops.formats.errors import ConfigError

    base, sep, head = text.partition("..")
    if not sep:
        base, head = "", text
    head_oid = git.resolve(f"{head or 'HEAD'}^{{commit}}")
    if head_oid is None:
        raise ConfigError(f"--range {text}: {head or 'HEAD'} is not a commit")
    if base.strip("0") == "":
        return RefUpdate("range", None, head_oid)
    base_oid = git.resolve(f"{base}^{{commit}}")
    if base_oid is None:
        raise ConfigError(f"--range {text}: {base} is not a commit here (fetch the whole "
                          "history: actions/checkout fetch-depth: 0, GitLab GIT_DEPTH: 0; after "
                          "a force push the old tip may be gone: history was rewritten)")
    return RefUpdate("range", base_oid, head_oid)


def run_range(git: Git, text: str, out: TextIO, *, hook: str = "ci",
              cfg: RepoConfig | None = None, as_json: bool = False) -> int:
    """Every commit in the range, then the range's ledgers end to end (CI, pre-push)."""
    cfg = cfg or load_repo_config(git)
    update = parse_range(git, text)
    exclude = [update.old] if update.old else []
    with Checker.open(git, cfg) as checker:
        outcomes = checker.check_updates([update], exclude, progress_bar(out, hook))
    if as_json:
        json.dump([o.to_dict() for o in outcomes], sys.stdout, indent=2)
        sys.stdout.write("\n")
    return render(outcomes, hook, out, cfg.verbose)


def run_hook(name: str, args: list[str], *, repo: str = ".", stdin: TextIO | None = None,
             out: TextIO | None = None, env: Mapping[str, str] | None = None) -> int:
    """Dispatch ``snapops hook NAME ARGS...`` (what the installed scripts call)."""
    git, out = Git(repo), out or sys.stderr
    stdin = stdin or sys.stdin
    if name == "pre-commit":
        return run_pre_commit(git, out)
    if name == "pre-push":
        return run_pre_push(git, args, stdin.read(), out)
    if name == "pre-receive":
        return run_pre_receive(git, stdin.read(), out)
    if name == "pre-commit-framework":
        return run_framework(git, os.environ if env is None else env, out)
    raise ValueError(f"unknown hook {name!r}")
