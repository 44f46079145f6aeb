"""The pull-request review: verify the generations a range commits, review each changed run,
and write one comment body (``comment.md``) and one heatmap (``review.png``) for CI to post.

What CI runs is ``snapops review pr --base BASE --head HEAD --out DIR``; only the API call that
creates or updates the comment is left to the workflow (``deploy/ci/``). The body starts with
:data:`MARKER`, so the workflow finds its earlier comment and updates it instead of adding one.

1. Verify: every commit of ``BASE..HEAD`` as the hooks check it
   (:func:`snapops.hooks.runner.run_range`, what ``snapops verify --ci --range`` runs).
2. Review: each run with a changed file under ``snapshots/<run>/`` or ``ledger/<run>.ledger``,
   its generation at the merge base of BASE and HEAD against its generation at HEAD
   (:func:`~snapops.hooks.review.generation.review_generations`: anomalies first).
3. Write ``DIR/comment.md`` and ``DIR/review.png`` atomically. The body is written whatever
   happens (a failed verification or review is said in it); the result says whether CI must
   fail.

Example::

    result = review_pull_request(".", "origin/main", "HEAD", "out", cfg=load_repo_config(git))
    result.ok, result.comment
    # -> (True, PosixPath('out/comment.md'))
"""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from snapops.formats.atomic import atomic_write_bytes
from snapops.formats.errors import ConfigError, SnapopsError, printable

from ._gen_render import headline, render_generation_markdown
from ._render import MD_LIMIT, md_cell, md_code

MARKER = "<!-- snapops-review -->"
VERIFY_LINES = 40            # verification output lines quoted in the comment


@dataclass
class PrResult:
    ok: bool                             # verification passed and every run was reviewed
    comment: Path
    image: Path | None
    runs: list[str] = field(default_factory=list)
    verified: bool = False
    problems: list[str] = field(default_factory=list)


def changed_runs(git, base: str, head: str) -> list[str]:
    """Runs with a file changed between ``base`` and ``head`` under ``snapshots/<run>/`` or
    ``ledger/<run>.ledger`` (byte-wise order)."""
    from snapops.formats.generation import valid_run
    from snapops.hooks.gitio import diff_trees

    runs = set()
    for change in diff_trees(git, base, head, "snapshots", "ledger"):
        parts = change.path.split("/")
        if parts[0] == "snapshots" and len(parts) >= 3:
            name = parts[1]
        elif parts[0] == "ledger" and len(parts) == 2 and parts[1].endswith(".ledger"):
            name = parts[1].removesuffix(".ledger")
        else:
            continue
        if valid_run(name):
            runs.add(name)
    return sorted(runs, key=lambda n: n.encode())


def verify_range(git, base: str, head: str, cfg) -> tuple[bool, list[str]]:
    """(passed, output lines) of the hooks' check of every commit of ``base..head``."""
    from snapops.hooks.runner import run_range

    out = io.StringIO()
    try:
        code = run_range(git, f"{base}..{head}", out, cfg=cfg)
    except SnapopsError as exc:
        return False, out.getvalue().splitlines() + [f"snapops ci: error: {exc}"]
    return code == 0, out.getvalue().splitlines()


