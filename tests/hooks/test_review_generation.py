"""One review per generation, in a real repository whose generations are written, sealed and
committed as the daemon does it (``write_generation`` + ledger, ``git commit``, tags): anomalies
first, the statistics-only summary equal to the full one, the pull-request comment script on
the real repository, the fixed colour scale, hostile statistics. Expected numbers come from
numpy on the arrays written, independently of the review code."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from snapops.cli import main as cli
from snapops.formats.generation.manifest import parse_manifest
from snapops.hooks.review import render_generation_markdown, review_git, review_paths
from snapops.hooks.review._gen_render import summary_table_md, summary_table_text
from snapops.hooks.review._plot import (
    LOG_MAX, LOG_MIN, NONFINITE, NONFINITE_COLOUR, colour_scale, generation_strip, scale_cells,
    wrap_name,
)
from snapops.hooks.review.pr import MARKER

from .genrepo import MANIFEST, GenRepo, sealed_work_repo, tag

NAN_AT, INF_AT = ("blocks.0.attn.weight", (3, 4)), ("blocks.1.mlp.weight", (40, 2))
SCALED = "head.weight"
FLIPPED = "blocks.0.mlp.weight"
LONG = "model.decoder.layers.11.self_attention.linear_qkv.layer_norm_weight.extra_long_suffix"


def gen1() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"blocks.0.attn.weight": rng.standard_normal((32, 16)).astype(np.float32),
            "blocks.0.mlp.weight": rng.standard_normal((32, 16)).astype(np.float32),
            "blocks.1.attn.weight": rng.standard_normal((32, 16)).astype(np.float32),
            "blocks.1.mlp.weight": rng.standard_normal((64, 16)).astype(np.float32),
            SCALED: rng.standard_normal((16, 16)).astype(np.float32),
            LONG: rng.standard_normal(8).astype(np.float32),
            "lnf.weight": np.ones(16, np.float32),
            "step": np.array(1, np.int64)}


def gen2() -> dict[str, np.ndarray]:
    """A training-like step everywhere (cosine ~1), the three injected faults, and one tensor
    whose sign flipped (its norm did not change)."""
    rng = np.random.default_rng(8)
    out = {}
    for name, a in gen1().items():
        if a.dtype.kind == "f":
            a = a + np.float32(1e-3) * rng.standard_normal(a.shape).astype(np.float32)
        out[name] = a
    out[SCALED] = gen1()[SCALED] * np.float32(50)
    out[FLIPPED] = -out[FLIPPED]                   # same norm: only the cosine shows it
    out[NAN_AT[0]][NAN_AT[1]] = np.nan
    out[INF_AT[0]][INF_AT[1]] = np.inf
    out["step"] = np.array(2, np.int64)
    return out


def gen3() -> dict[str, np.ndarray]:
    """One tensor removed, one added, one dtype change."""
    out = dict(gen1())
    del out["blocks.1.attn.weight"]
    out["blocks.2.attn.weight"] = np.zeros((8, 4), np.float32)
    out["lnf.weight"] = np.ones(16, np.float16)
    out["step"] = np.array(3, np.int64)
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory, keydir) -> GenRepo:
    """Three generations on main; multi-part arrays (shard_max 1 KiB splits them by rows)."""
    return sealed_work_repo(tmp_path_factory.mktemp("genreview"), keydir,
                            [gen1(), gen2(), gen3()])


class Done:
    """An in-process ``snapops`` run (a fresh process per call costs seconds on a busy
    machine; the CI test below runs the real executable)."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def snapops_in(where: Path, capsys, monkeypatch, *args: str) -> Done:
    monkeypatch.chdir(where)
    capsys.readouterr()
    code = cli(list(args))
    captured = capsys.readouterr()
    return Done(code, captured.out, captured.err)


def review(repo: GenRepo, a: int, b: int, **options):
    return review_git(tag(a), tag(b), "run1", repo=repo.path, **options)


