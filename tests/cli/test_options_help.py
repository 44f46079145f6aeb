"""The example closing every ``--help`` page parses as the command it shows, and every option
of the commands below explains itself in ``--help``."""

from __future__ import annotations

import argparse
import shlex

import pytest

from snapops.cli import build_parser
from tests.cli.test_help import every_parser


def example_of(parser: argparse.ArgumentParser) -> list[str]:
    """The first ``snapops ...`` command of the page's example, as words (a comment, the
    command after ``&&`` and what a pipe feeds it left out)."""
    text = (parser.epilog or "").rsplit("example", 1)[-1].split(":", 1)[-1]
    command = text.split("&&")[0].split("|")[-1]
    return shlex.split(command, comments=True)


def test_every_help_example_parses():
    top = build_parser()
    failed, parsed = [], 0
    for _, parser in every_parser(top):
        words = example_of(parser)
        if words[:1] != ["snapops"]:            # textconv shows the git config that runs it
            continue
        parsed += 1
        try:
            top.parse_args(words[1:])
        except SystemExit:
            failed.append(" ".join(words))
    assert parsed > 25 and not failed, f"examples that do not parse: {failed}"


@pytest.mark.parametrize("command", [("request",), ("lfs", "prune"), ("delta", "make"),
                                     ("delta", "apply"), ("keys", "generate"),
                                     ("daemon", "status"), ("daemon", "run"), ("convert",),
                                     ("encrypt",), ("decrypt",), ("restore",), ("bench", "wtxt"),
                                     ("hooks", "install"), ("hook",)])
def test_every_option_has_help(command):
    parser = dict(every_parser(build_parser()))[command]
    silent = [action.option_strings or [action.dest] for action in parser._actions
              if action.help is None]
    assert not silent, f"snapops {' '.join(command)}: options without help: {silent}"
