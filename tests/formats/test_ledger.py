"""The merkle-chained ledger: append, verify, every tamper case named by line, and the CLI."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from snapops.cli import main
from snapops.formats.errors import FormatError, LedgerError, LimitError, TruncatedError
from snapops.formats.integrity import merkle_link
from snapops.formats.ledger import (
    MAX_LINE, Ledger, LedgerEntry, chain_next, format_line, iter_lines, parse_line,
)
from snapops.formats.wtxt import save
from snapops.formats.wtxt.wsum import wsum_path

TS = "2026-01-02T03:04:05Z"
ZERO = "0" * 64


def state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((8, 4)).astype(np.float32),
            "b": rng.integers(0, 100, 5, dtype=np.int64)}


def snap(root, gen, prev, *, seed=None, name=None, **options):
    path = root / "snapshots" / "run1" / (name or f"s{gen}.wtxt")
    path.parent.mkdir(parents=True, exist_ok=True)
    result = save(state(gen if seed is None else seed), path, gen=gen, ts=TS, merkle_prev=prev,
                  row_blocking=True, **options)
    return path, result


@pytest.fixture
def chain(tmp_path):
    """Four chained snapshots, appended to ``ledger/run1.ledger`` (root: tmp_path)."""
    ledger = Ledger(tmp_path / "ledger" / "run1.ledger", root=tmp_path)
    ledger.path.parent.mkdir()
    prev, results = None, []
    for gen in (1, 2, 3, 4):
        path, result = snap(tmp_path, gen, prev)
        ledger.append_snapshot(path)
        prev = result.merkle_this
        results.append(result)
    return ledger, results


def lines_of(ledger) -> list[bytes]:
    return ledger.path.read_bytes().splitlines(keepends=True)


def write_lines(ledger, lines) -> None:
    ledger.path.write_bytes(b"".join(lines))


def only_problem(report):
    assert not report.ok
    assert len(report.problems) == 1, [str(p) for p in report.problems]
    return report.problems[0]


# --- append and a clean verify -------------------------------------------------------------

def test_append_then_verify_ok(chain):
    ledger, results = chain
    report = ledger.verify()
    assert report.ok, report.summary()
    assert report.entries == 4 and report.last_gen == 4 and report.problems == []
    entries = list(ledger.entries())
    assert [e.gen for e in entries] == [1, 2, 3, 4]
    for entry, result in zip(entries, results):
        assert (entry.sha256_all, entry.merkle_prev, entry.merkle_this) == (
            result.sha256_all, result.details["merkle_prev"], result.merkle_this)
        assert entry.path == f"snapshots/run1/s{entry.gen}.wtxt" and entry.format == "wtxt"
        assert entry.keyid is None and entry.build == "unknown"


def test_lines_follow_the_documented_grammar_checked_independently(chain):
    ledger, results = chain
    prev = bytes(32)
    for line, result in zip(lines_of(ledger), results):
        body, _, chain_field = line.partition(b" chain=")
        gen, prev_link = result.details["gen"], result.details["merkle_prev"]
        assert body == (
            f"gen={gen} ts={TS} sha256_all={result.sha256_all} "
            f"merkle_prev={prev_link} merkle_this={result.merkle_this} "
            f"path=snapshots/run1/s{int(gen)}.wtxt format=wtxt keyid=- build=unknown"
        ).encode()
        expected = hashlib.sha256(prev + body).hexdigest()
        assert chain_field == expected.encode() + b"\n"
        assert merkle_link(prev_link, result.sha256_all, TS, gen, "unknown") == result.merkle_this
        prev = bytes.fromhex(expected)
    assert ledger.head() == prev.hex()


def test_ledger_bytes_are_deterministic(chain, tmp_path):
    ledger, _ = chain
    again = Ledger(tmp_path / "again.ledger", root=tmp_path)
    for entry in ledger.entries():
        again.append(entry)
    assert again.path.read_bytes() == ledger.path.read_bytes()
    entry = next(ledger.entries())
    assert format_line(entry) == format_line(entry) == lines_of(ledger)[0]
    rec = parse_line(lines_of(ledger)[0], 1)
    assert rec.entry == entry and rec.chain == chain_next(ZERO, rec.body)


def test_streaming_snapshot_is_read_through_its_wsum(tmp_path):
    ledger = Ledger(tmp_path / "run.ledger", root=tmp_path)
    p1, r1 = snap(tmp_path, 1, None)
    p2, r2 = snap(tmp_path, 2, r1.merkle_this, streaming=True)
    ledger.append_snapshot(p1)
    rec = ledger.append_snapshot(p2)
    assert rec.line_no == 2
    assert (rec.entry.sha256_all, rec.entry.merkle_this) == (r2.sha256_all, r2.merkle_this)
    assert ledger.verify().ok
    wsum_path(p2).unlink()
    problem = only_problem(ledger.verify())
    assert (problem.line, problem.check) == (2, "file") and "WSUM" in str(problem)


def test_signed_snapshot_records_its_keyid(tmp_path, keydir):
    ledger = Ledger(tmp_path / "run.ledger", root=tmp_path)
    path, result = snap(tmp_path, 1, None, sign_key=keydir / "signing.key")
    assert result.details["keyid"]
    assert ledger.append_snapshot(path).entry.keyid == result.details["keyid"]
    assert f"keyid={result.details['keyid']} ".encode() in ledger.path.read_bytes()
    assert ledger.verify().ok


def test_empty_ledger_verifies_and_missing_ledger_fails(tmp_path):
    empty = tmp_path / "empty.ledger"
    empty.write_bytes(b"")
    report = Ledger(empty).verify()
    assert report.ok and report.entries == 0 and report.head == ZERO
    missing = Ledger(tmp_path / "nope.ledger").verify()
    assert not missing.ok and missing.failure.check == "io"


# --- append refuses what does not chain ------------------------------------------------------

def test_append_refuses_gen_not_greater(chain, tmp_path):
    ledger, _ = chain
    before = ledger.path.read_bytes()
    with pytest.raises(LedgerError, match=r"\[order\] refused: gen must increase") as info:
        ledger.append_snapshot(tmp_path / "snapshots" / "run1" / "s4.wtxt")
    assert info.value.check == "order" and info.value.line == 5
    assert "000004" in str(info.value)
    assert ledger.path.read_bytes() == before


def test_append_refuses_merkle_prev_not_matching_last(chain, tmp_path):
    ledger, results = chain
    before = ledger.path.read_bytes()
    path, _ = snap(tmp_path, 5, results[2].merkle_this, name="fork.wtxt")  # chains on gen 3
    with pytest.raises(LedgerError,
                       match=r"\[merkle\] refused: .*fork\.wtxt does not chain") as info:
        ledger.append_snapshot(path)
    assert info.value.check == "merkle" and info.value.line == 5
    assert results[3].merkle_this in str(info.value)
    assert ledger.path.read_bytes() == before
    path, _ = snap(tmp_path, 5, results[3].merkle_this)
    assert ledger.append_snapshot(path).line_no == 5 and ledger.verify().ok


def test_append_refuses_entry_whose_merkle_does_not_rederive(tmp_path):
    entry = LedgerEntry(gen=1, ts=TS, sha256_all="a" * 64, merkle_prev=ZERO,
                        merkle_this="b" * 64, path="x.wtxt")
    ledger = Ledger(tmp_path / "run.ledger")
    with pytest.raises(LedgerError,
                       match=r"\[merkle\] refused: merkle_this does not re\-derive") as info:
        ledger.append(entry)
    assert info.value.check == "merkle"
    assert not ledger.path.exists()


@pytest.mark.parametrize("bad", ["../x.wtxt", "/abs/x.wtxt", "a/../../x.wtxt", "a//x.wtxt",
                                 "./x.wtxt", "a\\x.wtxt", "a b.wtxt"])
def test_append_refuses_unsafe_paths(tmp_path, bad):
    sha = "c" * 64
    entry = LedgerEntry(gen=1, ts=TS, sha256_all=sha, merkle_prev=ZERO,
                        merkle_this=merkle_link(ZERO, sha, TS, "000001", "unknown"), path=bad)
    with pytest.raises(FormatError, match=r"\[(grammar|path)\]") as info:
        Ledger(tmp_path / "run.ledger").append(entry)
    assert info.value.check in ("path", "grammar")
    assert not (tmp_path / "run.ledger").exists()


def test_append_snapshot_outside_root_is_refused(tmp_path):
    inside = tmp_path / "repo"
    inside.mkdir()
    path, _ = snap(tmp_path, 1, None)  # tmp_path/snapshots/..., outside repo/
    with pytest.raises(LedgerError, match=r"\[path\]") as info:
        Ledger(inside / "run.ledger", root=inside).append_snapshot(path)
    assert info.value.check == "path"


def test_failed_write_leaves_no_partial_line(chain, tmp_path, monkeypatch):
    ledger, results = chain
    before = ledger.path.read_bytes()
    path, _ = snap(tmp_path, 5, results[3].merkle_this)
    real_write = os.write

    def half_then_fail(fd, data):
        real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(FormatError, match=r"\[io\]") as info:
        ledger.append_snapshot(path)
    monkeypatch.undo()
    assert info.value.check == "io" and "No space" in str(info.value)
    assert ledger.path.read_bytes() == before
    assert ledger.verify().ok


# --- verify: each tamper case is caught and names its line ----------------------------------

def test_deleted_middle_line_is_a_gap(chain):
    ledger, _ = chain
    lines = lines_of(ledger)
    write_lines(ledger, lines[:1] + lines[2:])
    report = ledger.verify(check_files=False)
    problem = only_problem(report)
    assert (problem.line, problem.check) == (2, "gap")
    assert "missing" in str(problem) and "run1.ledger:2:" in str(problem)
    assert report.failure is problem


def test_deleted_first_line_is_a_gap(chain):
    ledger, _ = chain
    write_lines(ledger, lines_of(ledger)[1:])
    problem = only_problem(ledger.verify(check_files=False))
    assert (problem.line, problem.check) == (1, "gap")


def test_swapped_lines_are_a_reorder(chain):
    ledger, _ = chain
    lines = lines_of(ledger)
    write_lines(ledger, [lines[0], lines[2], lines[1], lines[3]])
    report = ledger.verify(check_files=False)
    assert not report.ok
    found = {(p.line, p.check) for p in report.problems}
    assert (3, "order") in found
    assert report.failure.line == 2
    order = next(p for p in report.problems if p.check == "order")
    assert "reordered" in str(order) and "000002" in str(order) and "000003" in str(order)


def _edit_first_char(line: bytes, field: str) -> bytes:
    key = f"{field}=".encode()
    at = 0 if line.startswith(key) else line.index(b" " + key) + 1
    at += len(key)
    old = chr(line[at])
    new = {"9": "0", "f": "0"}.get(old) or (
        str(int(old) + 1) if old.isdigit() else chr(ord(old) + 1) if old in "abcde" else
        "x" if old != "x" else "y")
    return line[:at] + new.encode() + line[at + 1:]


@pytest.mark.parametrize("field", ["gen", "ts", "sha256_all", "merkle_prev", "merkle_this",
                                   "path", "format", "build", "chain"])
def test_one_edited_character_is_caught_on_its_line(chain, field):
    ledger, _ = chain
    lines = lines_of(ledger)
    lines[1] = _edit_first_char(lines[1], field)
    write_lines(ledger, lines)
    report = ledger.verify(check_files=False)
    assert not report.ok
    assert (report.failure.line, report.failure.check) == (2, "chain"), str(report.failure)
    assert "edited" in str(report.failure)


def test_entry_not_chaining_but_with_a_valid_chain_field_fails_the_merkle_check(chain, tmp_path):
    ledger, results = chain
    bogus_prev = "ab" * 32
    path, result = snap(tmp_path, 5, bogus_prev)
    assert result.details["merkle_prev"] == bogus_prev
    body = (f"gen=000005 ts={TS} sha256_all={result.sha256_all} merkle_prev={bogus_prev} "
            f"merkle_this={result.merkle_this} path=snapshots/run1/s5.wtxt format=wtxt "
            f"keyid=- build=unknown").encode()
    last_chain = lines_of(ledger)[-1].rstrip(b"\n").rpartition(b" chain=")[2].decode()
    chain_value = hashlib.sha256(bytes.fromhex(last_chain) + body).hexdigest()
    with open(ledger.path, "ab") as f:
        f.write(body + b" chain=" + chain_value.encode() + b"\n")
    problem = only_problem(ledger.verify())  # the file matches; only the merkle link is wrong
    assert (problem.line, problem.check) == (5, "merkle")
    assert "merkle_prev" in str(problem) and results[3].merkle_this in str(problem)


def test_entry_whose_merkle_this_does_not_rederive_is_caught(chain):
    ledger, _ = chain
    lines = lines_of(ledger)
    rec = parse_line(lines[3], 4)
    fake = "e" * 64
    body = rec.body.replace(rec.entry.merkle_this.encode(), fake.encode())
    prev_chain = parse_line(lines[2], 3).chain
    lines[3] = body + b" chain=" + chain_next(prev_chain, body).encode() + b"\n"
    write_lines(ledger, lines)
    problem = only_problem(ledger.verify(check_files=False))
    assert (problem.line, problem.check) == (4, "merkle") and "re-derive" in str(problem)


def test_snapshot_replaced_by_another_valid_snapshot(chain, tmp_path):
    ledger, results = chain
    path = tmp_path / "snapshots" / "run1" / "s2.wtxt"
    save(state(99), path, gen=2, ts=TS, merkle_prev=results[0].merkle_this, row_blocking=True)
    problem = only_problem(ledger.verify())
    assert (problem.line, problem.check) == (2, "file")
    assert "sha256_all" in str(problem) and "s2.wtxt" in str(problem)
    assert ledger.verify(check_files=False).ok


def test_snapshot_swapped_for_another_generation(chain, tmp_path):
    ledger, _ = chain
    folder = tmp_path / "snapshots" / "run1"
    (folder / "s2.wtxt").write_bytes((folder / "s3.wtxt").read_bytes())
    problem = only_problem(ledger.verify())
    assert (problem.line, problem.check) == (2, "file") and "gen=000002" in str(problem)


def test_missing_snapshot_fails_unless_allowed(chain, tmp_path):
    ledger, _ = chain
    (tmp_path / "snapshots" / "run1" / "s1.wtxt").unlink()
    problem = only_problem(ledger.verify())
    assert (problem.line, problem.check) == (1, "missing")
    report = ledger.verify(allow_missing=True)
    assert report.ok and any("s1.wtxt" in n and "line 1" in n for n in report.notes)


def test_truncated_last_line_is_a_partial_write(chain, tmp_path):
    ledger, results = chain
    data = ledger.path.read_bytes()
    ledger.path.write_bytes(data[:-10])
    problem = only_problem(ledger.verify(check_files=False))
    assert isinstance(problem, TruncatedError) and problem.line == 4
    assert "partial" in str(problem)
    with pytest.raises(TruncatedError,
                       match=r"\[truncated\] partial last line \(an interrupted") as info:
        list(ledger.entries())
    assert info.value.line == 4
    path, _ = snap(tmp_path, 5, results[3].merkle_this)
    with pytest.raises(TruncatedError, match=r"\[truncated\] partial last line \(an interrupted"):
        ledger.append_snapshot(path)
    assert ledger.path.read_bytes() == data[:-10]


def test_truncation_at_every_offset_is_named_or_a_shorter_valid_ledger(chain):
    ledger, _ = chain
    data = ledger.path.read_bytes()
    ends = {i + 1 for i, b in enumerate(data) if b == ord("\n")} | {0}
    for cut in reversed(range(len(data))):
        os.truncate(ledger.path, cut)
        report = ledger.verify(check_files=False)
        if cut in ends:
            assert report.ok and report.entries == data[:cut].count(b"\n")
        else:
            assert report.failure.check == "truncated"
            assert report.failure.line == data[:cut].count(b"\n") + 1


@pytest.mark.parametrize("path", ["../outside.wtxt", "/etc/passwd", "a/../b.wtxt"])
def test_read_refuses_unsafe_paths_naming_the_line(chain, path):
    ledger, _ = chain
    lines = lines_of(ledger)
    rec = parse_line(lines[1], 2)
    body = rec.body.replace(f"path={rec.entry.path}".encode(), f"path={path}".encode())
    lines[1] = body + b" chain=" + chain_next(parse_line(lines[0], 1).chain, body).encode() + b"\n"
    write_lines(ledger, lines)
    problem = only_problem(ledger.verify())
    assert (problem.line, problem.check) == (2, "path") and path in str(problem)
    with pytest.raises(LedgerError, match=r"\[path\] refused"):
        list(ledger.entries())


def test_grammar_error_names_the_field_and_line(chain):
    ledger, _ = chain
    lines = lines_of(ledger)
    lines[2] = lines[2].replace(b" ts=", b" tz=")
    write_lines(ledger, lines)
    problem = only_problem(ledger.verify(check_files=False))
    assert (problem.line, problem.check) == (3, "grammar")
    assert "ts=<YYYY-MM-DDTHH:MM:SSZ>" in str(problem) and "tz=" in str(problem)


def test_crlf_and_overlong_lines_are_refused(chain):
    ledger, _ = chain
    lines = lines_of(ledger)
    write_lines(ledger, [lines[0].replace(b"\n", b"\r\n")])
    assert only_problem(ledger.verify(check_files=False)).check == "grammar"
    write_lines(ledger, [lines[0], b"x" * (MAX_LINE + 5) + b"\n"])
    problem = only_problem(ledger.verify(check_files=False))
    assert isinstance(problem, LimitError) and problem.line == 2


def test_head_pin_catches_a_removed_tail(chain):
    ledger, _ = chain
    head = ledger.head()
    assert ledger.verify(head=head).ok
    write_lines(ledger, lines_of(ledger)[:3])
    assert ledger.verify().ok  # a clean cut at a line boundary needs the pinned head
    problem = only_problem(ledger.verify(head=head))
    assert problem.check == "head" and problem.line == 3


def test_contiguous_demands_consecutive_gens(tmp_path):
    ledger = Ledger(tmp_path / "run.ledger", root=tmp_path)
    prev = None
    for gen in (1, 2, 5):
        path, result = snap(tmp_path, gen, prev)
        ledger.append_snapshot(path)
        prev = result.merkle_this
    assert ledger.verify().ok
    problem = only_problem(ledger.verify(contiguous=True))
    assert (problem.line, problem.check) == (3, "gap") and "gen 3" in str(problem)


@given(st.binary(max_size=600))
def test_parser_raises_only_typed_errors(data):
    import io

    try:
        for rec in iter_lines(io.BytesIO(data)):
            assert rec.entry.gen >= 0
    except FormatError:
        pass


# --- CLI -----------------------------------------------------------------------------------

def cli_chain(tmp_path) -> tuple[str, list[str]]:
    ledger = str(tmp_path / "run.ledger")
    prev, paths = None, []
    for gen in (1, 2, 3):
        path, result = snap(tmp_path, gen, prev)
        prev = result.merkle_this
        paths.append(str(path))
    return ledger, paths


def test_cli_append_verify_show(tmp_path, capsys):
    ledger, paths = cli_chain(tmp_path)
    for path in paths:
        assert main(["ledger", "append", ledger, path, "--root", str(tmp_path)]) == 0
    assert "appended line 3" in capsys.readouterr().out
    assert main(["ledger", "verify", ledger, "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("OK ")
    assert main(["ledger", "show", ledger]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["LINE", "GEN", "TS"] and len(table) == 4
    assert table[3].split()[:2] == ["3", "000003"] and table[3].endswith("snapshots/run1/s3.wtxt")
    assert main(["ledger", "show", ledger, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["gen"] for r in rows] == [1, 2, 3] and rows[0]["line"] == 1



def test_cli_append_refuses_a_snapshot_that_does_not_verify(tmp_path, capsys):
    """A data line flipped: the header still chains, but nothing is appended (exit 1);
    --header-only appends from the header, and ledger verify says it read headers only."""
    ledger, paths = cli_chain(tmp_path)
    data = Path(paths[0]).read_bytes()
    lines = data.split(b"\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(b"ch "))
    body = bytearray(lines[at + 1])
    body[0] = ord("A") if body[0] != ord("A") else ord("B")
    lines[at + 1] = bytes(body)
    Path(paths[0]).write_bytes(b"\n".join(lines))
    assert main(["ledger", "append", ledger, paths[0], "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "FAIL" in err and "[parity]" in err and "not appended" in err
    assert not Path(ledger).exists() or Path(ledger).read_bytes() == b""
    assert main(["ledger", "append", ledger, paths[0], "--root", str(tmp_path),
                 "--header-only"]) == 0
    capsys.readouterr()
    assert main(["ledger", "verify", ledger, "--root", str(tmp_path)]) == 0
    assert "header matches its entry (their data: snapops verify)" in capsys.readouterr().out

def test_cli_verify_failure_names_the_line(tmp_path, capsys):
    ledger, paths = cli_chain(tmp_path)
    for path in paths:
        main(["ledger", "append", ledger, path, "--root", str(tmp_path)])
    capsys.readouterr()
    target = tmp_path / "run.ledger"
    lines = target.read_bytes().splitlines(keepends=True)
    target.write_bytes(lines[0] + lines[2])
    assert main(["ledger", "verify", ledger, "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "FAIL" in err and "run.ledger:2: [gap]" in err
    assert main(["ledger", "verify", ledger, "--root", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["failure"]["line"] == 2
    assert report["problems"][0]["check"] == "gap"


def test_cli_allow_missing_and_refused_append(tmp_path, capsys):
    ledger, paths = cli_chain(tmp_path)
    for path in paths[:2]:
        main(["ledger", "append", ledger, path, "--root", str(tmp_path)])
    assert main(["ledger", "append", ledger, paths[0], "--root", str(tmp_path)]) == 2
    assert "[order]" in capsys.readouterr().err
    os.unlink(paths[0])
    assert main(["ledger", "verify", ledger, "--root", str(tmp_path)]) == 1
    assert "[missing]" in capsys.readouterr().err
    assert main(["ledger", "verify", ledger, "--root", str(tmp_path), "--allow-missing"]) == 0
    assert "note:" in capsys.readouterr().out


def test_cli_usage_errors(tmp_path, capsys):
    assert main(["ledger"]) == 2
    assert main(["ledger", "show", str(tmp_path / "missing.ledger")]) == 2
    assert "missing.ledger" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^0$") as info:
        main(["ledger", "verify", "--help"])
    assert info.value.code == 0
    assert "example:" in capsys.readouterr().out


def _text_ledger() -> bytes:
    out, prev_chain, prev_merkle = [], ZERO, ZERO
    for gen in (1, 2, 3):
        sha = hashlib.sha256(b"%d" % gen).hexdigest()
        entry = LedgerEntry(gen=gen, ts=TS, sha256_all=sha, merkle_prev=prev_merkle,
                            merkle_this=merkle_link(prev_merkle, sha, TS, f"{gen:06d}", "b1"),
                            path=f"s/{gen}.wtxt", build="b1")
        line = format_line(entry, prev_chain)
        out.append(line)
        prev_chain, prev_merkle = parse_line(line).chain, entry.merkle_this
    return b"".join(out)


TEXT_LEDGER = _text_ledger()


@given(st.integers(0, len(TEXT_LEDGER) - 1), st.integers(0, 255))
def test_any_one_byte_change_is_a_typed_error_or_a_named_problem(at, value):
    import io

    from snapops.formats.ledger import check_link

    data = bytearray(TEXT_LEDGER)
    changed = data[at] != value
    data[at] = value
    problems, prev = [], None
    try:
        for rec in iter_lines(io.BytesIO(bytes(data))):
            problem = check_link(rec, prev)
            if problem is not None:
                problems.append(problem)
            prev = rec
    except FormatError as exc:
        problems.append(exc)
    assert bool(problems) == changed
    assert all(p.line is not None for p in problems)


def test_cli_root_defaults_to_the_work_tree_top_level(tmp_path, monkeypatch, capsys):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _, paths = cli_chain(tmp_path)
    (tmp_path / "ledger").mkdir()
    ledger = str(tmp_path / "ledger" / "run1.ledger")
    monkeypatch.chdir(tmp_path / "ledger")  # anywhere: the root comes from the work tree
    for path in paths:
        assert main(["ledger", "append", ledger, path]) == 0
    assert main(["ledger", "verify", ledger]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("OK ")
    outside = tmp_path / "outside"  # not in a work tree: the ledger's folder, so [missing]
    subprocess.run(["git", "init", "-q", str(outside)], check=True)
    copy = outside / "run1.ledger"
    copy.write_bytes((tmp_path / "ledger" / "run1.ledger").read_bytes())
    assert main(["ledger", "verify", str(copy)]) == 1
    assert "missing" in capsys.readouterr().err