def test_injected_faults_are_listed_first_under_anomalies(repo):
    full = review(repo, 1, 2)
    assert full.mode == "weights" and full.notes == []
    got = [(x.kind, x.name) for x in full.anomalies]
    assert got == [("nan", NAN_AT[0]), ("inf", INF_AT[0]), ("norm", SCALED),
                   ("cosine", FLIPPED)], got
    assert full.detail_of(FLIPPED).cosine == pytest.approx(-1.0, abs=1e-5)
    # the numbers, from numpy on what was written
    rows = {r.name: r for r in full.rows}
    a, b = gen1()[SCALED].astype(np.float64), gen2()[SCALED].astype(np.float64)
    assert rows[SCALED].ratio == pytest.approx(np.linalg.norm(b) / np.linalg.norm(a), rel=1e-7)
    assert rows[SCALED].norm_a == pytest.approx(np.linalg.norm(a), rel=1e-8)
    assert rows[NAN_AT[0]].counts("nan") == (0, 1) and rows[INF_AT[0]].counts("inf") == (0, 1)
    assert full.rows[0].name == SCALED          # sorted by relative change, largest first
    rel = [r.rel_change for r in full.rows if r.rel_change is not None]
    assert rel == sorted(rel, reverse=True)
    # block-level detail: the multi-part array is joined, the x50 layer has rel. L2 49, cos 1
    head = full.detail_of(SCALED)
    assert head.rel_l2 == pytest.approx(49.0, rel=1e-6) and head.cosine == pytest.approx(1.0)
    assert full.detail_of(INF_AT[0]).shape_a == (64, 16)
    md = render_generation_markdown(full)
    anomalies = md.index("#### Anomalies (4)")
    assert anomalies < md.index("#### Tensors") < md.index("#### Weights")
    lines = [l for l in md[anomalies:].splitlines() if l.startswith("| ")][1:5]
    assert [l.split("|")[1].strip() for l in lines] == ["NaN", "Inf", "norm ratio", "cosine"]
    assert f"`{LONG}`" in md                      # original dotted names, in full


def test_manifest_only_summary_equals_the_full_summary(repo, tmp_path):
    full = review(repo, 1, 2)
    only = review(repo, 1, 2, manifest_only=True)
    assert only.mode == "manifest" and only.detail is None
    bounded = review(repo, 1, 2, max_weight_bytes=1000)     # held in memory: bounded
    assert bounded.mode == "manifest" and "more than the 1000" in bounded.notes[0]
    assert summary_table_md(bounded) == summary_table_md(full)
    assert summary_table_md(only) == summary_table_md(full)
    assert summary_table_text(only) == summary_table_text(full)

    def section(md: str) -> str:
        return md[md.index("#### Tensors"):].split("\n\n<")[0].split("\n\n###")[0]
    assert section(render_generation_markdown(only)) == section(render_generation_markdown(full))
    # the statistics cannot see a cosine: every other anomaly is the same
    assert [(x.kind, x.name) for x in only.anomalies] == \
        [(x.kind, x.name) for x in full.anomalies if x.kind != "cosine"]
    # shards absent (two MANIFESTs copied out of the commits): statistics only, by itself
    for gen in (1, 2):
        folder = tmp_path / f"g{gen}" / "snapshots" / "run1"
        folder.mkdir(parents=True)
        (folder / "MANIFEST").write_bytes(
            repo.git("show", f"{tag(gen)}:{MANIFEST}", input=b"").stdout)
    auto = review_paths(tmp_path / "g1/snapshots/run1", tmp_path / "g2/snapshots/run1")
    assert auto.mode == "manifest" and "is not in the tree" in auto.notes[0]
    assert summary_table_md(auto) == summary_table_md(full)
    # a shard that is an LFS pointer in the work tree: statistics only, by itself
    lfs = tmp_path / "lfs"
    repo.git("worktree", "add", "-q", "--detach", str(lfs), tag(2))
    shard = sorted((lfs / "snapshots/run1/shards").iterdir())[0]
    shard.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{'0' * 64}\n"
                     "size 4096\n")
    pointer = review_git(tag(1), "HEAD", "run1", repo=repo.path)
    assert pointer.mode == "weights"                   # the commit has the real shards
    auto = review_paths(repo.path / "snapshots/run1", lfs / "snapshots/run1")
    assert auto.mode == "manifest" and "an LFS pointer?" in auto.notes[0], auto.notes
    assert summary_table_md(auto) == summary_table_md(review(repo, 3, 2))
    repo.git("worktree", "remove", "--force", str(lfs))


