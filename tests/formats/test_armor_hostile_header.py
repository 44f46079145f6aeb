"""Hostile age headers are refused before pyrage works on them: an scrypt work factor over the
cap (pyrage would try up to 2^22, a 4 GiB allocation), a header over 64 KiB (pyrage's parse
cost grows with its square: 1 MB took 35 s), input that is not age at all, and pyrage's own
messages arrive on one line. Every case is built by hand and costs milliseconds."""

from __future__ import annotations

import base64
import io
import os

import pyrage
import pytest

from snapops.cli import main
from snapops.formats import armor
from snapops.formats.armor import ArmorEncoder
from snapops.formats.errors import DecryptionError, FormatError, LimitError, TruncatedError

MAGIC = b"age-encryption.org/v1\n"


def b64(data: bytes) -> bytes:
    return base64.b64encode(data).rstrip(b"=")


def age_file(stanzas: bytes, payload: bytes = bytes(32)) -> bytes:
    """A binary age file with these stanzas, a random MAC and ``payload`` after the header."""
    return MAGIC + stanzas + b"--- " + b64(os.urandom(32)) + b"\n" + payload


def scrypt_stanza(work_factor: bytes) -> bytes:
    return b"-> scrypt " + b64(os.urandom(16)) + b" " + work_factor + b"\n" \
        + b64(os.urandom(32)) + b"\n"


def x25519_stanzas(count: int) -> bytes:
    return b"".join(b"-> X25519 " + b64(os.urandom(32)) + b"\n" + b64(os.urandom(32)) + b"\n"
                    for _ in range(count))


def armored(binary: bytes) -> bytes:
    encoder = ArmorEncoder()
    return encoder.feed(binary) + encoder.finish()


def decrypt(data: bytes, identities=(), **kwargs) -> io.BytesIO:
    reader = io.BytesIO(data)
    armor.decrypt_io(reader, io.BytesIO(), identities, name="x.age", **kwargs)
    return reader


@pytest.fixture(scope="module")
def identity():
    return pyrage.x25519.Identity.generate()


@pytest.mark.parametrize("work_factor, cap, shown", [
    (b"40", armor.MAX_WORK_FACTOR, "40"),
    (b"1" + b"0" * 5000, armor.MAX_WORK_FACTOR, "1000 or more"),  # past int()'s 4300 digits
    (b"12", 11, "12"),  # an explicit cap below what pyrage itself would allow
])
@pytest.mark.parametrize("wrap", [bytes, armored])
def test_scrypt_work_factor_over_the_cap_is_refused_before_any_work(work_factor, cap, shown,
                                                                      wrap):
    data = wrap(age_file(scrypt_stanza(work_factor)))
    with pytest.raises(LimitError, match=r"scrypt work factor too high") as info:
        decrypt(data, passphrase="pw", max_work_factor=cap)
    assert str(info.value) == (f"x.age:@22: [limit] scrypt work factor too high in the age "
                               f"header; expected at most {cap}, got {shown}")


def test_scrypt_work_factor_at_the_cap_reaches_pyrage():
    # 2^10 scrypt is a millisecond: the file gets as far as the passphrase check
    with pytest.raises(DecryptionError, match=r"^x\.age: wrong passphrase$"):
        decrypt(age_file(scrypt_stanza(b"10")), passphrase="pw", max_work_factor=10)


def test_cli_refuses_a_huge_scrypt_work_factor_on_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "x.age").write_bytes(armored(age_file(scrypt_stanza(b"40"))))
    monkeypatch.setenv("SNAPOPS_TEST_PASSPHRASE", "pw")
    assert main(["decrypt", str(tmp_path / "x.age"), str(tmp_path / "out"),
                 "--passphrase-env", "SNAPOPS_TEST_PASSPHRASE"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x.age:@22: [limit] scrypt work factor too high" in err
    assert sorted(os.listdir(tmp_path)) == ["x.age"]


@pytest.mark.parametrize("stanzas", [
    lambda: x25519_stanzas(2000),                        # ~200 KB of recipients
    lambda: b"-> junk\n" + (b"A" * 64 + b"\n") * 20_000,  # one stanza body of 1.3 MB
    lambda: b"-> junk " + b"A" * 10_000_000 + b"\n\n",    # one argument line of 10 MB
], ids=["recipients", "body", "argument"])
@pytest.mark.parametrize("wrap", [bytes, armored])
def test_header_over_64_kib_is_refused_after_reading_little(identity, stanzas, wrap):
    data = wrap(age_file(stanzas()))
    with pytest.raises(LimitError, match=r"^x\.age:@65536: \[limit\] age header too large"):
        reader = io.BytesIO(data)
        armor.decrypt_io(reader, io.BytesIO(), [identity], name="x.age")
    assert reader.tell() < 512 * 1024


def test_many_real_recipients_within_the_limit_still_decrypt():
    identities = [pyrage.x25519.Identity.generate() for _ in range(300)]
    sealed = io.BytesIO()
    armor.encrypt_io(io.BytesIO(b"weights"), sealed, [str(i.to_public()) for i in identities])
    out = io.BytesIO()
    armor.decrypt_io(io.BytesIO(sealed.getvalue()), out, [identities[-1]])
    assert out.getvalue() == b"weights"


@pytest.mark.parametrize("content, got", [
    (b"", "got an empty file"),
    (b"  \n\t\n", r"got b'  \n\t\n'"),
    (b"-----BEGIN PGP MESSAGE-----\n\n-----END PGP MESSAGE-----\n", "got b'-----BEGIN PGP"),
    (b"age-encryption.org/v2\n--- x\n", "got b'age-encryption.org/v2"),
])
def test_input_that_is_not_age_names_offset_and_expectation(tmp_path, identity, content, got):
    (tmp_path / "x.age").write_bytes(content)
    with pytest.raises(FormatError, match=r"\[grammar\] not a valid age file; expected "
                                          r"'age-encryption.org/v1' or an armored") as info:
        armor.decrypt_file(tmp_path / "x.age", tmp_path / "out", passphrase="pw")
    assert str(info.value).startswith(f"{tmp_path / 'x.age'}:@0: ")
    assert got in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["x.age"]


@pytest.mark.parametrize("wrap", [bytes, armored])
def test_header_without_mac_line_is_truncated(identity, wrap):
    with pytest.raises(TruncatedError, match=r"^x\.age:@119: \[truncated\] age header ends "
                                             r"early; expected a '---' MAC line"):
        decrypt(wrap(MAGIC + x25519_stanzas(1)[:-1]), [identity])


def test_pyrage_messages_arrive_on_one_line(identity):
    # pyrage's message here is two lines ("Unknown age format.\nHave you tried upgrading...")
    with pytest.raises(DecryptionError, match=r"Unknown age format\. Have you tried") as info:
        decrypt(age_file(b"hello\n"), [identity])
    assert "\n" not in str(info.value) and "\u2068" not in str(info.value)
