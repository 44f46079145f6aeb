"""The ``>>>`` examples in docstrings run as tests, each module in a fresh folder.

Examples that cannot run on their own (they need a repository, a daemon, a remote) are
written as plain ``Example::`` blocks instead, so every ``>>>`` here is a real check.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import snapops

# the packages pyproject maps from the top-level folders into one ``snapops`` namespace
PACKAGES = ("snapops", "snapops.formats", "snapops.daemon", "snapops.hooks", "snapops.config")


def modules_with_examples() -> list[str]:
    names = set()
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.add(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if not info.name.endswith("__main__"):
                names.add(info.name)
    finder = doctest.DocTestFinder()
    return sorted(n for n in names
                  if any(t.examples for t in finder.find(importlib.import_module(n))))


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, globs={"np": np, **vars(module)}):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
