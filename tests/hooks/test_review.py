"""Review tools in real git repositories: git diff of WTXT, textconv of binary formats,
snapops diff (text/md/json/png, --git). Expected numbers are computed here with numpy in
float64, independently of the review code; what changed in git diff is checked against line
numbers computed from the two files' text."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from snapops.cli import main as cli
from snapops.formats import wtxt
from snapops.hooks.review import (
    diff_paths, plot_report, render_markdown, render_text, setup_repo, textconv_lines,
)
from snapops.hooks.review._render import fmt_cos, fmt_num

TS = "2026-01-02T03:04:05Z"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "HOME": os.devnull}
ROWS_PER_CHUNK = 8
CHANGED_ROW = 13                     # in chunk 1 (rows 8..16)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True,
                          env={**os.environ, **GIT_ENV})
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def make_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / ".gitattributes").write_text(
        "*.wtxt text eol=lf diff=wtxt\n" + "".join(
            f"*{suffix} binary diff=snapops\n" for suffix, _ in BINARY.values()))
    setup_repo(path)
    return path


def states(seed: int = 0):
    rng = np.random.default_rng(seed)
    a = {"R": rng.standard_normal((64, 6)).astype(np.float32),
         "emb": rng.standard_normal((20, 8)).astype(np.float32),
         "step": np.array(7, dtype=np.int64)}
    b = {k: v.copy() for k, v in a.items()}
    b["R"][CHANGED_ROW] += np.float32(0.25) * rng.standard_normal(6).astype(np.float32)
    return a, b


def save_pair(folder: Path, a, b, **opts):
    first = wtxt.save(a, folder / "state.wtxt", gen=1, ts=TS, row_blocking=True,
                      rows_per_chunk=ROWS_PER_CHUNK, **opts)
    text1 = (folder / "state.wtxt").read_text()
    wtxt.save(b, folder / "state.wtxt", gen=2, ts=TS, row_blocking=True,
              rows_per_chunk=ROWS_PER_CHUNK, merkle_prev=first.merkle_this, **opts)
    return text1, (folder / "state.wtxt").read_text()


# --- what must change in the WTXT text, computed from the text and the arrays -------------------

def chunk_lines(text: str, name: str, ix: int) -> tuple[int, list[int]]:
    """1-based line number of chunk ``ix``'s ch line of array ``name`` and its body lines."""
    lines = text.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(f"arr name={name} "))
    ch = next(i for i in range(start, len(lines)) if lines[i].startswith(f"ch ix={ix:06d} "))
    n = int(lines[ch].rsplit("lines=", 1)[1])
    return ch + 1, list(range(ch + 2, ch + 2 + n))


def arr_line(text: str, name: str) -> int:
    return next(i for i, l in enumerate(text.split("\n"), 1)
                if l.startswith(f"arr name={name} "))


def changed_body_lines(old: np.ndarray, new: np.ndarray, body: list[int]) -> set[int]:
    """Body lines (57 raw bytes each) whose bytes differ between the chunks' raw bytes."""
    x, y = old.tobytes(), new.tobytes()
    return {line for k, line in enumerate(body) if x[57 * k:57 * k + 57] != y[57 * k:57 * k + 57]}


def diff_lines(patch: str) -> tuple[set[int], set[int], list[str]]:
    """Old and new line numbers touched by a -U0 patch, and its hunk headers' function text."""
    old, new, funcs = set(), set(), []
    for m in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$", patch, re.M):
        o, oc, n, nc = int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)
        old.update(range(o, o + oc))
        new.update(range(n, n + nc))
        funcs.append(m[5])
    return old, new, funcs


