"""Every ``--help`` page of the command line, at every level, ends with a runnable-looking
example (``example:`` followed by a ``snapops ...`` line)."""
from __future__ import annotations

import argparse

from snapops.cli import build_parser


def every_parser(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from every_parser(child, (*path, name))


def test_every_help_page_ends_with_an_example():
    pages = list(every_parser(build_parser()))
    assert len(pages) > 25  # the walk reached the nested commands (daemon run, keys generate...)
    missing = []
    for path, parser in pages:
        text = parser.format_help()
        tail = text.rsplit("example", 1)[-1] if "example" in text else ""
        if "snapops " not in tail:
            missing.append(" ".join(path) or "(top level)")
    assert not missing, f"--help without a closing example: {missing}"


def test_a_command_imports_only_its_own_module():
    """``snapops hook ...`` (what git runs on every push) builds the parser of ``hook`` alone;
    ``--help`` and a mistyped command still list every command."""
    import subprocess
    import sys

    code = ("import sys\nfrom snapops.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('snapops.cli.')))")

    def loaded(*argv):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip().splitlines()[-1], out.stderr

    hook, _ = loaded("hook", "--help")
    assert "snapops.cli.hook" in hook and "snapops.cli.convert" not in hook
    assert "snapops.cli.daemon" not in hook
    request, _ = loaded("request", "--help")      # registered by the daemon's module
    assert "snapops.cli.daemon" in request and "snapops.cli.hook" not in request
    everything, _ = loaded("--help")
    assert "snapops.cli.convert" in everything and "snapops.cli.hook" in everything
    typo, err = loaded("covnert", "x")
    assert "invalid choice: 'covnert'" in err and "'convert'" in err and "'lfs'" in err
