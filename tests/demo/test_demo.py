"""`snapops demo --quick` end to end: real daemon process, guarded remote behind git daemon,
verification from a fresh clone, restore into a fresh model, summary."""

from __future__ import annotations

import os
import re

import pytest

from snapops.cli import main


@pytest.mark.slow
def test_quick_demo_runs_end_to_end(tmp_path, capsys):
    assert main(["demo", "--quick", "--workdir", str(tmp_path / "w")]) == 0
    summary = (tmp_path / "w" / "summary.md").read_text()
    generations = re.search(r"\| generations \| (\d+) requested, (\d+) pushed, (\d+) verified",
                            summary)
    requested, pushed, verified = map(int, generations.groups())
    assert requested == 4 and pushed == verified >= 2  # a newer request may coalesce an older
    assert "every tensor equal, dtypes kept" in summary
    assert re.search(r"request\(\)` stall per snapshot \| median [0-9.]+ ms, p99 [0-9.]+ ms",
                     summary)
    hook = (tmp_path / "w" / "remote.git" / "hooks" / "pre-receive").read_text()
    assert "snapops" in hook
    assert "verified" in capsys.readouterr().out
    review = (tmp_path / "w" / "review" / "review.md").read_text()
    assert "review of the last two generations" in summary
    assert "#### Anomalies" in review
    assert "`blocks.0.attn.in_proj_weight`" in review  # original (dotted) names
    png = (tmp_path / "w" / "review" / "review.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_the_waiting_note_says_why_the_last_push_failed(tmp_path):
    import json

    from snapops.demo.run import waiting_note

    state = tmp_path / "state"
    state.mkdir()
    assert waiting_note(tmp_path, 2) == "still waiting for 2 generation(s) to be pushed"
    status = {"push": {"origin": {"last_error": "push to git://h/r.git: git push failed: "
                                                "remote: no space | [remote rejected]"},
                       "backup": {"last_error": None}}}
    (state / "status.json").write_text(json.dumps(status))
    assert waiting_note(tmp_path, 1) == (
        "still waiting for 1 generation(s) to be pushed; the last push failed, retrying: "
        "origin: push to git://h/r.git: git push failed: remote: no space | [remote rejected]")
    for garbage in (b"", b"[1, 2]", b'{"push": 3}', b'{"push": {"o": "x"}}', b"\xff"):
        (state / "status.json").write_bytes(garbage)
        assert waiting_note(tmp_path, 1) == "still waiting for 1 generation(s) to be pushed"
    (state / "status.json").unlink()
    os.mkfifo(state / "status.json")          # never read whole, never waited on
    assert waiting_note(tmp_path, 1) == "still waiting for 1 generation(s) to be pushed"
