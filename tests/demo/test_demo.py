"""`snapops demo --quick` end to end: real daemon process, guarded remote behind git daemon,
verification from a fresh clone, restore into a fresh model, summary."""

from __future__ import annotations

import re

from snapops.cli import main


def test_quick_demo_runs_end_to_end(tmp_path, capsys):
    assert main(["demo", "--quick", "--workdir", str(tmp_path / "w")]) == 0
    summary = (tmp_path / "w" / "summary.md").read_text()
    generations = re.search(r"\| generations \| (\d+) requested, (\d+) pushed, (\d+) verified",
                            summary)
    assert generations and len(set(generations.groups())) == 1 and int(generations[1]) >= 2
    assert "every tensor equal, dtypes kept" in summary
    assert re.search(r"request\(\)` stall per snapshot \| median [0-9.]+ ms, p99 [0-9.]+ ms",
                     summary)
    hook = (tmp_path / "w" / "remote.git" / "hooks" / "pre-receive").read_text()
    assert "snapops" in hook
    assert "verified" in capsys.readouterr().out
