"""snapops diff / textconv / review pr refuse what they cannot carry out before doing any
work: numeric options out of range are argparse usage errors (exit 2, one error line), an
--output or --plot that would replace an input or lands in a missing folder is a one-line
error with nothing printed or written. Names from files never reach the terminal raw. Every
case runs the real ``snapops`` executable on real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import snapops

EVIL = "evil\x1b[2J\x1b]0;pwned\x07\nforged line"
EVIL_SHOWN = "evil\\x1b[2J\\x1b]0;pwned\\x07\\nforged line"     # as repr() escapes it


def snapops_cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapops", *argv], capture_output=True,
                          text=True, cwd=cwd)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("opts")
    a = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    b = {"w": a["w"] + np.float32(1)}
    snapops.save(a, folder / "g1.wtxt", gen=1)
    snapops.save(b, folder / "g2.wtxt", gen=2)
    return folder / "g1.wtxt", folder / "g2.wtxt"


def assert_usage_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, nothing on stdout, exactly one error line (argparse's usage lines before it)
    naming the option and what it takes, no traceback."""
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    errors = [x for x in done.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.parametrize("argv, needle", [
    (["--rows-per-block", "0"], "argument --rows-per-block: expected an integer in 1.."),
    (["--rows-per-block", "-1"], "argument --rows-per-block: expected an integer in 1.."),
    (["--threads", "0"], "argument --threads: expected an integer in 1..1024, got '0'"),
    (["--threads", "-3"], "argument --threads: expected an integer in 1..1024, got '-3'"),
    (["--threads", "100000"], "argument --threads: expected an integer in 1..1024"),
    (["--ratio-threshold", "-1"], "argument --ratio-threshold: expected a finite number > 1"),
    (["--ratio-threshold", "1"], "argument --ratio-threshold: expected a finite number > 1"),
    (["--cosine-threshold", "nan"],
     "argument --cosine-threshold: expected a finite number in -1..1, got 'nan'"),
    (["--cosine-threshold", "1.5"], "argument --cosine-threshold: expected a finite number"),
    (["--max-expansion", "inf"], "argument --max-expansion: expected a finite number >= 1"),
])
def test_diff_options_out_of_range_are_usage_errors_before_any_work(tmp_path, argv, needle):
    # the files do not exist: the option is refused before anything is opened
    done = snapops_cli("diff", str(tmp_path / "no1.wtxt"), str(tmp_path / "no2.wtxt"), *argv)
    assert_usage_error(done, needle)


def test_textconv_and_review_pr_refuse_out_of_range_options(tmp_path):
    assert_usage_error(snapops_cli("textconv", str(tmp_path / "none.wtxt"),
                                   "--rows-per-block", "0"),
                       "argument --rows-per-block: expected an integer in 1..")
    assert_usage_error(snapops_cli("review", "pr", "--base", "HEAD", "--out",
                                   str(tmp_path / "o"), "--threads", "0"),
                       "argument --threads: expected an integer in 1..1024")
    assert not (tmp_path / "o").exists()


def test_accepted_bounds_still_work(pair):
    a, b = pair
    done = snapops_cli("diff", str(a), str(b), "--threads", "1", "--rows-per-block", "1",
                       "--format", "json")
    assert done.returncode == 0, done.stderr
    (item,) = json.loads(done.stdout)["arrays"]
    assert item["blocks"] == 3 and item["blocks_changed"] == 3 and item["max_abs"] == 1.0


def assert_one_line_refusal(done: subprocess.CompletedProcess, needle: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""                       # no report printed before the refusal
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapops: error: "), done.stderr
    assert needle in lines[0], lines[0]


def test_output_never_replaces_an_input(pair):
    a, b = pair
    before = a.read_bytes(), b.read_bytes()
    assert_one_line_refusal(snapops_cli("diff", str(a), str(b), "--output", str(a)),
                            f"the report would replace the input {a}")
    assert_one_line_refusal(snapops_cli("diff", str(a), str(b), "-o", f"{b.parent}/./g2.wtxt"),
                            "the report would replace the input")
    assert_one_line_refusal(snapops_cli("diff", str(a), str(b), "--plot", str(b)),
                            f"the plot would replace the input {b}")
    assert (a.read_bytes(), b.read_bytes()) == before


def test_plot_and_output_in_a_missing_folder_are_refused_before_the_report(pair, tmp_path):
    a, b = pair
    missing = tmp_path / "nodir"
    assert_one_line_refusal(snapops_cli("diff", str(a), str(b), "--plot", str(missing / "x.png")),
                            f"the folder {missing} does not exist")
    assert_one_line_refusal(snapops_cli("diff", str(a), str(b), "-o", str(missing / "r.md")),
                            f"the folder {missing} does not exist")
    assert_one_line_refusal(snapops_cli("diff", str(a), str(b), "-o", str(tmp_path)),
                            "is a folder")
    report = tmp_path / "r.txt"
    assert_one_line_refusal(snapops_cli("diff", str(a), str(b), "-o", str(report),
                                        "--plot", str(report)),
                            "the plot would replace the input")
    assert not missing.exists() and not report.exists()


def test_output_dash_is_stdout(pair, tmp_path):
    a, b = pair
    done = snapops_cli("diff", str(a), str(b), "-o", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("snapops diff ") and not (tmp_path / "-").exists()


@pytest.fixture(scope="module")
def evil_pair(tmp_path_factory) -> tuple[Path, Path]:
    """Two FOLD files (FOLD keeps any name) with an array named with terminal escapes."""
    folder = tmp_path_factory.mktemp("evil")
    a = {EVIL: np.zeros(4, np.float32), "plain": np.ones(2, np.float32)}
    b = {EVIL: np.ones(4, np.float32), "plain": np.ones(2, np.float32)}
    snapops.save(a, folder / "a.fold")
    snapops.save(b, folder / "b.fold")
    return folder / "a.fold", folder / "b.fold"


@pytest.mark.parametrize("fmt", ["text", "md"])
def test_names_with_terminal_escapes_are_printed_escaped(evil_pair, fmt):
    a, b = evil_pair
    done = snapops_cli("diff", str(a), str(b), "--format", fmt)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "forged line" in done.stdout and "\nforged line" not in done.stdout
    assert EVIL_SHOWN in done.stdout


def test_verify_report_summary_escapes_names_as_the_diff_does(tmp_path):
    """formats/report.py: a Report's notes name arrays of the file; its summary escapes them."""
    import ml_dtypes

    path = tmp_path / "evil.npz"
    snapops.save({EVIL: np.ones(2, ml_dtypes.bfloat16)}, path)
    summary = snapops.verify(path).summary()
    assert summary.startswith(f"OK {path}: npz, 1 arrays")
    assert "\x1b" not in summary and "\x07" not in summary
    notes = [x for x in summary.splitlines() if EVIL_SHOWN in x]
    assert len(notes) == 1 and notes[0].startswith("  note: dtype of 1 array (")
