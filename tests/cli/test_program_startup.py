"""The snapops program starts numpy with one OpenBLAS thread (it runs no large BLAS work and the
thread start costs every hook and command 0.1 CPU-s); a script importing the library keeps
its own settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from snapops import runs_as_the_program

PROBE = ("import sys\n{prelude}\nimport snapops, os\n"
         "print(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules)\n")


@pytest.mark.parametrize(("argv", "orig_argv", "expected"), [
    (["/venv/bin/snapops", "verify"], ["/venv/bin/python", "/venv/bin/snapops", "verify"], True),
    (["/repo/snapops/__main__.py", "hook"], ["python", "-m", "snapops", "hook"], True),
    (["-m"], ["python", "-X", "importtime", "-m", "snapops"], True),
    (["train.py"], ["python", "train.py"], False),
    (["-m"], ["python", "-m", "trainer.snapops"], False),
    (["/x/pytest"], ["python", "-m", "pytest", "-m", "snapops"], False),
    ([], [], False),
])
def test_the_program_is_told_from_a_script(argv, orig_argv, expected):
    assert runs_as_the_program(argv, orig_argv) is expected


def probe(prelude: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    return subprocess.run([sys.executable, "-c", PROBE.format(prelude=prelude)], env=env,
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def test_the_program_gets_one_blas_thread_and_a_script_keeps_its_own():
    assert probe("sys.argv[0] = '/venv/bin/snapops'") == "1 True"
    assert probe("") == "None True"
    assert probe("import numpy; sys.argv[0] = '/venv/bin/snapops'") == "None True"


def test_version_loads_no_command():
    code = ("import sys\nfrom snapops.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as exc:\n    code = exc.code\n"
            "print(code, sorted(m for m in sys.modules if m.startswith('snapops.cli.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.startswith("snapops ")
    assert out.stdout.splitlines()[-1] == "0 ['snapops.cli._common']"


def test_detecting_a_format_imports_only_the_formats_sniffed_before_it(tmp_path):
    """Hooks and CLI calls detect every file's format: a WTXT file must not pay for importing
    the other formats' modules (0.3 s of every ``snapops verify`` before)."""
    import numpy as np

    import snapops

    snapops.save({"a": np.arange(4, dtype=np.float32)}, tmp_path / "x.wtxt")
    code = ("import sys\nfrom snapops.formats.registry import HANDLER_MODULES, detect\n"
            f"print(detect({str(tmp_path / 'x.wtxt')!r}).name, sorted(set(HANDLER_MODULES.values())"
            " & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["wtxt", "['snapops.formats.wtxt']"]


def test_the_git_child_guard_runs_on_the_standard_library_alone(tmp_path):
    """The guard is started as ``python -I -S procgroup.py`` (no site-packages, no snapops):
    it ends when its channel closes, and ends a registered group with it."""
    import socket

    from snapops.formats import procgroup

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        guard = subprocess.Popen([sys.executable, "-I", "-S", procgroup.__file__],
                                 stdin=theirs.fileno(), stderr=subprocess.PIPE)
    sleeper = subprocess.Popen(["sleep", "60"], process_group=0)
    try:
        socket.send_fds(ours, [f"+{sleeper.pid}".encode()], [])
        ours.close()                                   # the owner is gone
        assert guard.wait(timeout=30) == 0, guard.stderr.read()
        assert sleeper.wait(timeout=10) == -15         # ended by SIGTERM, a leaf first
    finally:
        sleeper.kill()
        guard.kill()
        guard.stderr.close()
