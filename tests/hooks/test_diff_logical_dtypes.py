"""snapops diff and textconv see what ``snapops.load`` sees: original (dotted) names and
logical dtypes in every format, WTXT's ``layer__0__weight`` stored as ``u16`` included.

The state is built with torch (bf16, f16, f32, bool, i64, a dotted name), written with
``snapops.save`` to WTXT, FOLD, AERO, FINF and PyCauset, and reviewed by running the real
``snapops`` executable. Expected names, dtype spellings, changes and minima/maxima come from
torch on the state itself, not from the review code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import snapops

torch = pytest.importorskip("torch")

FORMATS = ("wtxt", "fold", "aero", "finf", "pycauset")
CHANGED = "layer.0.weight"
AT = (2, 3)                               # the one element changed between A and B
STEP = 0.5
ROWS_PER_BLOCK = 4                        # one block layout for every format in textconv
# how reports spell torch's dtypes (README: "Dtypes, spelled one way")
SPELLED = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32",
           torch.bool: "bool", torch.int64: "i64"}


def state_a() -> dict[str, "torch.Tensor"]:
    gen = torch.Generator().manual_seed(3)
    return {CHANGED: torch.randn(8, 6, generator=gen).to(torch.bfloat16),
            "blocks.1.norm": torch.randn(5, 3, generator=gen).to(torch.float16),
            "head": torch.randn(6, 4, generator=gen),
            "mask": torch.rand(9, generator=gen) > 0.5,
            "step": torch.tensor(7, dtype=torch.int64)}


def state_b() -> dict[str, "torch.Tensor"]:
    out = {k: v.clone() for k, v in state_a().items()}
    out[CHANGED][AT] += STEP
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(side, format) -> the file: side "a" is state_a, side "b" state_b."""
    folder = tmp_path_factory.mktemp("logical")
    out = {}
    for side, state in (("a", state_a()), ("b", state_b())):
        for fmt in FORMATS:
            path = folder / f"{side}.{fmt}"
            snapops.save(state, path, gen=1 if side == "a" else 2)
            out[side, fmt] = path
    return out


def snapops_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapops", *argv], capture_output=True,
                          text=True)


def diff_json(a: Path, b: Path) -> tuple[int, dict]:
    done = snapops_cli("diff", str(a), str(b), "--format", "json", "--exit-code")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def real_change() -> float:
    """max |B - A| of the changed tensor, in float64 from the bf16 values torch holds."""
    a, b = state_a()[CHANGED].double(), state_b()[CHANGED].double()
    return float((b - a).abs().max())


@pytest.mark.parametrize("fmt", FORMATS[1:])
def test_the_same_state_in_two_formats_diffs_as_unchanged(files, fmt):
    code, report = diff_json(files["a", "wtxt"], files["a", fmt])
    assert code == 0, report
    arrays = {x["name"]: x for x in report["arrays"]}
    assert sorted(arrays) == sorted(state_a())
    for name, tensor in state_a().items():
        assert arrays[name]["status"] == "unchanged", arrays[name]
        assert arrays[name]["dtype_a"] == arrays[name]["dtype_b"] == SPELLED[tensor.dtype]
    assert report["counts"]["changed"] == report["counts"]["added"] == 0


@pytest.mark.parametrize("pair", [("wtxt", "wtxt"), ("fold", "fold"), ("wtxt", "aero"),
                                  ("finf", "wtxt"), ("pycauset", "finf")])
def test_one_changed_element_reports_the_real_change(files, pair):
    code, report = diff_json(files["a", pair[0]], files["b", pair[1]])
    assert code == 1
    changed = [x for x in report["arrays"] if x["status"] != "unchanged"]
    assert [x["name"] for x in changed] == [CHANGED]
    item = changed[0]
    assert item["dtype_a"] == item["dtype_b"] == "bf16"
    assert item["elements_changed"] == 1 and item["blocks_changed"] == 1
    assert item["max_abs"] == pytest.approx(real_change(), rel=1e-6)
    a = state_a()[CHANGED].double()
    assert item["rel_l2"] == pytest.approx(real_change() / float(a.norm()), rel=1e-6)


def test_text_report_names_the_tensor_and_its_change(files):
    done = snapops_cli("diff", str(files["a", "wtxt"]), str(files["b", "wtxt"]))
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("~ "))
    assert line.startswith(f"~ {CHANGED}  bf16 [8x6]  changed")
    assert f"max|d|={real_change():.4g} " in line
    assert "__" not in done.stdout and "uint16" not in done.stdout


def textconv_arrays(path: Path) -> list[str]:
    """textconv's lines from the first array on (the header is each format's own)."""
    done = snapops_cli("textconv", str(path), "--rows-per-block", str(ROWS_PER_BLOCK))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    first = next(i for i, x in enumerate(lines) if x.startswith("arr "))
    return lines[first:]


def test_textconv_shows_logical_dtypes_and_real_extremes(files):
    lines = textconv_arrays(files["a", "wtxt"])
    state = state_a()
    for name, tensor in state.items():
        shape = "x".join(map(str, tensor.shape)) or "scalar"
        assert f"arr {name} dtype={SPELLED[tensor.dtype]} shape={shape} " \
               f"bytes={tensor.numel() * tensor.element_size()}" in lines
    # the first row-block of every floating tensor: min and max as torch computes them
    for name in (CHANGED, "blocks.1.norm", "head"):
        rows = state[name][:ROWS_PER_BLOCK].double()
        block = next(x for x in lines if x.startswith(f"  {name}[0:{ROWS_PER_BLOCK}] "))
        got = dict(kv.split("=") for kv in block.split()[2:])
        assert float(got["min"]) == pytest.approx(float(rows.min()), rel=1e-6)
        assert float(got["max"]) == pytest.approx(float(rows.max()), rel=1e-6)


def test_textconv_renders_the_same_state_alike_in_every_format(files):
    wanted = textconv_arrays(files["a", "wtxt"])
    for fmt in FORMATS[1:]:
        assert textconv_arrays(files["a", fmt]) == wanted, fmt
