"""The repository stands alone: a fresh clone of HEAD in an empty folder, with no ``shared``
folder anywhere near it, refers to nothing outside itself, every relative link of its README and
of ``docs/`` resolves to a tracked file (and heading), and the WTXT vector tests pass there
reading the clone's own ``tests/vectors``.

The clone is made from the repository these tests run from, at its HEAD commit (whatever branch,
worktree or detached state that is); uncommitted changes are not part of it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = "shared"  # spelled apart so this file does not match what it searches for
OUTSIDE = rf"\.\./{SHARED}|{SHARED}/(specs|vectors)|/work/{SHARED}"
LINK = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
LINK_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _env() -> dict[str, str]:
    """The environment without GIT_* variables (a hook or CI may set GIT_DIR and friends)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    head = _git("rev-parse", "--verify", "HEAD", cwd=REPO)
    assert head.returncode == 0, f"tests must run from a git checkout: {head.stderr}"
    dest = tmp_path_factory.mktemp("standalone") / "snapops"
    made = _git("clone", "--quiet", "--no-checkout", str(REPO), str(dest), cwd=dest.parent)
    assert made.returncode == 0, made.stderr
    checkout = _git("-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach",
                    head.stdout.strip(), cwd=dest)
    assert checkout.returncode == 0, checkout.stderr
    return dest


@pytest.fixture(scope="module")
def tracked(clone) -> set[str]:
    return set(_git("ls-files", "-z", cwd=clone).stdout.split("\0")) - {""}


def test_clone_is_at_head_with_no_shared_folder_near_it(clone):
    head = _git("rev-parse", "HEAD", cwd=REPO).stdout
    assert _git("rev-parse", "HEAD", cwd=clone).stdout == head
    assert not _git("status", "--porcelain", cwd=clone).stdout
    near = [p / SHARED for p in (clone, *clone.parents) if (p / SHARED).exists()]
    assert near == []


def test_no_tracked_file_refers_outside_the_repository(clone):
    found = _git("grep", "-n", "-E", OUTSIDE, cwd=clone)
    assert found.returncode == 1 and found.stdout == "", found.stdout


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _link_problem(page: str, target: str, clone: Path, tracked: set[str]) -> str | None:
    path, _, fragment = target.partition("#")
    rel = os.path.normpath(PurePosixPath(page).parent / path) if path else page
    if rel.startswith("../") or rel == "..":
        return f"{page}: {target} leaves the repository"
    folder = rel.rstrip("/") + "/"
    if rel not in tracked and not any(t.startswith(folder) for t in tracked):
        return f"{page}: {target} is not a tracked file or folder"
    if fragment and rel.endswith(".md") and rel in tracked:
        text = FENCE.sub("", (clone / rel).read_text("utf-8"))
        slugs = {_slug(h) for h in HEADING.findall(text)}
        if fragment not in slugs:
            return f"{page}: {target} names no heading of {rel}"
    return None


def test_relative_links_in_readme_and_docs_resolve(clone, tracked):
    pages = sorted(p for p in tracked if p == "README.md"
                   or (p.startswith("docs/") and p.endswith(".md")))
    assert "docs/formats/README.md" in pages
    problems, checked = [], 0
    for page in pages:
        text = _prose((clone / page).read_text("utf-8"))
        for target in LINK.findall(text) + LINK_DEFINITION.findall(text):
            if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):   # https:, mailto:, ...
                continue
            checked += 1
            problem = _link_problem(page, target, clone, tracked)
            if problem:
                problems.append(problem)
    assert problems == []
    assert checked > 20


@pytest.mark.slow
def test_wtxt_vector_tests_pass_in_the_clone(clone):
    """Run with this interpreter from inside the clone: the tests read the clone's vectors (the
    reference regenerates them there and compares), and nothing outside the clone is needed."""
    assert (clone / "tests" / "vectors" / "wtxt" / "g1-sealed.wtxt").is_file()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/formats/test_wtxt_vectors.py", "tests/reference"],
        cwd=clone, env=_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", run.stdout) and "skipped" not in run.stdout
