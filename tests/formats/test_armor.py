"""age ASCII armor: interop with the real `age` CLI both ways, strict armor grammar, typed errors,
bounded memory, and the `snapops encrypt` / `snapops decrypt` commands.

Needs /usr/bin/age, age-keygen (Debian `age`), ssh-keygen (`openssh-client`) and setsid
(`util-linux`, gives age a terminal for its passphrase prompt). Nothing is skipped.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pty
import random
import select
import subprocess
import sys
from pathlib import Path

import pyrage
import pytest

from snapops.cli import main
from snapops.formats import armor
from snapops.formats.armor import BEGIN, END, ArmorDecoder, ArmorEncoder
from snapops.formats.errors import (
    DecryptionError, FormatError, KeyMaterialError, LimitError, TruncatedError,
)

AGE, AGE_KEYGEN, SSH_KEYGEN = "/usr/bin/age", "/usr/bin/age-keygen", "/usr/bin/ssh-keygen"


def sh(*cmd, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, timeout=120,
                          **kwargs)


def age_key(folder: Path, name: str = "age.key") -> tuple[Path, str]:
    """A fresh age identity file made by age-keygen, and its recipient."""
    path = folder / name
    sh(AGE_KEYGEN, "-o", path)
    return path, sh(AGE_KEYGEN, "-y", path).stdout.decode().strip()


def ssh_key(folder: Path, name: str = "id_ed25519") -> tuple[Path, str]:
    path = folder / name
    sh(SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "ci@snapops", "-f", path)
    return path, (folder / f"{name}.pub").read_text().strip()


def age_decrypt(src: Path, identity: Path) -> bytes:
    return sh(AGE, "-d", "-i", identity, src).stdout


def write_random(path: Path, size: int, seed: int = 0) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


def reference_armor(binary: bytes) -> bytes:
    """The armor as the spec draws it, built the slow obvious way (48 bytes per line)."""
    lines = [base64.b64encode(binary[i:i + 48]) for i in range(0, len(binary), 48)]
    return b"\n".join([BEGIN, *lines, END]) + b"\n"


def armor_whole(binary: bytes, piece: int = 65552) -> bytes:
    enc = ArmorEncoder()
    return b"".join(enc.feed(binary[i:i + piece]) for i in range(0, len(binary), piece)) \
        + enc.finish()


def dearmor(text: bytes, piece: int | None = None) -> bytes:
    dec = ArmorDecoder("t.age")
    piece = piece or max(1, len(text))
    return b"".join(dec.feed(text[i:i + piece]) for i in range(0, len(text), piece)) \
        + dec.finish()


@pytest.fixture
def key(tmp_path) -> tuple[Path, str]:
    return age_key(tmp_path)


# --- sans-IO armor -----------------------------------------------------------------------------

EDGE_SIZES = [*range(0, 100), armor.BLOCK_BYTES - 1, armor.BLOCK_BYTES, armor.BLOCK_BYTES + 1,
              3 * armor.BLOCK_BYTES + 47, 200_003]


@pytest.mark.parametrize("size", EDGE_SIZES)
def test_encoder_matches_reference_and_round_trips(size):
    binary = random.Random(size).randbytes(size)
    text = armor_whole(binary)
    assert text == reference_armor(binary)
    assert max(map(len, text.splitlines())) <= 64
    assert dearmor(text) == binary


@pytest.mark.parametrize("piece", [1, 7, 64, 65, 66, 4096, 1 << 20])
@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_decoder_gives_the_same_for_any_split(piece, eol):
    binary = random.Random(piece).randbytes(3_000 if piece == 1 else 300_007)
    text = armor_whole(binary).replace(b"\n", eol)
    assert dearmor(text, piece) == binary
    assert dearmor(b"\n \t\n" + text + b"  \n\n", piece) == binary  # whitespace around


def test_decoder_accepts_missing_final_newline_and_line_of_exactly_48_bytes():
    for binary in (b"x" * 96, b"x" * 95):
        assert dearmor(reference_armor(binary).rstrip(b"\n")) == binary


GOOD = reference_armor(bytes(range(200)))  # 4 full lines, then one of 8 bytes
LINES = GOOD.split(b"\n")


def mangle(line_no: int, new: bytes) -> bytes:
    lines = list(LINES)
    lines[line_no - 1] = new
    return b"\n".join(lines)


@pytest.mark.parametrize("text, error, line", [
    (mangle(1, b"-----BEGIN AGE ENCRYPTED FILE----"), FormatError, 1),
    (mangle(1, b" " + BEGIN), FormatError, 1),
    (mangle(3, LINES[2] + b"AAAA"), FormatError, 3),               # 68 columns, valid base64
    (mangle(3, LINES[2][:-1] + b"*"), FormatError, 3),             # not base64
    (mangle(3, LINES[2][:60]), FormatError, 4),                    # short line not last
    (mangle(3, LINES[2][:-4] + b"QQ=="), FormatError, 4),          # padding mid-stream
    (mangle(6, b"QR=="), FormatError, 6),                          # non-canonical bits
    (mangle(7, b"-----END AGE ENCRYPTED FILE"), FormatError, 7),
    (GOOD + b"junk\n", FormatError, 8),
    (GOOD[: GOOD.index(END)], TruncatedError, 6),
    (GOOD[: len(BEGIN) + 100], TruncatedError, 3),                 # cut mid-line
    (b"", TruncatedError, 0),
    (b"\n" * 1100 + GOOD, LimitError, 1025),
    (GOOD + b" " * 1100, LimitError, 7),
    (b"A" * 200, FormatError, 1),
])
def test_decoder_rejects_with_typed_error_naming_the_line(text, error, line):
    for piece in (None, 1, 70):
        with pytest.raises(error, match=r"\[(grammar|limit|truncated)\]") as info:
            dearmor(text, piece)
        assert info.value.line == line
        assert str(info.value).startswith(f"t.age:{line}:")


def test_is_armored():
    assert armor.is_armored(b"\r\n  " + GOOD[:50])
    assert not armor.is_armored(b"age-encryption.org/v1\n-> X25519 ")
    assert not armor.is_armored(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")


# --- interop with the age CLI --------------------------------------------------------------------


@pytest.mark.parametrize("size", list(range(48)) + [65536, 65537, 200_003])
def test_age_cli_decrypts_what_we_encrypt(tmp_path, key, size):
    # A single-recipient header has a fixed length, so sizes 0..47 give every armor tail shape:
    # short last line, full last line, and a 64-column last line with padding.
    identity, recipient = key
    data = write_random(tmp_path / "plain", size, seed=size)
    armor.encrypt_file(tmp_path / "plain", tmp_path / "c.age", [recipient])
    text = (tmp_path / "c.age").read_bytes()
    assert text.startswith(BEGIN + b"\n") and text.endswith(END + b"\n")
    assert all(len(line) == 64 for line in text.splitlines()[1:-2])
    assert age_decrypt(tmp_path / "c.age", identity) == data


@pytest.mark.parametrize("size", [0, 1, 47, 48, 65536, 300_001])
@pytest.mark.parametrize("armored", [True, False])
def test_we_decrypt_what_age_cli_encrypts(tmp_path, key, size, armored):
    identity, recipient = key
    data = write_random(tmp_path / "plain", size, seed=size)
    sh(AGE, *(["-a"] if armored else []), "-r", recipient, "-o", tmp_path / "c.age",
       tmp_path / "plain")
    armor.decrypt_file(tmp_path / "c.age", tmp_path / "out", identity)
    assert (tmp_path / "out").read_bytes() == data
    assert (tmp_path / "out").stat().st_mode & 0o077 == 0


def test_several_recipients_each_identity_decrypts(tmp_path):
    keys = [age_key(tmp_path, f"k{i}.key") for i in range(3)]
    data = write_random(tmp_path / "plain", 100_000)
    armor.encrypt_file(tmp_path / "plain", tmp_path / "c.age", [r for _, r in keys])
    for identity, _ in keys:
        assert age_decrypt(tmp_path / "c.age", identity) == data
        armor.decrypt_file(tmp_path / "c.age", tmp_path / "out", identity)
        assert (tmp_path / "out").read_bytes() == data


def test_ssh_ed25519_recipient_both_ways(tmp_path, key):
    ssh_identity, ssh_recipient = ssh_key(tmp_path)
    identity, recipient = key
    data = write_random(tmp_path / "plain", 70_000)
    armor.encrypt_file(tmp_path / "plain", tmp_path / "c.age", [ssh_recipient, recipient])
    assert age_decrypt(tmp_path / "c.age", ssh_identity) == data
    assert age_decrypt(tmp_path / "c.age", identity) == data
    sh(AGE, "-a", "-R", f"{ssh_identity}.pub", "-o", tmp_path / "d.age", tmp_path / "plain")
    for source in ("c.age", "d.age"):
        armor.decrypt_file(tmp_path / source, tmp_path / "out", ssh_identity)
        assert (tmp_path / "out").read_bytes() == data


@pytest.mark.slow
def test_passphrase_both_ways_with_age_cli(tmp_path):
    data = write_random(tmp_path / "plain", 5_000)
    armor.encrypt_file(tmp_path / "plain", tmp_path / "c.age", passphrase="correct horse")
    age_with_terminal(["-d", "-o", tmp_path / "out", tmp_path / "c.age"], "correct horse")
    assert (tmp_path / "out").read_bytes() == data
    age_with_terminal(["-p", "-a", "-o", tmp_path / "d.age", tmp_path / "plain"], "battery")
    out = io.BytesIO()
    with open(tmp_path / "d.age", "rb") as src:
        armor.decrypt_io(src, out, passphrase="battery")
    assert out.getvalue() == data
    with pytest.raises(DecryptionError, match="wrong passphrase"):
        armor.decrypt_file(tmp_path / "d.age", tmp_path / "bad", passphrase="staple")
    assert not (tmp_path / "bad").exists()


def age_with_terminal(args: list, passphrase: str) -> None:
    """Run age on a pseudo-terminal (it reads passphrases only from /dev/tty) and answer."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["setsid", "-w", "-c", AGE, *map(str, args)],
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    transcript, answered = b"", 0
    try:
        while select.select([master], [], [], 60)[0]:
            try:
                chunk = os.read(master, 1024)
            except OSError:  # EIO: age exited and closed the terminal
                break
            if not chunk:
                break
            transcript += chunk
            while transcript.count(b"passphrase") > answered:
                os.write(master, passphrase.encode() + b"\n")
                answered += 1
        assert proc.wait(timeout=60) == 0, transcript
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- typed errors --------------------------------------------------------------------------------