def test_added_removed_and_dtype_change_are_listed(repo):
    r = review(repo, 2, 3)
    kinds = {(x.kind, x.name) for x in r.anomalies}
    assert {("dtype", "lnf.weight"), ("added", "blocks.2.attn.weight"),
            ("removed", "blocks.1.attn.weight")} <= kinds
    assert ("nan", NAN_AT[0]) in kinds               # 1 -> 0 is a change too
    order = [x.kind for x in r.anomalies]
    assert order.index("dtype") < order.index("added") < order.index("removed")
    text = "".join(render_generation_markdown(r))
    assert "| f32 &rarr; f16 |" in text and "| dtype f32 &rarr; f16 |" in text


def test_cli_diff_of_a_generation_and_of_two_tags(repo, tmp_path, capsys, monkeypatch):
    out = snapops_in(repo.path, capsys, monkeypatch, "diff", "--git", tag(1), tag(2), "snapshots/run1", "--format", "json",
                       "--plot", str(tmp_path / "r.png"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [x["kind"] for x in report["anomalies"]] == ["nan", "inf", "norm", "cosine"]
    assert report["mode"] == "weights" and report["gen_a"] == 1 and report["gen_b"] == 2
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    tags = snapops_in(repo.path, capsys, monkeypatch, "diff", tag(1), tag(2), "--manifest-only")
    assert tags.returncode == 0, tags.stderr
    lines = tags.stdout.splitlines()
    assert lines[lines.index("anomalies (3):") + 1].startswith(f"  ! NaN        {NAN_AT[0]}")
    assert "MANIFEST statistics only (no weights read)" in tags.stdout


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_pr_comment_script_on_the_real_repository(repo, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    done = snapops_in(repo.path, capsys, monkeypatch, "review", "pr", "--base", tag(1), "--head", tag(2), "--out", str(out),
                        "--details-url", "https://ci.example/run/1")
    assert done.returncode == 0, done.stderr
    body = (out / "comment.md").read_text()
    assert body.startswith(MARKER + "\n")
    assert "**Verification passed**" in body and "1 generation/ledger check(s) passed" in body \
        or "generation/ledger check(s) passed" in body
    anomalies = body.index("Anomalies (4)")
    for name in (NAN_AT[0], INF_AT[0], SCALED):
        assert body.index(f"`{name}`", anomalies) < body.index("Tensors, by relative", anomalies)
    assert "(https://ci.example/run/1)" in body
    width, height = png_size(out / "review.png")
    assert width >= 800 and height >= 200 and (out / "review.png").stat().st_size > 5000
    assert sorted(p.name for p in out.iterdir()) == ["comment.md", "review.png"]
    same = snapops_in(repo.path, capsys, monkeypatch, "review", "pr", "--base", tag(2), "--head", tag(2), "--out",
                        str(tmp_path / "same"))
    assert same.returncode == 0, same.stderr
    assert "No generation changed" in (tmp_path / "same" / "comment.md").read_text()
    assert not (tmp_path / "same" / "review.png").exists()


def test_pr_comment_script_fails_closed_and_says_why(repo, tmp_path, capsys, monkeypatch):
    work = tmp_path / "clone"
    repo.git("clone", "-q", str(repo.path), str(work))
    clone = GenRepo(work, repo.env, repo.keys)
    for key in ("snapops.trustedKeys", "snapops.requireSignature"):
        clone.git("config", key, repo.out("config", key))
    shard = next((work / "snapshots/run1/shards").iterdir())
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    clone.commit("tampered shard")
    out = tmp_path / "out"
    done = snapops_in(work, capsys, monkeypatch, "review", "pr", "--base", tag(3), "--head",
                      "HEAD", "--out", str(out))
    assert done.returncode == 1
    body = (out / "comment.md").read_text()
    assert body.startswith(MARKER) and "**Verification FAILED**" in body
    assert re.search(r"\[digest\]|\[size\]", body), body
    assert "verification failed: the weights are not read" in body   # fail closed
    bad = snapops_in(work, capsys, monkeypatch, "review", "pr", "--base", "nonexistent",
                     "--out", str(tmp_path / "o2"))
    assert bad.returncode == 1 and "is not a commit here" in \
        (tmp_path / "o2" / "comment.md").read_text()


def test_colour_scale_is_fixed_and_non_finite_has_its_own_colour(repo):
    from matplotlib import colors

    cells = scale_cells(np.array([0.0, 1e-12, 1e-3, 1.0, 50.0, np.inf, np.nan]))
    assert np.isnan(cells[0])                                      # unchanged: grey
    assert cells[1:6].tolist() == [LOG_MIN, -3.0, LOG_MAX, LOG_MAX, LOG_MAX]
    assert cells[6] == NONFINITE
    cmap, norm = colour_scale()
    assert (norm.vmin, norm.vmax) == (LOG_MIN, LOG_MAX)              # whatever the data
    assert colors.to_hex(cmap(norm(NONFINITE))) == NONFINITE_COLOUR
    assert colors.to_hex(cmap(norm(LOG_MAX))) != NONFINITE_COLOUR
    r = review(repo, 1, 2, manifest_only=True)
    rows = {row.name: row for row in r.rows}
    assert np.isnan(generation_strip(r, rows[NAN_AT[0]], 1)).all()
    assert scale_cells(generation_strip(r, rows[SCALED], 1)).tolist() == [LOG_MAX]
    full = review(repo, 1, 2)
    strip = generation_strip(full, {x.name: x for x in full.rows}[INF_AT[0]], 512)
    assert full.detail_of(INF_AT[0]).blocks == 1 and np.isnan(strip).all()
    assert "".join(wrap_name(LONG, 30).split("\n")) == LONG
    assert max(len(line) for line in wrap_name(LONG, 30).split("\n")) <= 30


def test_bad_statistics_are_one_line_errors(repo, tmp_path, capsys, monkeypatch):
    text = repo.git("show", f"{tag(1)}:{MANIFEST}", input=b"").stdout.decode()
    folders = []
    for label, edit in (("negative", lambda t: re.sub(r"norm=[0-9.e+-]+", "norm=-1", t,
                                                      count=1)),
                        ("garbage", lambda t: re.sub(r" nan=0 ", " nan=x ", t, count=1)),
                        ("minmax", lambda t: re.sub(r"min=([0-9.e+-]+) max=([0-9.e+-]+)",
                                                    r"min=9 max=1", t, count=1))):
        folder = tmp_path / label / "snapshots" / "run1"
        folder.mkdir(parents=True)
        (folder / "MANIFEST").write_text(edit(text))
        folders.append(folder)
    ok = tmp_path / "ok" / "snapshots" / "run1"
    ok.mkdir(parents=True)
    (ok / "MANIFEST").write_text(text)
    parse_manifest(text.encode())
    for folder in folders:
        done = snapops_in(tmp_path, capsys, monkeypatch, "diff", str(ok / "MANIFEST"),
                          str(folder / "MANIFEST"))
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert re.search(r"MANIFEST:\d+: \[(stats|grammar)\]", done.stderr), done.stderr
    shutil.rmtree(tmp_path / "ok")


def test_ci_review_step_runs_as_written(repo, tmp_path):
    """The GitHub Actions review step's shell, run here on the real repository; both CI
    examples post the body whose marker the script writes."""
    import yaml

    root = Path(__file__).resolve().parents[2] / "deploy" / "ci"
    workflow = yaml.safe_load((root / "github-actions.yml").read_text())
    step = next(s for s in workflow["jobs"]["review"]["steps"] if s.get("id") == "review")
    outputs = tmp_path / "github_output"
    env = repo.env | {"BASE": repo.out("rev-parse", tag(1)), "HEAD": repo.out("rev-parse",
                      tag(2)), "RUN_URL": "https://ci.example/run/7",
                      "GITHUB_OUTPUT": str(outputs)}
    work = tmp_path / "checkout"
    repo.git("clone", "-q", str(repo.path), str(work))
    for key in ("snapops.trustedKeys", "snapops.requireSignature"):
        subprocess.run(["git", "config", key, repo.out("config", key)], cwd=work, env=env,
                       check=True)
    done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=work, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert outputs.read_text().split() == ["rc=0", "post=true"]
    body = (work / "snapops-review" / "comment.md").read_text()
    assert body.startswith(MARKER) and "(https://ci.example/run/7)" in body
    assert png_size(work / "snapops-review" / "review.png")[0] > 0
    post = next(s for s in workflow["jobs"]["review"]["steps"] if "github-script" in
                s.get("uses", ""))
    assert f"'{MARKER}'" in post["with"]["script"] and "updateComment" in post["with"]["script"]
    gitlab = yaml.safe_load((root / "gitlab-ci.yml").read_text())["snapops-review"]
    script = "\n".join(gitlab["script"])
    assert "snapops review pr" in script and f'"{MARKER}"' in script