def expected_changed(t1: str, t2: str, a, b, names_rotating: list[str]):
    chunk = CHANGED_ROW // ROWS_PER_CHUNK
    rows = slice(chunk * ROWS_PER_CHUNK, (chunk + 1) * ROWS_PER_CHUNK)
    out = []
    for text in (t1, t2):
        ch, body = chunk_lines(text, "R", chunk)
        header = {2, 4} | {arr_line(text, n) for n in names_rotating}
        out.append(header | {ch} | changed_body_lines(a["R"][rows], b["R"][rows], body))
    return out


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "hmac"])
def test_git_diff_of_row_blocked_wtxt_shows_only_the_changed_chunk(tmp_path, keydir, keyed):
    repo = make_repo(tmp_path / "repo")
    a, b = states()
    opts = {"hmac_key": keydir / "hmac.key"} if keyed else {}
    first = wtxt.save(a, repo / "state.wtxt", gen=1, ts=TS, row_blocking=True,
                      rows_per_chunk=ROWS_PER_CHUNK, **opts)
    t1 = (repo / "state.wtxt").read_text()
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "gen 1")
    wtxt.save(b, repo / "state.wtxt", gen=2, ts=TS, row_blocking=True,
              rows_per_chunk=ROWS_PER_CHUNK, merkle_prev=first.merkle_this, **opts)
    t2 = (repo / "state.wtxt").read_text()
    git(repo, "commit", "-qam", "gen 2")

    patch = git(repo, "diff", "-U0", "HEAD~1", "HEAD", "--", "state.wtxt")
    old, new, funcs = diff_lines(patch)
    # keyed: every arr line's salt (and so hmac) is derived from the gen, so all rotate
    rotating = ["R", "emb", "step"] if keyed else ["R"]
    want_old, want_new = expected_changed(t1, t2, a, b, rotating)
    assert old == want_old
    assert new == want_new
    # the hunk inside the array names it (diff.wtxt.xfuncname)
    assert any(f.startswith("arr name=R ") for f in funcs), funcs
    removed = [l[1:] for l in patch.splitlines() if l.startswith("-") and not l.startswith("---")]
    assert removed[0].startswith("meta ") and "gen=000001" in removed[0]
    assert removed[1].startswith("root ")
    assert not any(l.startswith("cap ") for l in removed)


def test_textconv_of_wtxt_matches_chunks_and_numpy(tmp_path):
    a, _ = states()
    wtxt.save(a, tmp_path / "s.wtxt", gen=1, ts=TS, row_blocking=True,
              rows_per_chunk=ROWS_PER_CHUNK)
    lines = list(textconv_lines(tmp_path / "s.wtxt"))
    text = (tmp_path / "s.wtxt").read_text()
    assert lines[0] == "snapops-textconv 2 format=wtxt"
    assert lines[1:4] == text.split("\n")[1:4]          # meta, cap, root as in the file
    shas = re.findall(r"^ch ix=\d+ off=\d+ len=\d+ sha256=([0-9a-f]{64})", text, re.M)
    blocks = [l for l in lines if l.startswith("  R[")]
    assert len(blocks) == 64 // ROWS_PER_CHUNK
    for k, line in enumerate(blocks):
        rows = a["R"][k * 8:(k + 1) * 8].astype(np.float64)
        assert line.startswith(f"  R[{k * 8}:{k * 8 + 8}] sha256={shas[k][:16]} ")
        got = dict(kv.split("=") for kv in line.split()[2:])
        assert float(got["min"]) == pytest.approx(rows.min(), rel=1e-6)
        assert float(got["max"]) == pytest.approx(rows.max(), rel=1e-6)
        assert float(got["mean"]) == pytest.approx(rows.mean(), rel=1e-6, abs=1e-7)
    assert lines[-1] == "end"
    assert list(textconv_lines(tmp_path / "s.wtxt")) == lines      # deterministic


def _binary_savers():
    """Every registered single-file binary format: name -> (suffix, save(dict, path))."""
    from snapops.formats.registry import all_handlers

    return {h.name: (h.suffixes[0], h.save) for h in all_handlers()
            if not (h.capabilities.streams_text or h.capabilities.multi_file)}


BINARY = _binary_savers()


