"""Entry points for installed hooks and CI: read git's hook input, run :class:`Checker`, print
one line per problem (naming commit, file, line and the rule) and return the exit status git
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

from snapops.formats.errors import ConfigError, LimitError, UsageError, printable

from .check import Checker, Outcome, parse_updates
from .gitio import Git
from .refs import (
    BRANCH_PREFIX, RefUpdate, check_gen_tag, check_ledgers_kept, gen_tags_at, protected_branch,
)
from .repo_config import RepoConfig, load_repo_config

REFUSED = {"pre-commit": "commit refused", "pre-push": "push refused",
           "pre-receive": "push rejected", "ci": "verification failed"}


def render(outcomes: list[Outcome], hook: str, out: TextIO, verbose: bool = False) -> int:
    """Print problems (and with ``verbose`` every verified unit); return 0 or 1."""
    problems = checked = 0

    def say(text: str) -> None:
        print(printable(f"snapops {hook}: {text}"), file=out)

    for outcome in outcomes:
        prefix = f"{outcome.where}: " if outcome.commit else ""
        checked += sum(r.format in ("generation", "ledger") for r in outcome.reports)
        for report in outcome.reports if verbose else ():
            if report.ok:
                say(f"{prefix}OK {report.path} ({report.format})")
            for note in report.notes:
                say(f"{prefix}  note: {report.path}: {note}")
        for problem in outcome.problems():
            problems += 1
            say(f"{prefix}{problem}")
    if problems:
        print(f"snapops {hook}: {REFUSED.get(hook, 'refused')}: {problems} problem(s)", file=out)
        return 1
    if checked:
        print(f"snapops {hook}: OK, {checked} generation/ledger check(s) passed", file=out)
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
    are not re-checked; a created branch must extend the remote's protected branch as this
    repository last saw it (``refs/remotes/<remote>/<branch>``)."""
    cfg = load_repo_config(git)
    updates = parse_updates(stdin, git.null_oid(), push=True)
    known = [u.old for u in updates if u.old and git.resolve(u.old)]
    remote = args[0] if args else ""
    exclude = [*known, f"--remotes={remote}" if remote else "--remotes"]
    protected = protected_branch(git, cfg.protected_branch, f"refs/remotes/{remote}/HEAD")
    tip = git.resolve(f"refs/remotes/{remote}/{protected}") if remote and protected else None
    with Checker.open(git, cfg) as checker:
        outcomes = checker.check_updates(updates, exclude, protected=protected,
                                         protected_tip=tip,
                                         progress=progress_bar(out, "pre-push"))
    return render(outcomes, "pre-push", out, cfg.verbose)


def run_pre_receive(git: Git, stdin: str, out: TextIO) -> int:
    """Server side: objects are in git's quarantine area (our git calls inherit its
    environment); ``--not --all`` leaves out what the repository already had."""
    cfg = load_repo_config(git)
    updates = parse_updates(stdin, git.null_oid(), push=False)
    protected = protected_branch(git, cfg.protected_branch)
    tip = git.resolve(f"{BRANCH_PREFIX}{protected}") if protected else None
    with Checker.open(git, cfg) as checker:
        outcomes = checker.check_updates(updates, ["--all"], protected=protected,
                                         protected_tip=tip,
                                         progress=progress_bar(out, "pre-receive"))
    return render(outcomes, "pre-receive", out, cfg.verbose)


def run_framework(git: Git, env: Mapping[str, str], out: TextIO) -> int:
    """For the pre-commit framework (``pass_filenames: false``): its pre-push stage passes
    the range in PRE_COMMIT_FROM_REF/TO_REF (or, pushing a whole new history, only the
    local and remote branch: the ref rules apply to the remote one); any other stage checks
    the index."""
    frm, to = env.get("PRE_COMMIT_FROM_REF"), env.get("PRE_COMMIT_TO_REF")
    if frm and to:
        return run_range(git, f"{frm}..{to}", out, hook="pre-push")
    branch = env.get("PRE_COMMIT_LOCAL_BRANCH")
    if branch:
        remote = env.get("PRE_COMMIT_REMOTE_NAME", "")
        target = env.get("PRE_COMMIT_REMOTE_BRANCH") or branch
        stdin = f"{branch} {git.resolve(branch)} {target} {git.null_oid()}\n"
        return run_pre_push(git, [remote] if remote else [], stdin, out)
    return run_pre_commit(git, out)


