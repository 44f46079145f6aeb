"""The suite's short, derandomized fuzzing run: every format and CLI entry point gets a fixed
set of mutated inputs (fixed seed), every writer a fixed set of random snapshots to write and
read back, each run in a memory- and time-limited child; only typed errors or success (for
writers: the same names, dtypes and bits) are allowed. Canary targets that break the rules on
purpose (an untyped exception, SIGSEGV, a hang, an allocation over the limit, a failing
mutator) run in the same campaign and show that each kind is reported with its input saved.
Long runs: ``python -m tests.fuzz``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fuzz.engine import run_campaign
from tests.fuzz.targets import CANARIES, TARGETS

CASES = 8
SEED = 13
# All slow: the suite runs slow tests first, and a campaign test left behind would build the
# module's campaign (10 s) a second time.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    done = run_campaign(seed=SEED, out=root / "findings", targets=[*TARGETS, *CANARIES],
                        cases_per_target=CASES, seeds=root / "seeds", timeout=20)
    done.seeds = root / "seeds"
    return done


def test_every_target_only_typed_errors_or_success(campaign):
    real = [f for f in campaign.findings() if f["target"] in TARGETS]
    assert real == [], campaign.summary()
    for name in TARGETS:
        stats = campaign.stats[name]
        assert stats.cases == CASES, name
        if name.startswith("write-"):           # random snapshots: most round-trip
            assert stats.ok > 0, f"{name}: nothing round-tripped ({campaign.summary()})"
        else:
            assert stats.typed > 0, f"{name}: no mutation was refused ({campaign.summary()})"


def test_each_kind_of_finding_is_reported_with_its_input(campaign):
    canaries = [f for f in campaign.findings() if f["target"] in CANARIES]
    assert {f["target"]: f["kind"] for f in canaries} == {
        "canary-error": "KeyError", "canary-crash": "signal SIGSEGV",
        "canary-hang": "timeout", "canary-memory": "MemoryError",
        "canary-harness": "harness"}
    harness = next(f for f in canaries if f["kind"] == "harness")
    assert harness["index"] == 1 and harness["input"] is None
    assert harness["message"] == "RecursionError: canary" and "case_bytes" in harness["traceback"]
    for finding in canaries:
        if finding is harness:
            continue
        saved = Path(finding["input"])
        report = json.loads(Path(f"{saved}.json").read_text())
        assert report["index"] == finding["index"] and "--replay" in report["replay"]
        rel = CANARIES[finding["target"]].file_for(finding["index"])
        target = CANARIES[finding["target"]]
        assert saved.read_bytes() == target.case_bytes((campaign.seeds / rel).read_bytes(),
                                                       SEED, finding["index"])
    # the cases after a dead one still ran, in a fresh child
    assert all(campaign.stats[name].cases == CASES for name in CANARIES)


def test_every_target_runs_its_unmutated_seeds(campaign, tmp_path):
    """A target that no longer matches the code it drives (a function renamed under it) fails
    on every input, so the few mutated cases above may all be refused before they reach it:
    each unmutated seed must run through its target with success or typed refusals only."""
    from tests.fuzz.targets import Case

    seeds = tmp_path / "seeds"
    shutil.copytree(campaign.seeds, seeds)
    for name, target in TARGETS.items():
        for index, rel in enumerate(target.files):
            out = tmp_path / "out" / name / str(index)
            out.mkdir(parents=True)
            target.run(Case(root=seeds, pristine=seeds, out=out, path=seeds / rel, index=0))


def test_lfs_batch_target_reads_an_answer_with_the_clients_own_functions(tmp_path):
    """Fuzz seed 1001, lfs-batch case 1: the target still called ``client._action``, renamed
    ``offered_action``, so every answer that offered an action was an AttributeError of the
    harness and no case reached the action's checks."""
    from tests.fuzz.seeds import LFS_OIDS
    from tests.fuzz.targets import Case

    path = tmp_path / "batch.json"
    path.write_text(json.dumps({"transfer": "basic", "objects": [
        {"oid": LFS_OIDS[0], "size": 12, "actions": {
            "upload": {"href": "https://lfs.example/o/1", "header": {"A": "x"}},
            "download": {"href": 5}}},
        {"oid": LFS_OIDS[1], "size": 3, "error": {"code": 404, "message": "not found"}}]}))
    case = Case(root=tmp_path, pristine=tmp_path, out=tmp_path, path=path, index=0)
    TARGETS["lfs-batch"].run(case)
    assert case.typed == 2          # the download href that is not a string, the 404
