"""Sealing: WSUM streaming finalization, signatures and trusted keys, HMAC keys, and
verification of age-armored snapshots on the fly."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from snapops.cli import main
from snapops.formats import wtxt
from snapops.formats.keys import generate_keys
from tests.conftest import sample_state

TS = "2026-01-02T03:04:05Z"


@pytest.fixture
def stream(tmp_path, keydir):
    path = tmp_path / "s.wtxt"
    wtxt.save(sample_state(), path, gen=4, ts=TS, streaming=True, rows_per_chunk=16,
              sign_key=keydir / "signing.key", hmac_key=keydir / "hmac.key")
    return path


def _verify(path, keydir, **extra):
    return wtxt.verify(path, hmac_key=keydir / "hmac.key", trusted_keys=[keydir / "signing.pub"],
                       require_signature=True, **extra)


def test_streaming_pair_verifies(stream, keydir):
    assert stream.read_bytes().split(b"\n")[3].startswith(b"root_pending ")
    report = _verify(stream, keydir)
    assert report.ok, report.failure
    assert report.details["streaming"] and "wsum" in report.checks


@pytest.mark.parametrize("field", ["sha256_all", "merkle_prev", "merkle_this", "sign"])
def test_tampered_wsum_field_is_caught(stream, keydir, field):
    wsum = stream.with_name("s.wtxt.wsum")
    text = wsum.read_text()
    value = re.search(field + r"=(\S+)", text).group(1)
    flipped = ("1" if value[5] != "1" else "2") if field != "sign" else (
        "B" if value[5] != "B" else "C")
    wsum.write_text(text.replace(value, value[:5] + flipped + value[6:]))
    report = _verify(stream, keydir)
    assert not report.ok
    assert report.failure.check in {"signature", "sha256_all", "merkle"}
    assert report.failure.path.endswith(".wsum")


def test_wsum_from_another_key_is_untrusted(stream, keydir, tmp_path):
    other = tmp_path / "other"
    generate_keys(other)
    report = wtxt.verify(stream, trusted_keys=[other / "signing.pub"])
    assert not report.ok and report.failure.check == "signature"


def test_wsum_given_explicitly_and_for_wrong_file(stream, keydir, tmp_path):
    moved = tmp_path / "elsewhere.wsum"
    stream.with_name("s.wtxt.wsum").rename(moved)
    assert not _verify(stream, keydir).ok
    assert _verify(stream, keydir, wsum=moved).ok
    plain = tmp_path / "plain.wtxt"
    wtxt.save(sample_state(), plain, gen=4, ts=TS)
    report = wtxt.verify(plain, wsum=moved)
    assert not report.ok and report.failure.check == "wsum"


def test_malformed_wsum_is_a_clear_error(stream, keydir):
    stream.with_name("s.wtxt.wsum").write_text("WSUM 1 sha256_all=zz\n")
    report = _verify(stream, keydir)
    assert report.failure.check == "wsum" and "WSUM 1" in str(report.failure)


def test_signature_by_untrusted_key_and_missing_signature(tmp_path, keydir):
    other = tmp_path / "other"
    generate_keys(other)
    path = tmp_path / "x.wtxt"
    wtxt.save(sample_state(), path, gen=1, ts=TS, sign_key=other / "signing.key")
    report = wtxt.verify(path, trusted_keys=[keydir / "signing.pub"])
    assert report.failure.check == "signature" and "keyid" in str(report.failure)
    assert wtxt.verify(path, trusted_keys=[keydir / "signing.pub", other / "signing.pub"]).ok
    wtxt.save(sample_state(), path, gen=1, ts=TS)
    assert wtxt.verify(path, trusted_keys=[keydir]).failure.check == "signature"


def test_signature_covers_header_only_and_costs_o_header(tmp_path, keydir):
    small, large = tmp_path / "s.wtxt", tmp_path / "l.wtxt"
    wtxt.save({"a": np.ones(4)}, small, gen=1, ts=TS, sign_key=keydir / "signing.key")
    wtxt.save({"a": np.ones(400_000)}, large, gen=1, ts=TS, sign_key=keydir / "signing.key")
    signed = []
    for path in (small, large):
        text = path.read_bytes()
        signed.append(len(text[:text.index(b"\nsign ") + 1]))
    assert signed[0] == signed[1] < 512  # what is signed does not grow with the state


def test_hmac_salt_rotates_per_generation(tmp_path, keydir):
    salts = []
    for gen in (1, 2):
        path = tmp_path / f"g{gen}.wtxt"
        wtxt.save({"a": np.ones(4)}, path, gen=gen, ts=TS, hmac_key=keydir / "hmac.key")
        salts.append(re.search(rb"salt=(\w+)", path.read_bytes()).group(1))
    assert salts[0] != salts[1] and b"0" * 16 not in salts


def test_verify_age_armored_snapshot_on_the_fly(tmp_path, keydir, capsys):
    path = tmp_path / "x.wtxt"
    wtxt.save(sample_state(), path, gen=1, ts=TS, sign_key=keydir / "signing.key")
    recipient = (keydir / "age.pub").read_text().strip()
    subprocess.run(["age", "-a", "-r", recipient, "-o", str(tmp_path / "x.wtxt.age"), str(path)],
                   check=True)
    assert main(["verify", str(tmp_path / "x.wtxt.age"), "--identity", str(keydir / "age.key"),
                 "--trusted-key", str(keydir), "--require-signature"]) == 0
    assert main(["verify", str(tmp_path / "x.wtxt.age")]) == 2  # no identity: cannot be carried out
    other = tmp_path / "o"
    generate_keys(other)
    assert main(["verify", str(tmp_path / "x.wtxt.age"), "--identity",
                 str(other / "age.key")]) == 1
    err = capsys.readouterr().err
    assert "--identity" in err and "no identity matches" in err and "Traceback" not in err
    assert not list(tmp_path.glob("snapops-verify-*"))
