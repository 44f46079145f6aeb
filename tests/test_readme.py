"""The README's examples run as written.

Every ``sh``, ``console`` and ``python`` block of README.md is preceded by a marker:
``<!-- readme: run -->`` (this test runs it) or ``<!-- readme: skip REASON -->`` (a fragment of
a training loop, a server path...). The blocks marked ``run`` run in README order in one scratch
folder (``HOME`` inside it), which holds only what the surrounding prose assumes the reader has:
a state file ``state.npz``, a torch checkpoint ``model.pt``, two WTXT generations
``gen-11.wtxt``/``gen-12.wtxt``, an SSH key and a recipients file, in a fresh Git work tree.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!-- readme: (?P<mark>[^>]*?) -->\n)?```(?P<lang>sh|console|python)\n"
                   r"(?P<body>.*?)```\n", re.S)


def blocks() -> list[tuple[str, str, str, int]]:
    text = (ROOT / "README.md").read_text("utf-8")
    return [(m["mark"] or "", m["lang"], m["body"], text.count("\n", 0, m.start("body")) + 1)
            for m in BLOCK.finditer(text)]


def test_every_example_is_marked_run_or_skip_with_a_reason():
    unmarked = [line for mark, _, _, line in blocks()
                if not (mark == "run" or re.fullmatch(r"skip \S.*", mark))]
    assert not unmarked, f"README.md blocks at lines {unmarked} need <!-- readme: run|skip WHY -->"
    assert sum(mark == "run" for mark, *_ in blocks()) >= 5


def shell_lines(lang: str, body: str) -> str:
    if lang == "sh":
        return body
    commands, continued = [], False
    for line in body.splitlines():
        if line.startswith("$ ") or continued:
            commands.append(line[2:] if line.startswith("$ ") else line)
        continued = line.rstrip().endswith("\\") and (line.startswith("$ ") or continued)
    return "".join(c + "\n" for c in commands)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    import torch

    import snapops

    work = tmp_path_factory.mktemp("readme")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "-c", "user.name=r", "-c", "user.email=r@x",
                    "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    rng = np.random.default_rng(0)
    np.savez(work / "state.npz", w=rng.standard_normal((64, 32)).astype(np.float32),
             step=np.array(12, np.int64))
    torch.save({"layer.0.weight": torch.randn(8, 8).bfloat16(), "step": torch.tensor(3)},
               work / "model.pt")
    w = rng.standard_normal((64, 32)).astype(np.float32)
    snapops.save({"w": w}, work / "gen-11.wtxt", gen=11, row_blocking=True)
    w[5] += 1
    snapops.save({"w": w}, work / "gen-12.wtxt", gen=12, row_blocking=True)
    (work / ".ssh").mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(work / ".ssh" / "id_ed25519")], check=True)
    pub = subprocess.run(["age-keygen", "-y"], input=subprocess.run(
        ["age-keygen"], capture_output=True, check=True).stdout, capture_output=True,
        check=True).stdout
    (work / "team.txt").write_bytes(pub)
    (work / "notes.txt").write_text("release notes\n")
    return work


@pytest.mark.slow
def test_run_blocks_run_as_written(scratch):
    env = dict(os.environ, HOME=str(scratch), SNAP_PW="correct horse battery",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for mark, lang, body, line in blocks():
        if mark != "run":
            continue
        if lang == "python":
            argv = [sys.executable, "-c", body]
        else:
            argv = ["bash", "-euo", "pipefail", "-c", shell_lines(lang, body)]
        result = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True,
                                timeout=240)
        assert result.returncode == 0, (
            f"README.md block at line {line} failed ({result.returncode}):\n{result.stderr[-2000:]}")