def test_wrong_identity_is_a_typed_error_and_leaves_nothing(tmp_path, key):
    _, recipient = key
    other, _ = age_key(tmp_path, "other.key")
    write_random(tmp_path / "plain", 1000)
    armor.encrypt_file(tmp_path / "plain", tmp_path / "c.age", [recipient])
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(DecryptionError, match="no identity matches a recipient") as info:
        armor.decrypt_file(tmp_path / "c.age", tmp_path / "out", other)
    assert str(tmp_path / "c.age") in str(info.value)
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temp file


def small_armored(tmp_path, key) -> bytes:
    _, recipient = key
    out = io.BytesIO()
    armor.encrypt_io(io.BytesIO(b"snapshot " * 20), out, [recipient])
    return out.getvalue()


def decrypt_bytes(text: bytes, identities) -> bytes:
    out = io.BytesIO()
    armor.decrypt_io(io.BytesIO(text), out, identities, name="c.age")
    return out.getvalue()


def test_truncation_at_every_offset_is_a_typed_error(tmp_path, key):
    text = small_armored(tmp_path, key)
    identities = armor.load_identities(key[0])
    assert decrypt_bytes(text, identities) == b"snapshot " * 20
    assert decrypt_bytes(text[:-1], identities) == b"snapshot " * 20  # only the final LF gone
    for cut in range(len(text) - 1):
        with pytest.raises((TruncatedError, FormatError, DecryptionError),
                           match=r"armor ends early|not a valid age file|\[[a-z_]+\]"):
            decrypt_bytes(text[:cut], identities)