def review_pull_request(repo: str | os.PathLike, base: str, head: str, out: str | os.PathLike,
                        *, cfg, thresholds=None, manifest_only: bool | str = False,
                        image_url: str | None = None, details_url: str | None = None,
                        threads: int = 2) -> PrResult:
    """Verify and review ``base..head`` of ``repo``; write ``out/comment.md`` and
    ``out/review.png`` (see module docstring)."""
    from snapops.hooks.gitio import Git

    from .generation import Thresholds, open_git_side, review_generations
    from ._plot import plot_generation

    git = Git(repo, max_paths=cfg.max_paths)
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create the output folder: {exc.strerror}") from None
    result = PrResult(False, folder / "comment.md", None)
    commits = [git.resolve(f"{rev}^{{commit}}") if not rev.startswith("-") else None
               for rev in (base, head)]
    if None in commits:
        bad = base if commits[0] is None else head
        result.problems.append(f"{bad} is not a commit here (fetch the whole history: "
                               "actions/checkout fetch-depth: 0, GitLab GIT_DEPTH: 0)")
        _write(result, [], [], image_url, details_url)
        return result
    base_c, head_c = commits
    result.verified, verify_lines = verify_range(git, base_c, head_c, cfg)
    if not result.verified:
        result.problems.append("verification failed")
    merge_base = git.text("merge-base", base_c, head_c, check=False) or base_c
    reviews = []
    if not result.verified:   # fail closed: weights that did not verify are not read
        manifest_only = "verification failed: the weights are not read"
    result.runs = changed_runs(git, merge_base, head_c)
    for run in result.runs:
        try:
            with open_git_side(git, merge_base, run, label=f"base {merge_base[:12]}",
                               max_blob=cfg.max_blob_size) as a, \
                    open_git_side(git, head_c, run, label=f"head {head_c[:12]}",
                                  max_blob=cfg.max_blob_size) as b:
                reviews.append(review_generations(a, b, thresholds=thresholds or Thresholds(),
                                                  manifest_only=manifest_only, threads=threads))
        except SnapopsError as exc:
            result.problems.append(f"run {run} could not be reviewed: {exc}")
    if reviews:
        result.image = folder / "review.png"
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".review-", suffix=".png",
                                         delete=False) as tmp:
            pass
        try:
            plot_generation(reviews, tmp.name)
            os.replace(tmp.name, result.image)
        finally:
            Path(tmp.name).unlink(missing_ok=True)
    result.ok = result.verified and not result.problems
    _write(result, verify_lines, reviews, image_url, details_url)
    return result


def _write(result: PrResult, verify_lines: list[str], reviews, image_url, details_url) -> None:
    atomic_write_bytes(result.comment,
                       comment_body(result, verify_lines, reviews, image_url,
                                    details_url).encode("utf-8"))


def comment_body(result: PrResult, verify_lines: list[str], reviews, image_url: str | None,
                 details_url: str | None) -> str:
    """The whole comment: marker, verdict, verification output, image, one report per run."""
    head = [MARKER, "## snapops review", ""]
    if result.verified:
        head.append("**Verification passed**: every commit's generations are sealed, signed "
                    "and chained as required (`snapops verify --ci --range`).")
    else:
        head.append("**Verification FAILED**: do not merge these generations as they are; "
                    + ("the verifier's output (`snapops verify --ci --range`) is below."
                       if verify_lines else "the range could not be verified:"))
    for problem in result.problems:
        if problem != "verification failed":
            head += ["", f"- {md_cell(problem)}"]
    if verify_lines:
        head += ["", *_fenced(verify_lines[-VERIFY_LINES:])]
    head.append("")
    if reviews:
        head.append("Changed runs: " + ", ".join(f"{md_code(r.run)} ({md_cell(headline(r))})"
                                                 for r in reviews))
        head.append("")
        if image_url:
            head += [f"![snapops review heatmap]({_url(image_url)})", ""]
        elif details_url:
            head += [f"Heatmap: `review.png` in the artifacts of [this CI run]"
                     f"({_url(details_url)}).", ""]
    elif result.verified:
        head += ["No generation changed in this range.", ""]
    if details_url and image_url:
        head += [f"[CI run]({_url(details_url)})", ""]
    text = "\n".join(head) + "\n"
    budget = (MD_LIMIT - len(text)) // max(len(reviews), 1)
    for review in reviews:
        text += "\n" + render_generation_markdown(review, heading="###", limit=budget)
    return text


def _fenced(lines: list[str]) -> list[str]:
    """``lines`` in a code block whose fence is longer than any backtick run inside (control
    characters escaped: the verifier quotes names from the pushed files)."""
    lines = [printable(line) for line in lines]
    longest = count = 0
    for line in lines:
        count = 0
        for ch in line:
            count = count + 1 if ch == "`" else 0
            longest = max(longest, count)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", *lines, fence]


def _url(url: str) -> str:
    """A URL safe inside Markdown link parentheses (no spaces, no parentheses, no newlines)."""
    return "".join(c if c.isprintable() and c not in " ()<>" else f"%{ord(c):02X}"
                   for c in url if ord(c) < 128)
