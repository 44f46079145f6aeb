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
