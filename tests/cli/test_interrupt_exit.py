"""An interrupted ``snapops`` ends even when a worker thread cannot: Python would join it
forever on the way out (a Ctrl-C can leave a thread pool's lock taken, gh-74174)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    sys.argv[0] = "snapops"                      # this process is the snapops program
    import snapops.cli as cli
    cli.WEDGED_AFTER = 0.5
    held = threading.Lock()
    held.acquire()

    def interrupted(args):
        if sys.argv[1] == "wedged":              # waits for a lock nobody will release
            threading.Thread(target=held.acquire, name="worker").start()
        else:                                    # ends on its own, a moment later
            threading.Thread(target=time.sleep, args=(0.2,), name="worker").start()
        raise KeyboardInterrupt

    atexit.register(lambda: print("exit hooks ran", flush=True))
    build = cli.build_parser
    cli.build_parser = lambda *a, **k: (lambda p: p.set_defaults(func=interrupted) or p)(
        build(*a, **k))
    sys.exit(cli.main([]))
""")


@pytest.mark.parametrize("worker", ["wedged", "ending"])
def test_an_interrupted_program_ends_whatever_its_workers_do(worker):
    done = subprocess.run([sys.executable, "-c", PROGRAM, worker], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines()[0] == "interrupted"
    assert "exit hooks ran" in done.stdout          # temporary folders and the like go
    left = "a worker thread did not end within 0.5 s of the interrupt"
    assert (left in done.stderr) == (worker == "wedged"), done.stderr


SLOW_START = textwrap.dedent("""
    import sys, time

    class SlowImport:                  # the program's imports, stretched to be interrupted
        def find_spec(self, name, path=None, target=None):
            if name == "snapops.formats.contract":
                sys.stderr.write("importing\\n")
                sys.stderr.flush()
                time.sleep(60)
            return None

    sys.meta_path.insert(0, SlowImport())
""")


def test_an_interrupt_while_the_program_starts_is_one_line(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        [str(tmp_path)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    proc = subprocess.Popen([sys.executable, "-m", "snapops", "--version"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline() == "importing\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "", "interrupted\n")


@pytest.mark.parametrize("during_interrupt", [True, False])
def test_an_error_raised_by_what_a_ctrl_c_interrupted_is_the_interrupt(during_interrupt,
                                                                      monkeypatch, capsys):
    """CPython's Condition.wait, interrupted at the wrong moment, raises RuntimeError
    ("cannot release un-acquired lock") in place of the KeyboardInterrupt: exit 130 all the
    same; the same error outside an interrupt is a bug, reported as one."""
    import snapops.cli as cli

    def command(args):
        if not during_interrupt:
            raise RuntimeError("cannot release un-acquired lock")
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot release un-acquired lock")

    build = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda *a, **k: (
        lambda parser: parser.set_defaults(func=command) or parser)(build(*a, **k)))
    assert cli.main([]) == (130 if during_interrupt else 2)
    err = capsys.readouterr().err
    assert ("interrupted" in err) == during_interrupt
    assert ("internal error (RuntimeError" in err) != during_interrupt