@pytest.mark.parametrize("fmt", sorted(BINARY))
def test_git_diff_of_binary_format_through_textconv(tmp_path, fmt):
    repo = make_repo(tmp_path / "repo")
    rng = np.random.default_rng(5)
    a = {"R": rng.standard_normal((4096, 8)).astype(np.float32),     # 32 B rows: 1024 per block
         "b": rng.standard_normal(100).astype(np.float32)}
    b = {k: v.copy() for k, v in a.items()}
    b["R"][1500, 3] = 42.0
    suffix, save = BINARY[fmt]
    path = repo / f"state{suffix}"
    save(a, path)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    save(b, path)
    git(repo, "commit", "-qam", "two")

    patch = git(repo, "diff", "-U0", "HEAD~1", "HEAD")
    changed = [l for l in patch.splitlines()
               if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    body = [l for l in changed if not l[1:].startswith("meta ")]
    assert sorted(l[:16] for l in body) == sorted(
        ["-  R[1024:2048] ", "+  R[1024:2048] ", "-endarr R sha256", "+endarr R sha256"])
    new_line = next(l for l in body if l.startswith("+  R["))
    assert "max=42" in new_line
    # the same content renders the same array lines in every format (digests of raw rows)
    reference = [l for l in textconv_lines(_npz(tmp_path, b)) if l.startswith(("arr", " ", "end"))]
    assert [l for l in textconv_lines(path) if l.startswith(("arr", " ", "end"))] == reference


def _npz(tmp_path: Path, arrays) -> Path:
    path = tmp_path / "ref.npz"
    np.savez(path, **arrays)
    return path


# --- snapops diff ----------------------------------------------------------------------------

def expected_numbers(x: np.ndarray, y: np.ndarray) -> dict:
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    d = y - x
    return {"max_abs": np.abs(d).max(), "rel_l2": np.linalg.norm(d) / np.linalg.norm(x),
            "cosine": x @ y / (np.linalg.norm(x) * np.linalg.norm(y)),
            "elements": int((x != y).sum())}


def test_diff_numbers_match_numpy(tmp_path):
    a, b = states()
    b["emb"] = b["emb"] + np.float32(1e-4) * np.arange(160, dtype=np.float32).reshape(20, 8)
    save_pair(tmp_path, a, b)
    wtxt.save(a, tmp_path / "a.wtxt", gen=1, ts=TS, row_blocking=True,
              rows_per_chunk=ROWS_PER_CHUNK)
    report = diff_paths(tmp_path / "a.wtxt", tmp_path / "state.wtxt")
    by = {i.name: i for i in report.arrays}
    assert by["step"].status == "unchanged"
    for name in ("R", "emb"):
        want = expected_numbers(a[name], b[name])
        got = by[name]
        assert got.status == "changed"
        assert got.max_abs == pytest.approx(want["max_abs"], rel=1e-6)
        assert got.rel_l2 == pytest.approx(want["rel_l2"], rel=1e-5)
        assert got.cosine == pytest.approx(want["cosine"], abs=1e-9)
        assert got.elements_changed == want["elements"]
    assert [c.index for c in by["R"].changes] == [CHANGED_ROW // ROWS_PER_CHUNK]
    change = by["R"].changes[0]
    rows = slice(8, 16)
    block = expected_numbers(a["R"][rows], b["R"][rows])
    assert (change.kind, change.start, change.stop) == ("rows", 8, 16)
    assert change.rel == pytest.approx(block["rel_l2"], rel=1e-5)
    # the generic path (npz, blocks of decoded rows) gives the same numbers
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **b)
    generic = {i.name: i for i in diff_paths(tmp_path / "a.npz", tmp_path / "b.npz",
                                            rows_per_block=ROWS_PER_CHUNK).arrays}
    for name in ("R", "emb"):
        assert generic[name].rel_l2 == pytest.approx(by[name].rel_l2, rel=1e-6)
        assert [c.index for c in generic[name].changes] == [c.index for c in by[name].changes]


def test_markdown_report_for_a_known_change(tmp_path):
    a, b = states()
    b["new"] = np.ones(3, np.float32)
    del b["step"]
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **b)
    report = diff_paths(tmp_path / "a.npz", tmp_path / "b.npz", rows_per_block=ROWS_PER_CHUNK)
    md = render_markdown(report, title="weights gen 1 -> 2")
    want = expected_numbers(a["R"], b["R"])
    row = next(l for l in md.splitlines() if l.startswith("| ~ | `R` |"))
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
    assert cells == ["~", "`R`", "f32", "64x6", "1 / 8", f"{want['elements']} / 384",
                     fmt_num(want["max_abs"]), fmt_num(want["rel_l2"]), fmt_cos(want["cosine"])]
    assert "| + | `new` | f32 | 3 | *added* |" in md
    assert "| &minus; | `step` | i64 | scalar | *removed* |" in md
    block = expected_numbers(a["R"][8:16], b["R"][8:16])
    assert f"| 1 | rows 8:16 | {block['elements']} | {fmt_num(block['max_abs'])} | " \
           f"{fmt_num(block['rel_l2'])} |" in md
    assert "<summary>Unchanged arrays (1)</summary>" in md and "`emb`" in md
    # GitHub rendering: balanced details, blank line after each summary, every table row
    # with the column count of its header
    assert md.count("<details>") == md.count("</details>")
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("<details>"):
            assert lines[i + 1] == ""
    _check_tables(lines)


