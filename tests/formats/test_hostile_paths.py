"""Hostile paths: a FIFO, a device, a socket or a folder where a snapshot should be, and path
arguments that are no paths at all. Each is a typed one-line error at once: never a hang,
never an unbounded read, never a bare TypeError/ValueError/OSError/MemoryError.

The calls that could hang (a FIFO blocks ``open()``) or read without end (``/dev/zero``) run
in a subprocess with a timeout and an address-space limit, so a regression fails here
instead of hanging the suite or exhausting the machine's memory.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import snapops
from snapops.formats.errors import ConfigError, DataError, FormatError, KeyMaterialError
from snapops.formats.iosafe import open_input, open_regular, user_path
from snapops.formats.registry import HANDLER_MODULES

SUFFIXES = [".wtxt", ".aero", ".aeroset.json", ".fold", ".finf", ".pycauset", ".npz",
            ".safetensors", ".pt", ".bin"]
TIMEOUT = 60
ADDRESS_SPACE = 6 << 30     # an unbounded read of /dev/zero fails fast instead of eating RAM
LIMIT = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, " \
        f"{ADDRESS_SPACE}))\n"


def run_isolated(cwd, code: str, *args: str, timeout: float = TIMEOUT
                 ) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter in ``cwd``; a hang is a test failure, not a hung
    suite."""
    try:
        return subprocess.run([sys.executable, "-c", LIMIT + textwrap.dedent(code), *args],
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s (a FIFO or a device was opened and read)")


# Each verb on each path: one JSON line, the error's type and message (or the Report's).
# argv: "front" (snapops.load/verify/inspect) or "handlers" (every format's own reader), paths.
VERBS = """
import json, sys
import snapops
from snapops.formats.registry import HANDLER_MODULES, handler
mode, paths = sys.argv[1], sys.argv[2:]
callers = [("", snapops)] if mode == "front" else [(n + ".", handler(n)) for n in HANDLER_MODULES]
for path in paths:
    for prefix, api in callers:
        for verb in ("load", "verify", "inspect"):
            try:
                out = getattr(api, verb)(path)
                failure = getattr(out, "failure", None)
                row = ["report", type(failure).__name__, str(failure)]
            except Exception as exc:
                row = ["raised", type(exc).__name__, str(exc)]
            print(json.dumps([prefix + verb, path] + row), flush=True)
"""


def outcomes(proc: subprocess.CompletedProcess) -> list[list[str]]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def assert_refused(rows, expected: str) -> None:
    assert rows
    for verb, path, how, kind, message in rows:
        assert kind == "FormatError", (verb, path, kind, message)
        assert message.startswith(f"{path}: ") and expected in message, (verb, message)
        assert "\n" not in message
        assert how == ("report" if verb == "verify" else "raised"), (verb, how)


def test_a_fifo_is_refused_at_once_by_load_verify_and_inspect(tmp_path):
    for suffix in SUFFIXES:
        os.mkfifo(tmp_path / f"f{suffix}")
    rows = outcomes(run_isolated(tmp_path, VERBS, "front", *(f"f{s}" for s in SUFFIXES)))
    assert {row[1] for row in rows} == {f"f{suffix}" for suffix in SUFFIXES}
    assert_refused(rows, "not a regular file (a FIFO)")


def test_a_symlink_to_dev_zero_is_refused_not_read_without_end(tmp_path):
    for suffix in SUFFIXES:
        os.symlink("/dev/zero", tmp_path / f"z{suffix}")
    rows = outcomes(run_isolated(tmp_path, VERBS, "front", *(f"z{s}" for s in SUFFIXES)))
    assert {row[1] for row in rows} == {f"z{suffix}" for suffix in SUFFIXES}
    assert_refused(rows, "not a regular file (a device)")


def test_devices_sockets_and_folders_are_refused(tmp_path):
    os.symlink("/dev/urandom", tmp_path / "u.npz")
    os.symlink("/dev/null", tmp_path / "n.wtxt")
    (tmp_path / "d.wtxt").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        cwd = os.getcwd()
        os.chdir(tmp_path)       # a short relative name: AF_UNIX paths are at most 107 bytes
        try:
            sock.bind("s.wtxt")
        finally:
            os.chdir(cwd)
        rows = outcomes(run_isolated(tmp_path, VERBS, "front", "u.npz", "n.wtxt", "d.wtxt",
                                     "s.wtxt"))
    by_path = {}
    for row in rows:
        by_path.setdefault(row[1], []).append(row)
    assert_refused(by_path["u.npz"] + by_path["n.wtxt"], "not a regular file (a device)")
    assert_refused(by_path["d.wtxt"], "not a regular file (a folder)")
    assert_refused(by_path["s.wtxt"], "not a regular file (a socket)")




@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_every_format_reader_refuses_a_fifo_or_device_without_detection(tmp_path, target):
    """Each format's own reader (not only the front door's detection) opens through the one
    helper: a FIFO or a device handed to ``handler(name).load/verify/inspect`` directly."""
    if target == "fifo":
        os.mkfifo(tmp_path / "x")
    else:
        os.symlink(target, tmp_path / "x")
    rows = outcomes(run_isolated(tmp_path, VERBS, "handlers", "x"))
    assert len(rows) == 3 * len(HANDLER_MODULES)
    for verb, _, how, kind, message in rows:
        assert how == "raised" or verb.endswith(".verify"), (verb, how)
        assert kind.endswith("Error") and kind not in ("TypeError", "ValueError", "OSError",
                                                       "MemoryError"), (verb, kind, message)
        # AEROSET also takes a folder: "x" names the folder holding model.aeroset.json
        assert "not a regular file" in message or verb.startswith("aeroset.") and \
            "cannot read: Not a directory" in message, (verb, message)


def test_a_symlink_to_a_regular_file_still_loads(tmp_path):
    snapops.save({"w": np.arange(6, dtype=np.float32)}, tmp_path / "real.npz")
    os.symlink(tmp_path / "real.npz", tmp_path / "link.npz")
    assert snapops.verify(tmp_path / "link.npz").ok
    np.testing.assert_array_equal(snapops.load(tmp_path / "link.npz")["w"], np.arange(6))


CLI = """
import sys
from snapops.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv", [["verify", "f.wtxt"], ["inspect", "f.wtxt"],
                                  ["inspect", "z.npz"], ["convert", "f.wtxt", "out.aero"],
                                  ["verify", "z.npz"], ["diff", "f.wtxt", "z.npz"],
                                  ["textconv", "f.wtxt"]])
def test_cli_refuses_a_fifo_or_device_in_one_line(tmp_path, argv):
    os.mkfifo(tmp_path / "f.wtxt")
    os.symlink("/dev/zero", tmp_path / "z.npz")
    proc = run_isolated(tmp_path, CLI, *argv)
    said = (proc.stdout + proc.stderr).strip()
    assert proc.returncode in (1, 2), said
    assert "Traceback" not in said
    lines = [line for line in said.splitlines() if "not a regular file" in line]
    assert len(lines) == 1 and argv[1] in lines[0], said
    assert not (tmp_path / "out.aero").exists()


KEY = """
import sys
from snapops.formats.errors import KeyMaterialError
from snapops.formats.keys import load_hmac_key
try:
    load_hmac_key(sys.argv[1])
except KeyMaterialError as exc:
    print(exc)
"""


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_key_file_that_is_a_fifo_or_device_is_refused(tmp_path, kind):
    if kind == "fifo":
        os.mkfifo(tmp_path / "h.key")
    else:
        os.symlink(kind, tmp_path / "h.key")
    proc = run_isolated(tmp_path, KEY, "h.key")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("h.key: HMAC key: not a regular file ("), \
        proc.stdout


@pytest.mark.parametrize("oid_last", [0x6F, 0x71])
def test_a_signing_key_whose_bytes_do_not_fit_its_algorithm_is_a_key_error(tmp_path, oid_last):
    """An Ed25519 PKCS#8 key relabelled X448 (1.3.101.111) or Ed448: OpenSSL cannot set it
    up and cryptography raised InternalError, not ValueError (fuzzer, --seed 43)."""
    from snapops.formats.keys import generate_keys, load_signing_key

    generate_keys(tmp_path / "keys")
    pem = (tmp_path / "keys" / "signing.key").read_bytes()
    der = base64.b64decode(b"".join(pem.splitlines()[1:-1]))
    ed25519 = bytes([6, 3, 0x2B, 0x65, 0x70])       # the OID 1.3.101.112
    assert der.count(ed25519) == 1
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"-----BEGIN PRIVATE KEY-----\n"
                    + base64.encodebytes(der.replace(ed25519, ed25519[:4] + bytes([oid_last])))
                    + b"-----END PRIVATE KEY-----\n")
    with pytest.raises(KeyMaterialError, match="not an unencrypted PKCS#8 PEM private key"):
        load_signing_key(bad)
    with pytest.raises(KeyMaterialError, match="bad.key: not an unencrypted PKCS#8"):
        snapops.save({"w": np.zeros(2, np.float32)}, tmp_path / "s.wtxt", sign_key=bad)
    assert not (tmp_path / "s.wtxt").exists()


NOT_PATHS = [None, 7, 1.5, ["x.wtxt"], {"x": 1}, object(), b"x.wtxt"]


@pytest.mark.parametrize("verb", ["load", "verify", "inspect", "save"])
@pytest.mark.parametrize("value", NOT_PATHS, ids=lambda v: type(v).__name__)
def test_a_path_argument_that_is_no_path_is_a_config_error(tmp_path, monkeypatch, verb,
                                                           value):
    monkeypatch.chdir(tmp_path)
    call = (lambda: snapops.save({"w": np.ones(2)}, value)) if verb == "save" else \
        (lambda: getattr(snapops, verb)(value))
    with pytest.raises(ConfigError,
                       match=rf"^path: expected a str or os\.PathLike, got "
                             rf"{type(value).__name__}$"):
        call()


@pytest.mark.parametrize("verb", ["load", "verify", "inspect", "save"])
@pytest.mark.parametrize("value, said", [("a\0b.wtxt", "cannot hold a NUL byte"),
                                         ("x" * 5000 + ".wtxt", "path too long"),
                                         ("\ud800.wtxt", "must be encodable"),
                                         ("", "expected a file name, got an empty string")],
                         ids=["nul", "long", "surrogate", "empty"])
def test_a_path_no_system_call_takes_is_a_config_error_in_one_line(tmp_path, monkeypatch,
                                                                   verb, value, said):
    monkeypatch.chdir(tmp_path)
    call = (lambda: snapops.save({"w": np.ones(2)}, value)) if verb == "save" else \
        (lambda: getattr(snapops, verb)(value))
    with pytest.raises(ConfigError, match=said) as caught:
        call()
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


def test_save_into_a_missing_folder_names_it(tmp_path):
    with pytest.raises(DataError, match=r"x\.wtxt: cannot write: folder .*missing_dir does not "
                                        r"exist$"):
        snapops.save({"w": np.ones(2)}, tmp_path / "missing_dir" / "x.wtxt")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(DataError, match=r"cannot write: .*file is not a folder$"):
        snapops.save({"w": np.ones(2)}, tmp_path / "file" / "x.wtxt")


@pytest.mark.parametrize("fmt", [["wtxt"], {"wtxt": 1}, 3, b"wtxt"],
                         ids=["list", "dict", "int", "bytes"])
def test_save_format_that_is_no_name_is_a_config_error(tmp_path, fmt):
    with pytest.raises(ConfigError, match=r"^format: expected a format name \(wtxt, .*\), "
                                          rf"got {type(fmt).__name__}$"):
        snapops.save({"w": np.ones(2)}, tmp_path / "x.wtxt", format=fmt)


@pytest.mark.parametrize("verb", ["load_generation", "latest_verified"])
@pytest.mark.parametrize("value", [None, 123, b"repo", 1.5, ["repo"]],
                         ids=lambda v: type(v).__name__)
def test_restore_repository_that_is_no_path_is_a_config_error(verb, value):
    with pytest.raises(ConfigError, match=rf"^repository: expected a str or os\.PathLike, "
                                          rf"got {type(value).__name__}$"):
        getattr(snapops, verb)(value, "run1")


def test_restore_repository_with_nul_or_huge_is_a_config_error():
    for value in ("repo\0x", "r" * 5000):
        with pytest.raises(ConfigError, match="expected a repository path or a URL"):
            snapops.load_generation(value, "run1")


def test_open_regular_is_the_daemons_and_leaves_the_descriptor_blocking(tmp_path):
    from snapops.daemon import safeio

    assert safeio.open_regular is open_regular
    (tmp_path / "a").write_bytes(b"abc")
    with open_input(tmp_path / "a") as f:
        assert os.get_blocking(f.fileno()) and f.read() == b"abc"
    os.symlink(tmp_path / "a", tmp_path / "link")
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        open_regular(tmp_path / "link")                 # the daemon's folders: no symlink
    with pytest.raises(FormatError, match=r"link: \[io\] not a regular file"):
        open_input(tmp_path / "link", follow=False)
    os.close(open_regular(tmp_path / "link", follow=True))


def test_user_path_accepts_str_and_pathlike():
    assert user_path("a.wtxt") == "a.wtxt"
    assert user_path(pathlib.Path("d") / "a.wtxt") == "d/a.wtxt"


def test_a_ledger_or_manifest_that_is_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "f.ledger")
    (tmp_path / "snapshots" / "r").mkdir(parents=True)
    os.mkfifo(tmp_path / "snapshots" / "r" / "MANIFEST")
    ledger = run_isolated(tmp_path, CLI, "ledger", "verify", "f.ledger")
    assert ledger.returncode == 1 and "Traceback" not in ledger.stderr
    assert "f.ledger: [io] expected a readable ledger file, got not a regular file (a FIFO)" \
        in ledger.stdout + ledger.stderr
    from snapops.hooks.review.generation import manifest_file_side

    with pytest.raises(ConfigError, match=r"MANIFEST: \[io\] not a regular file \(a FIFO\)"):
        manifest_file_side(tmp_path / "snapshots" / "r" / "MANIFEST")


def test_a_ledger_whose_snapshot_is_a_fifo_is_refused_at_once(tmp_path):
    """The ledger verifier opened the file a line names with a plain open(): a FIFO there (a
    work tree holds whatever was checked out) hung `snapops ledger verify` for ever."""
    from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation

    spec = GenerationSpec(run="r", format="aero", build="b")
    seal_in_ledger(tmp_path, "r", write_generation(tmp_path, spec, 1, "2026-01-01T00:00:00Z",
                                                   {"w": np.ones(4, np.float32)}, None))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # the ledger's root
    argv = ("ledger", "verify", "ledger/r.ledger")
    assert run_isolated(tmp_path, CLI, *argv).returncode == 0
    manifest = tmp_path / "snapshots" / "r" / "MANIFEST"
    manifest.unlink()
    os.mkfifo(manifest)
    proc = run_isolated(tmp_path, CLI, *argv, timeout=20)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "ledger/r.ledger:1: [file] snapshot snapshots/r/MANIFEST cannot be read: " \
        "snapshots/r/MANIFEST: [fileset] not a regular file (a FIFO)" in proc.stdout + proc.stderr


@pytest.mark.parametrize("verb", ["load", "verify", "inspect", "open_lazy", "save"])
def test_a_format_handler_called_directly_checks_its_path_too(verb):
    from snapops.formats.registry import handler

    for name in HANDLER_MODULES:
        call = getattr(handler(name), verb)
        args = ({"w": np.ones(2, np.float32)}, 5) if verb == "save" else (None,)
        with pytest.raises(ConfigError, match=r"^path: expected a str or os.PathLike, got "):
            call(*args)