def parse_range(git: Git, text: str) -> RefUpdate:
    """``BASE..HEAD`` (BASE may be all zeros, as CI systems send for a new branch) or a single
    revision (its whole history)."""
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


def check_range(checker: Checker, update: RefUpdate, progress) -> list[Outcome]:
    """Every commit of the range as the hooks check it, the range's ledgers end to end (a
    rewritten history shows only there), and the generation tags pointing into it."""
    git = checker.git
    commits = git.commits(update.new, *(["--not", update.old] if update.old else []))
    outcomes = [checker.check_commit(commit) for commit in progress(commits)]
    refs = Outcome(f"range {text_range(update)}")
    if update.old:
        refs.refuse(check_ledgers_kept(git, update, update.old,
                                       f"the range's base {update.old[:12]}"), "ledger")
    for tag in gen_tags_at(git, set(commits)):
        refs.refuse(check_gen_tag(git, tag), "ref")
    return outcomes + [refs]


def text_range(update: RefUpdate) -> str:
    return f"{update.old[:12] if update.old else 'root'}..{update.new[:12]}"


def run_range(git: Git, text: str, out: TextIO, *, hook: str = "ci",
              cfg: RepoConfig | None = None, as_json: bool = False, lfs=None) -> int:
    """CI and the pre-commit framework's pre-push stage: :func:`check_range`; ``lfs``:
    (source, run) -> LfsSource, to fetch and verify LFS-store contents too."""
    cfg = cfg or load_repo_config(git)
    update = parse_range(git, text)
    with Checker.open(git, cfg, lfs) as checker:
        outcomes = check_range(checker, update, progress_bar(out, hook))
    if as_json:
        json.dump([o.to_dict() for o in outcomes], sys.stdout, indent=2)
        sys.stdout.write("\n")
    return render(outcomes, hook, out, cfg.verbose)


MAX_UPDATES_INPUT = 64 << 20   # ref update lines on stdin; 100,000 refs take about 15 MiB


def read_updates(stdin: TextIO | None, hook: str) -> str:
    """The ref update lines git writes to a hook's stdin, read as bytes (a hostile stream of
    any bytes is parsed, and refused, line by line) and bounded (LimitError beyond
    ``MAX_UPDATES_INPUT``). UsageError when stdin is closed or a terminal (run by hand: git
    always pipes them), rather than a crash or a silent wait."""
    if stdin is None or stdin.isatty():
        raise UsageError(f"snapops hook {hook} reads git's ref update lines on standard input, "
                         "which is a terminal or closed: pipe them in (see `snapops hook "
                         "--help`)")
    source = getattr(stdin, "buffer", stdin)
    data = source.read(MAX_UPDATES_INPUT + 1)
    if len(data) > MAX_UPDATES_INPUT:
        raise LimitError("hook input: more ref update lines than any push sends", check="input",
                         expected=f"at most {MAX_UPDATES_INPUT} bytes on stdin", got="more")
    return data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data


def run_hook(name: str, args: list[str], *, repo: str = ".", stdin: TextIO | None = None,
             out: TextIO | None = None, env: Mapping[str, str] | None = None) -> int:
    """Dispatch ``snapops hook NAME ARGS...`` (what the installed scripts call)."""
    git, out = Git(repo), out or sys.stderr
    stdin = stdin or sys.stdin
    if name == "pre-commit":
        return run_pre_commit(git, out)
    if name == "pre-push":
        return run_pre_push(git, args, read_updates(stdin, name), out)
    if name == "pre-receive":
        return run_pre_receive(git, read_updates(stdin, name), out)
    if name == "pre-commit-framework":
        return run_framework(git, os.environ if env is None else env, out)
    raise ValueError(f"unknown hook {name!r}")