def test_bit_flip_at_every_offset_is_a_typed_error(tmp_path, key):
    text = small_armored(tmp_path, key)
    identities = armor.load_identities(key[0])
    for offset in range(len(text)):
        flipped = bytearray(text)
        flipped[offset] ^= 1
        with pytest.raises((FormatError, DecryptionError),
                           match=r"not a valid age file|no identity matches|failed "
                                 r"authentication|\[[a-z0-9_]+\]"):
            decrypt_bytes(bytes(flipped), identities)


def test_well_formed_armor_around_truncated_payload_fails_authentication(tmp_path, key):
    identity, recipient = key
    binary = pyrage.encrypt(bytes(200_000), [pyrage.x25519.Recipient.from_str(recipient)])
    cut = len(binary) - (200_000 % 65536) - 16  # drop the whole last (short) chunk
    with pytest.raises(DecryptionError, match="failed authentication"):
        decrypt_bytes(armor_whole(binary[:cut]), armor.load_identities(identity))


def test_corrupted_armor_names_file_and_line(tmp_path, key):
    identity, recipient = key
    write_random(tmp_path / "plain", 10_000)
    armor.encrypt_file(tmp_path / "plain", tmp_path / "c.age", [recipient])
    lines = (tmp_path / "c.age").read_bytes().split(b"\n")
    lines[9] = lines[9][:30] + b"*" + lines[9][31:]
    (tmp_path / "c.age").write_bytes(b"\n".join(lines))
    with pytest.raises(FormatError, match=r"\[grammar\] invalid base64") as info:
        armor.decrypt_file(tmp_path / "c.age", tmp_path / "out", identity)
    assert info.value.line == 10
    assert str(info.value).startswith(f"{tmp_path / 'c.age'}:10: [grammar] invalid base64")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad, message", [
    ("age1qqqq", "invalid recipient 'age1qqqq'"),
    ("pgp:0xDEAD", "unsupported recipient 'pgp:0xDEAD'"),
    ("ssh-ed25519 AAAAnotakey", "invalid recipient 'ssh-ed25519 AAAAnotakey'"),
])
def test_bad_recipient_is_named(bad, message):
    with pytest.raises(KeyMaterialError, match=message):
        armor.encrypt_io(io.BytesIO(b"x"), io.BytesIO(), [bad])


