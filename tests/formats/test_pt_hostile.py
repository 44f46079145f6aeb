"""Hostile ``.pt`` pickles that torch itself handles badly: refused by snapops before
``torch.load`` sees them."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import zipfile

import pytest

import snapops
from snapops.formats.errors import FormatError

TIMEOUT = 60     # the unfixed load ran for minutes


def with_pickle(tmp_path, edit) -> str:
    """A real torch.save file whose data.pkl is ``edit(data.pkl)``, re-zipped with right CRCs."""
    import torch

    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(3)}, good)
    out = io.BytesIO()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = src.read(info)
            dst.writestr(info, edit(body) if info.filename.endswith("data.pkl") else body)
    path = tmp_path / "bad.pt"
    path.write_bytes(out.getvalue())
    return str(path)


def long_global(body: bytes) -> bytes:
    assert b"ctorch._utils\n" in body
    return body.replace(b"ctorch._utils\n", b"ctorch" + b"[" * 100_000 + b"\n", 1)


def test_a_huge_global_name_is_refused_before_torch_quotes_it(tmp_path):
    """torch's weights_only error quotes the refused GLOBAL and searches that message with
    backtracking regexes: a 100,000-character name held torch.load for minutes (fuzzer,
    pt-members target, --seed 44 case 252)."""
    path = with_pickle(tmp_path, long_global)
    code = ("import snapops, sys\n"
            "try:\n    snapops.load(sys.argv[1])\n"
            "except snapops.FormatError as exc:\n    print(exc)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                              text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"snapops.load of a hostile .pt ran past {TIMEOUT} s")
    assert re.search(r"a pickle GLOBAL argument of 1000\d\d characters .* got good/data\.pkl "
                     r"at byte \d+$", done.stdout.strip()), (done.stdout, done.stderr[-2000:])
    report = snapops.verify(path)
    assert not report.ok and "GLOBAL argument" in str(report.failure)


def test_names_up_to_the_limit_still_load(tmp_path):
    import torch

    from snapops.formats.pt import MAX_PICKLE_TEXT

    name = "n" * MAX_PICKLE_TEXT
    torch.save({name: torch.arange(3)}, tmp_path / "long.pt")
    assert snapops.load(tmp_path / "long.pt")[name].tolist() == [0, 1, 2]
    torch.save({name + "x": torch.arange(3)}, tmp_path / "longer.pt")
    with pytest.raises(FormatError, match="BINUNICODE argument of 1025 characters"):
        snapops.load(tmp_path / "longer.pt")


def test_a_length_past_the_end_of_a_legacy_file_is_refused_without_allocating_it(tmp_path):
    """A legacy (not zip) .pt whose first text length says 4 GiB: the opcode walk read it with
    file.read(n), which allocates n bytes first (MemoryError under the fuzzer's cap, --seed 45
    pt case 1360)."""
    import torch

    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    data = bytearray(legacy.read_bytes())
    at = data.index(b"X", 2)            # BINUNICODE: 'X', a 4-byte length, the text
    data[at + 1:at + 5] = (0xFFFFFFF0).to_bytes(4, "little")
    legacy.write_bytes(data)
    code = ("import resource, sys, snapops\n"
            "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
            "resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30),) * 2)\n"
            "try:\n    snapops.load(sys.argv[1])\n"
            "except snapops.FormatError as exc:\n    print('typed')\n")
    done = subprocess.run([sys.executable, "-c", code, str(legacy)], capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.stdout.strip() == "typed", done.stderr[-2000:]
