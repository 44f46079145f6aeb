"""The names and dtypes WTXT carries in its audit line are bound by the signed header: a file
whose mapped names or dtype record was edited after signing is refused, a required signature
or HMAC fails when nothing binds them, and files without such records are unchanged."""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest

from snapops.formats import wtxt
from snapops.formats.errors import FormatError
from snapops.formats.wtxt.delta import apply_delta, make_delta
from snapops.formats.wtxt.logical import AUDIT_CAP

TS = "2026-01-02T03:04:05Z"


def _keys(keydir, **extra):
    return dict(hmac_key=keydir / "hmac.key", trusted_keys=[keydir / "signing.pub"], **extra)


def _state(scale=1.0):
    return {"enc-weight": np.zeros(3, np.float32) + scale, "dec-weight": np.full(3, 2 * scale,
                                                                             np.float32),
            "emb.weight": (np.arange(4) * scale).astype(ml_dtypes.bfloat16)}


def _save(path, keydir, state=None, **extra):
    wtxt.save(state or _state(), path, gen=3, ts=TS, hmac_key=keydir / "hmac.key",
              sign_key=keydir / "signing.key", **extra)
    return path


def _lines(path):
    return path.read_bytes().split(b"\n")


def _edit_audit(path, edit):
    lines = _lines(path)
    at = next(i for i, line in enumerate(lines) if line.startswith(b"audit "))
    lines[at] = edit(lines[at])
    path.write_bytes(b"\n".join(lines))


def test_the_header_records_the_audit_lines_digest_and_the_file_loads_as_saved(tmp_path,
                                                                                keydir):
    path = _save(tmp_path / "s.wtxt", keydir)
    lines = _lines(path)
    audit = next(line for line in lines if line.startswith(b"audit "))
    assert b"snapops_names=" in audit and b"snapops_dtypes=" in audit
    cap = lines[2].decode()
    assert cap.endswith("," + AUDIT_CAP + hashlib.sha256(audit).hexdigest())
    report = wtxt.verify(path, **_keys(keydir, require_signature=True, require_hmac=True))
    assert report.ok, report.failure
    assert not any("audit line are not authenticated" in n for n in report.notes)
    snap = wtxt.load(path, **_keys(keydir, require_signature=True, require_hmac=True))
    assert snap["emb.weight"].dtype == ml_dtypes.bfloat16
    assert np.array_equal(snap["dec-weight"], np.full(3, 2, np.float32))


@pytest.mark.parametrize("edit", [
    pytest.param(lambda a: a.replace(b"enc-weight", b"X").replace(b"dec-weight", b"enc-weight")
                 .replace(b"X", b"dec-weight"), id="names-swapped"),
    pytest.param(lambda a: a.replace(b"snapops_dtypes=", b"snapops_dtypez="),
                 id="dtype-record-hidden"),
    pytest.param(lambda a: a + b" note=x", id="pair-added"),
])
def test_an_audit_line_changed_after_signing_is_refused_by_every_reader(tmp_path, keydir, edit):
    path = _save(tmp_path / "s.wtxt", keydir)
    _edit_audit(path, edit)
    report = wtxt.verify(path, **_keys(keydir, require_signature=True, require_hmac=True))
    assert not report.ok and report.failure.check == "audit"
    assert "changed after writing" in str(report.failure)
    with pytest.raises(FormatError, match="audit line is not the one the header's digest"):
        wtxt.load(path)          # no keys: the digest is still checked
    with pytest.raises(FormatError, match="audit line is not the one the header's digest"):
        wtxt.open_lazy(path)


def test_dropping_the_audit_line_is_refused(tmp_path, keydir):
    path = _save(tmp_path / "s.wtxt", keydir)
    path.write_bytes(b"\n".join(line for line in _lines(path)
                                if not line.startswith(b"audit ")))
    with pytest.raises(FormatError, match="changed after writing.*got no audit line"):
        wtxt.load(path)