def test_secret_key_as_recipient_is_refused_without_echo(key):
    secret = [line for line in key[0].read_text().splitlines() if line.startswith("AGE-")][0]
    with pytest.raises(KeyMaterialError, match=r"a secret key was given as") as info:
        armor.parse_recipient(secret)
    assert secret not in str(info.value) and "secret key" in str(info.value)


def test_identity_file_format(tmp_path, key):
    identity, recipient = key
    second, _ = age_key(tmp_path, "second.key")
    both = tmp_path / "both.key"
    both.write_text(f"# two keys\n\n{identity.read_text()}\n  {second.read_text()}")
    assert len(armor.load_identities(both)) == 2
    secret = identity.read_text().splitlines()[-1]
    broken = tmp_path / "broken.key"
    broken.write_text(f"# comment\n{secret[:-3]}xyz\n")
    with pytest.raises(KeyMaterialError, match="broken.key:2: malformed") as info:
        armor.load_identities(broken)
    assert secret[:20] not in str(info.value)
    for content, message in [("", "no identities"), ("hello\n", ":1: expected an age secret"),
                             (GOOD.decode(), "passphrase-protected")]:
        broken.write_text(content)
        with pytest.raises(KeyMaterialError, match=message):
            armor.load_identities(broken)
    with pytest.raises(KeyMaterialError, match="cannot read"):
        armor.load_identities(tmp_path / "missing.key")
    sh(SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "hunter2", "-f", tmp_path / "locked")
    with pytest.raises(KeyMaterialError, match="locked: unusable SSH private key"):
        armor.load_identities(tmp_path / "locked")


def test_passphrase_mode_is_bounded_and_exclusive(key):
    with pytest.raises(LimitError, match=r"\[limit\] passphrase mode holds the input"):
        armor.encrypt_io(io.BytesIO(bytes(5000)), io.BytesIO(), passphrase="pw",
                         max_passphrase_bytes=4096)
    with pytest.raises(KeyMaterialError, match="not both"):
        armor.encrypt_io(io.BytesIO(b"x"), io.BytesIO(), [key[1]], passphrase="pw")
    with pytest.raises(KeyMaterialError, match="empty"):
        armor.encrypt_io(io.BytesIO(b"x"), io.BytesIO(), passphrase="")


def test_reader_and_writer_errors_surface_unchanged(key):
    class Failing(io.RawIOBase):
        def readable(self):
            return True

        def read(self, n=-1):
            raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output error") as info:
        armor.encrypt_io(Failing(), io.BytesIO(), [key[1]])
    assert not isinstance(info.value, pyrage.EncryptError)

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        armor.encrypt_io(io.BytesIO(bytes(300_000)), Full(), [key[1]])


# --- bounded memory ------------------------------------------------------------------------------

MEMORY_PROBE = """
import hashlib, json, os, resource, sys
from snapops.formats import armor
folder, recipient, identity = sys.argv[1:4]
plain, sealed, back = (os.path.join(folder, n) for n in ("plain", "sealed.age", "back"))
with open(plain, "wb") as out:
    for _ in range(64):
        out.write(os.urandom(1 << 20))
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()
base = peak()
armor.encrypt_file(plain, sealed, [recipient])
encrypt_peak = peak() - base
armor.decrypt_file(sealed, back, identity)
print(json.dumps({"encrypt_peak": encrypt_peak, "decrypt_peak": peak() - base,
                  "same": digest(plain) == digest(back), "sealed": os.path.getsize(sealed)}))
"""


@pytest.mark.slow
def test_64mib_round_trip_in_bounded_memory(tmp_path, key):
    identity, recipient = key
    result = json.loads(sh(sys.executable, "-c", MEMORY_PROBE, tmp_path, recipient,
                           identity).stdout)
    assert result["same"]
    assert result["sealed"] > 64 * 2**20 * 4 // 3
    # ru_maxrss growth over a baseline taken after imports: the whole input would be 64 MiB.
    assert result["encrypt_peak"] < 16 * 2**20, result
    assert result["decrypt_peak"] < 16 * 2**20, result
    assert age_decrypt(tmp_path / "sealed.age", identity)[-10:] == \
        (tmp_path / "back").read_bytes()[-10:]


