"""Typed options: every writer's and verifier's option dataclass checks its values against its
fields' types when it is built (:class:`CheckedOptions`), so a bad value is one DataError
naming the option, never a TypeError deep in a writer or a truthy string read as True.
``Annotated`` rules carry ranges and patterns (``Annotated[int, between(1, 22)]``); ``gen``,
``ts`` and ``build`` follow WTXT's rules in every format, so any file's metadata converts to
any other.

>>> @dataclass(frozen=True)
... class Example(CheckedOptions):
...     level: Annotated[int, between(1, 22)] = 3
...     checksum: bool = False
>>> Example(level=5).level
5
>>> Example(checksum="false")
Traceback (most recent call last):
snapops.formats.errors.DataError: checksum='false': expected True or False
"""

from __future__ import annotations

import collections.abc
import functools
import os
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .errors import DataError, short_repr


@dataclass(frozen=True)
class Rule:
    """A condition on an option's value beyond its type: ``Annotated[int, between(1, 22)]``.
    ``expected`` is the whole description shown when it fails ("an integer in 1..22")."""

    test: Callable[[Any], bool]
    expected: str


def between(low: int, high: int | None = None) -> Rule:
    """An integer in ``low..high`` (no upper bound when ``high`` is None)."""
    shown = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
    return Rule(lambda v: low <= v and (high is None or v <= high), shown)


MAX_TOKEN = 255        # so a WTXT meta line of such tokens stays within its 4096 bytes


def valid_token(value: str) -> bool:
    """WTXT's meta-line token (``build``, ``schema``...): every format keeps what WTXT can."""
    from .wtxt._grammar import TOKEN    # here, not at the top: wtxt imports this module

    return (len(value) <= MAX_TOKEN and value.isascii()
            and re.fullmatch(TOKEN, value.encode()) is not None)


def valid_ts(value: str) -> bool:
    """WTXT's ``ts``: exactly ``YYYY-MM-DDTHH:MM:SSZ`` (strptime alone takes 1-digit fields
    and non-ASCII digits, which the WTXT reader refuses)."""
    from .wtxt._grammar import check_ts

    return value.isascii() and len(value) == 20 and check_ts(value)


META_TOKEN = Rule(valid_token, f"a token of [A-Za-z0-9._/+-], 1..{MAX_TOKEN} characters")
UTC_TIME = Rule(valid_ts, "a UTC time as YYYY-MM-DDTHH:MM:SSZ")
GEN = between(0, 2**63 - 1)
WORKERS = between(1, 1024)
ZSTD_LEVEL = between(-(1 << 17), 22)
KeyPath = str | os.PathLike
TrustedKey = KeyPath | Ed25519PublicKey | Mapping[str, Ed25519PublicKey]
TrustedKeys = Annotated[TrustedKey | Sequence[TrustedKey] | None,
                        Rule(lambda v: True, "key files, key folders or Ed25519 public keys "
                             "(one or a list)")]


@dataclass(frozen=True)
class CheckedOptions:
    """Options whose values are checked against their fields' types on construction (bools
    are real bools, an int is no bool, ``Annotated`` rules hold); numpy scalars become plain
    Python values."""

    def __post_init__(self) -> None:
        for name, hint in _hints(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, np.generic):
                value = value.item()
                object.__setattr__(self, name, value)
            if not _fits(value, hint):
                raise DataError(f"{name}={short_repr(value)}: expected {_expected(hint)}")


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind, include_extras=True)


def _fits(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is Annotated:
        return _fits(value, args[0]) and all(r.test(value) for r in args[1:]
                                             if isinstance(r, Rule))
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) \
            and not isinstance(value, bool)
    if origin in (tuple, list, collections.abc.Sequence):
        return isinstance(value, (tuple, list)) and all(_fits(v, args[0]) for v in value)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, Mapping) and all(
            _fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    return isinstance(value, origin or hint)


def _expected(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        shown = [_expected(a) for a in args if a is not type(None)]
        return " or ".join(shown + (["None"] if type(None) in args else []))
    if origin is Annotated:
        rules = [r.expected for r in args[1:] if isinstance(r, Rule)]
        return rules[0] if rules else _expected(args[0])
    if origin in (tuple, list, collections.abc.Sequence):
        return f"a list of ({_expected(args[0])})"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping of key ids to keys"
    names = {bool: "True or False", int: "an integer", float: "a number", str: "a string",
             bytes: "bytes", os.PathLike: "an os.PathLike", Any: "anything"}
    name = getattr(hint, "__name__", str(hint))
    return names.get(hint, f"{'an' if name[0] in 'AEIOU' else 'a'} {name}")