def _unbound_copy(tmp_path, keydir):
    """A signed file whose header lost the audit digest: what an attacker would have to make
    (the signature then fails) or a file from before the digest existed (re-signed here)."""
    from snapops.formats.keys import coerce_signing_key
    from snapops.formats.wtxt._emit import _sign_line

    path = _save(tmp_path / "s.wtxt", keydir)
    lines = _lines(path)
    lines[2] = lines[2].split(b"," + AUDIT_CAP.encode())[0]
    header = b"\n".join(lines[:4]) + b"\n"
    resigned = _sign_line(coerce_signing_key(keydir / "signing.key"), header)
    lines[4] = resigned.rstrip(b"\n")
    path.write_bytes(b"\n".join(lines))
    return path


def test_records_nothing_binds_fail_a_required_signature_or_hmac_and_are_noted_otherwise(
        tmp_path, keydir):
    path = _unbound_copy(tmp_path, keydir)
    for required in ({"require_signature": True}, {"require_hmac": True}):
        report = wtxt.verify(path, **_keys(keydir, **required))
        assert not report.ok and report.failure.check == "audit"
        assert "nothing authenticates here (no digest of it in the header" in str(report.failure)
        with pytest.raises(FormatError, match="a required (signature|HMAC) cannot vouch"):
            wtxt.load(path, **_keys(keydir, **required))
    report = wtxt.verify(path, **_keys(keydir))
    assert report.ok
    assert any("array names and dtypes from the audit line are not authenticated" in n
               for n in report.notes)


def test_a_signed_header_binds_the_records_only_when_a_trusted_key_checks_it(tmp_path, keydir):
    path = _save(tmp_path / "s.wtxt", keydir)
    with pytest.raises(FormatError, match="no verified signature covers the header"):
        wtxt.load(path, hmac_key=keydir / "hmac.key", require_hmac=True)
    assert wtxt.load(path, **_keys(keydir, require_hmac=True))["enc-weight"][0] == 1.0


def test_files_without_records_are_written_as_before(tmp_path, keydir):
    plain = {"a": np.ones(3, np.float32), "b": np.zeros(2, np.int64)}
    path = _save(tmp_path / "p.wtxt", keydir, state=plain, audit='note="run 7"')
    assert AUDIT_CAP.encode() not in path.read_bytes()
    assert wtxt.verify(path, **_keys(keydir, require_signature=True, require_hmac=True)).ok


def test_delta_apply_rebuilds_the_binding_byte_for_byte(tmp_path, keydir):
    base = _save(tmp_path / "a.wtxt", keydir)
    target = _save(tmp_path / "b.wtxt", keydir, state=_state(3.0))
    delta = tmp_path / "ab.wtxtdelta"
    make_delta(base, target, delta)
    out = tmp_path / "out.wtxt"
    apply_delta(base, delta, out)
    assert out.read_bytes() == target.read_bytes()


def test_the_dtype_note_says_whether_a_verified_signature_covers_the_record(tmp_path, keydir):
    path = _save(tmp_path / "s.wtxt", keydir)
    bound = "comes from metadata (snapops_dtypes) covered by the verified signature"
    unbound = "comes from unbound metadata (snapops_dtypes)"
    notes = wtxt.verify(path, **_keys(keydir)).notes
    assert any(bound in n for n in notes) and not any(unbound in n for n in notes)
    assert bound in wtxt.load(path, **_keys(keydir)).meta["snapops_dtypes_note"]
    unchecked = wtxt.load(path, hmac_key=keydir / "hmac.key")     # no trusted key
    assert unbound in unchecked.meta["snapops_dtypes_note"]
    assert any(unbound in n for n in wtxt.verify(path).notes)
    assert "snapops_dtypes_bound" not in wtxt.load(path, **_keys(keydir)).meta


def test_a_format_that_cannot_sign_never_claims_a_covered_record(tmp_path):
    from snapops.formats import finf

    path = tmp_path / "s.finf"
    finf.save(_state(), path, gen=3, ts=TS)            # bf16 recorded in FINF's tree
    report = finf.verify(path)
    report.details["snapops_dtypes_bound"] = True    # whatever a report or file might say
    finf.FORMAT._note_logical(str(path), report)
    assert any("comes from unbound metadata" in n for n in report.notes)
    assert not any("covered by the verified signature" in n for n in report.notes)