def test_progress_counts_every_input_byte(tmp_path, key):
    identity, recipient = key
    data = random.Random(3).randbytes(500_000)
    seen: list[int] = []
    sealed = io.BytesIO()
    armor.encrypt_io(io.BytesIO(data), sealed, [recipient], progress=seen.append)
    assert sum(seen) == len(data) and len(seen) > 1
    seen.clear()
    armor.decrypt_io(io.BytesIO(sealed.getvalue()), io.BytesIO(),
                     armor.load_identities(identity), progress=seen.append)
    assert sum(seen) == len(sealed.getvalue())


# --- command line --------------------------------------------------------------------------------


def test_cli_round_trip_and_wrong_identity(tmp_path, key, capsys):
    identity, recipient = key
    other, other_recipient = age_key(tmp_path, "other.key")
    (tmp_path / "recipients.txt").write_text(f"# team\n{other_recipient}\n")
    data = write_random(tmp_path / "plain", 123_456)
    assert main(["encrypt", str(tmp_path / "plain"), str(tmp_path / "c.age"),
                 "--recipient", recipient, "--recipients-file",
                 str(tmp_path / "recipients.txt")]) == 0
    assert age_decrypt(tmp_path / "c.age", other) == data
    assert main(["decrypt", str(tmp_path / "c.age"), str(tmp_path / "out"),
                 "--identity", str(identity)]) == 0
    assert (tmp_path / "out").read_bytes() == data
    capsys.readouterr()
    stranger, _ = age_key(tmp_path, "stranger.key")
    assert main(["decrypt", str(tmp_path / "c.age"), str(tmp_path / "nope"),
                 "--identity", str(stranger)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("snapops: error: ")
    assert "no identity matches" in err and not (tmp_path / "nope").exists()


@pytest.mark.parametrize("argv, message", [
    (["encrypt", "{plain}", "{out}"], "give --recipient"),
    (["encrypt", "{plain}", "{out}", "-r", "age1nope"], "invalid recipient 'age1nope'"),
    (["encrypt", "{tmp}/missing", "{out}", "-r", "{recipient}"], "missing: No such file"),
    (["encrypt", "{plain}", "{out}", "--passphrase-env", "SNAPOPS_TEST_UNSET"],
     "SNAPOPS_TEST_UNSET is not set"),
    (["decrypt", "{plain}", "{out}"], "give --identity"),
    (["decrypt", "{plain}", "{out}", "-i", "{plain}"], "expected an age secret key"),
    (["decrypt", "{plain}", "{out}", "-i", "{identity}"], "not a valid age file"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, key, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("SNAPOPS_TEST_UNSET", raising=False)
    (tmp_path / "plain").write_text("not an age file\n")
    fields = dict(tmp=tmp_path, plain=tmp_path / "plain", out=tmp_path / "out",
                  identity=key[0], recipient=key[1])
    assert main([arg.format(**fields) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_cli_passphrase_env_and_stdio(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SNAPOPS_TEST_PASSPHRASE", "hunter2 hunter2")
    data = write_random(tmp_path / "plain", 10_000)
    assert main(["encrypt", str(tmp_path / "plain"), "-",
                 "--passphrase-env", "SNAPOPS_TEST_PASSPHRASE"]) == 0
    sealed = capsys.readouterr().out.encode()
    assert armor.is_armored(sealed)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(sealed)))
    assert main(["decrypt", "-", str(tmp_path / "out"),
                 "--passphrase-env", "SNAPOPS_TEST_PASSPHRASE"]) == 0
    assert (tmp_path / "out").read_bytes() == data


def test_cli_pipes_through_stdin_and_stdout(tmp_path, key):
    identity, recipient = key
    data = random.Random(1).randbytes(300_000)
    cli = [sys.executable, "-m", "snapops"]
    sealed = sh(*cli, "encrypt", "-", "-", "-r", recipient, input=data).stdout
    assert sealed.startswith(BEGIN)
    assert sh(*cli, "decrypt", "-", "-", "-i", identity, input=sealed).stdout == data


@pytest.mark.parametrize("command", ["encrypt", "decrypt"])
def test_cli_help_ends_with_example(command, capsys):
    with pytest.raises(SystemExit, match=r"^0$") as info:
        main([command, "--help"])
    assert info.value.code == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.strip().startswith(f"snapops {command} ")