def _check_tables(lines: list[str]) -> None:
    width = None
    for line in lines:
        if line.startswith("|"):
            n = len(re.findall(r"(?<!\\)\|", line))
            width = width or n
            assert n == width, line
        else:
            width = None


def test_png_heatmap_for_a_known_change(tmp_path):
    a, b = states()
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **b)
    report = diff_paths(tmp_path / "a.npz", tmp_path / "b.npz", rows_per_block=ROWS_PER_CHUNK)
    info = plot_report(report, tmp_path / "diff.png")
    data = (tmp_path / "diff.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 800 <= width <= 2000 and 200 <= height <= 2000
    assert 5_000 < len(data) < 1_000_000
    assert info["arrays"] == 3
    # the changed block is drawn in colour, in the row of R, at 1/8..2/8 of the width
    import matplotlib.image

    pixels = matplotlib.image.imread(tmp_path / "diff.png")[:, :, :3]
    saturated = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.3
    ys, xs = np.nonzero(saturated[:, : int(width * 0.75)])        # left of bar and legend
    assert ys.size > 50
    assert xs.max() - xs.min() < width * 0.15                     # one narrow block


def test_cli_diff_formats_and_exit_codes(tmp_path, capsys):
    a, b = states()
    save_pair(tmp_path, a, b)
    wtxt.save(a, tmp_path / "a.wtxt", gen=1, ts=TS, row_blocking=True,
              rows_per_chunk=ROWS_PER_CHUNK)
    A, B = str(tmp_path / "a.wtxt"), str(tmp_path / "state.wtxt")
    assert cli(["diff", A, B]) == 0
    out = capsys.readouterr().out
    assert "~ R  f32 [64x6]  changed  blocks 1/8" in out and "changed rows 8:16" in out
    assert out.splitlines()[-1].startswith("summary: 3 arrays: 1 changed, 0 added")
    assert cli(["diff", A, B, "--format", "json", "--exit-code"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["counts"]["blocks_changed"] == 1
    assert cli(["diff", A, A, "--exit-code"]) == 0
    capsys.readouterr()
    assert cli(["diff", A]) == 2
    assert cli(["diff", A, B, "--format", "md", "-o", str(tmp_path / "c.md"),
                "--plot", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.md").read_text().startswith("### snapops diff")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match=r"^0$"):
        cli(["diff", "--help"])
    assert "example:" in capsys.readouterr().out


def test_cli_diff_git_between_commits(tmp_path, monkeypatch, capsys):
    repo = make_repo(tmp_path / "repo")
    a, b = states()
    (repo / "sub").mkdir()
    first = wtxt.save(a, repo / "sub" / "state.wtxt", gen=1, ts=TS, row_blocking=True,
                      rows_per_chunk=ROWS_PER_CHUNK)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    b["extra"] = np.zeros(4, np.float32)
    wtxt.save(b, repo / "sub" / "state.wtxt", gen=2, ts=TS, row_blocking=True,
              rows_per_chunk=ROWS_PER_CHUNK, merkle_prev=first.merkle_this)
    git(repo, "commit", "-qam", "two")
    monkeypatch.chdir(repo / "sub")                      # PATH is relative to the cwd
    assert cli(["diff", "--git", "HEAD~1", "HEAD", "state.wtxt", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    arrays = {x["name"]: x for x in doc["arrays"]}
    assert arrays["R"]["status"] == "changed" and arrays["extra"]["status"] == "added"
    assert [c["index"] for c in arrays["R"]["changes"]] == [1]
    assert {m["key"] for m in doc["meta_changes"]} >= {"gen", "merkle_this", "sha256_all"}
    assert doc["a"] == "HEAD~1:state.wtxt"
    # a path that did not exist at the first revision: every array added
    assert cli(["diff", "--git", "HEAD~1", "HEAD", "../.gitattributes"]) == 2   # not a snapshot
    capsys.readouterr()
    git(repo, "mv", "sub/state.wtxt", "sub/moved.wtxt")
    git(repo, "commit", "-qm", "three")
    assert cli(["diff", "--git", "HEAD~1", "HEAD", "moved.wtxt", "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["added"] == 4 and counts["changed"] == 0
    assert cli(["diff", "--git", "nope", "HEAD", "moved.wtxt"]) == 2
    assert "unknown revision" in capsys.readouterr().err


def test_shape_and_dtype_changes(tmp_path):
    rng = np.random.default_rng(2)
    emb = rng.standard_normal((100, 4)).astype(np.float32)
    a = {"emb": emb, "w": np.arange(12, dtype=np.float32).reshape(3, 4),
         "m": np.ones((2, 2), np.float32)}
    b = {"emb": np.vstack([emb, np.ones((28, 4), np.float32)]),
         "w": np.arange(12, dtype=np.float64).reshape(3, 4), "m": np.ones((4,), np.float32)}
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **b)
    by = {i.name: i for i in diff_paths(tmp_path / "a.npz", tmp_path / "b.npz").arrays}
    assert by["emb"].status == "changed" and by["emb"].shape_changed
    assert by["emb"].blocks_changed == 0 and "28 rows added" in by["emb"].notes[0]
    assert by["w"].dtype_changed and by["w"].max_abs == 0 and by["w"].blocks_changed == 0
    assert by["m"].status == "changed" and by["m"].rel_l2 is None
    text = render_text(diff_paths(tmp_path / "a.npz", tmp_path / "b.npz"))
    assert "f32 [100x4] -> f32 [128x4]" in text
    assert "f32 [3x4] -> f64 [3x4]" in text


def test_review_setup_configures_drivers(tmp_path, capsys):
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    assert cli(["review", "setup", str(repo), "--attributes"]) == 0
    assert git(repo, "config", "--get", "diff.wtxt.xfuncname").strip() == "^arr name=.*$"
    assert "textconv" in git(repo, "config", "--get", "diff.snapops.textconv")
    attrs = (repo / ".gitattributes").read_text()
    assert "*.aero       binary diff=snapops" in attrs and "*.wtxt" in attrs
    assert cli(["review", "setup", str(repo), "--attributes"]) == 0     # idempotent
    assert (repo / ".gitattributes").read_text() == attrs


@pytest.mark.parametrize("plant", ["symlink", "fifo", "latin1"])
def test_review_setup_never_writes_through_a_planted_gitattributes(tmp_path, capsys, plant):
    """A cloned tree may hold a .gitattributes that is a symlink to any file (it was appended
    to), a FIFO (setup hung) or not UTF-8 (a traceback): each is one line, nothing written."""
    import os

    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    outside = tmp_path / "bashrc"
    outside.write_text("export A=1\n")
    attributes = repo / ".gitattributes"
    if plant == "symlink":
        attributes.symlink_to(outside)
    elif plant == "fifo":
        os.mkfifo(attributes)
    else:
        attributes.write_bytes("*.bin caf\xe9\n".encode("latin-1"))
    capsys.readouterr()
    assert cli(["review", "setup", str(repo), "--attributes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".gitattributes" in err, err
    assert outside.read_text() == "export A=1\n"
    assert plant != "latin1" or attributes.read_bytes() == "*.bin caf\xe9\n".encode("latin-1")


def test_textconv_cli_is_what_git_runs(tmp_path):
    """The configured command itself (a separate process, as git runs it)."""
    a, _ = states()
    np.savez(tmp_path / "s.npz", **a)
    done = subprocess.run([sys.executable, "-m", "snapops", "textconv", str(tmp_path / "s.npz")],
                          capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == list(textconv_lines(tmp_path / "s.npz"))
    assert str(tmp_path) not in done.stdout                  # no path: git passes temp files


def test_malformed_wtxt_is_a_typed_error_naming_the_chunk(tmp_path, capsys):
    a, b = states()
    save_pair(tmp_path, a, b)
    wtxt.save(a, tmp_path / "a.wtxt", gen=1, ts=TS, row_blocking=True,
              rows_per_chunk=ROWS_PER_CHUNK)
    lines = (tmp_path / "state.wtxt").read_text().split("\n")
    ch = next(i for i, l in enumerate(lines) if l.startswith("ch ix=000001 "))
    lines[ch + 1] = "!" + lines[ch + 1][1:]
    (tmp_path / "bad.wtxt").write_text("\n".join(lines))
    assert cli(["diff", str(tmp_path / "a.wtxt"), str(tmp_path / "bad.wtxt")]) == 2
    assert "array R, chunk 1:" in capsys.readouterr().err
    assert cli(["textconv", str(tmp_path / "bad.wtxt")]) == 2
    assert "array R, chunk 1:" in capsys.readouterr().err
