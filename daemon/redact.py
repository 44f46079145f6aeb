"""Secrets out of everything the daemon prints, logs or stores: one redaction rule for URLs.

A remote URL can carry credentials in three places, and each is masked with ``***``:

- the user information before ``@``: ``https://TOKEN@host`` (a token as user name),
  ``https://user:password@host``, ``https://oauth2:TOKEN@host`` all become ``https://***@host``.
  Only ``ssh://`` URLs keep a user name alone (``ssh://git@host`` logs in as ``git``; ssh
  authenticates by key), their password is still masked;
- the query: every value is masked and the keys stay (``?access_token=***&ref=***``);
- the fragment: ``#***``.

Local paths and scp-like ``git@host:path`` remotes carry no credentials and stay as they are.
:func:`redact_url` takes free text as well (git's error output, log messages) and masks every
URL inside it; :func:`redact_data` applies it to every string of a JSON-like value (the status
file).

>>> redact_url("https://ghp_abc@github.com/org/repo.git?access_token=x#frag")
'https://***@github.com/org/repo.git?access_token=***#***'
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MASK", "redact_data", "redact_url"]

MASK = "***"
_SSH_SCHEMES = ("ssh", "git+ssh", "ssh+git")
# scheme "://" authority (up to / ? # or whitespace: a password may hold any other character,
# and everything before its last @ is masked) path ?query #fragment, these three also ending
# at a quote (URLs in messages are quoted); never raises on any input
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#\s]*)"
                  r"(?P<path>[^?#\s'\"<>`]*)(?:\?(?P<query>[^#\s'\"<>`]*))?"
                  r"(?:#(?P<fragment>[^\s'\"<>`]*))?")
_QUERY_ITEM = re.compile(r"(?P<key>[^=&;]*)(?P<eq>=?)[^&;]*")


def redact_url(text: str) -> str:
    """``text`` (a URL, or free text such as git's error output) with every URL in it masked:
    user information, query values and fragment (see the module docstring).

    >>> redact_url("https://user:s3cret@host/x.git")
    'https://***@host/x.git'
    >>> redact_url("ssh://git@host/x.git")
    'ssh://git@host/x.git'
    >>> redact_url("fatal: unable to access 'https://tok@host/x.git/': 403")
    "fatal: unable to access 'https://***@host/x.git/': 403"
    """
    return _URL.sub(_redact_match, text)


def redact_data(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings, numbers) with every string redacted.

    >>> redact_data({"url": "https://t@h/x", "n": 1})
    {'url': 'https://***@h/x', 'n': 1}
    """
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_data(v) for v in value]
    return value


def _redact_match(m: re.Match) -> str:
    scheme, authority = m.group("scheme"), m.group("authority")
    if "@" in authority:
        userinfo, host = authority.rsplit("@", 1)
        if scheme.lower() in _SSH_SCHEMES:
            user, colon, _ = userinfo.partition(":")
            userinfo = user + (":" + MASK if colon else "")
        else:
            userinfo = MASK
        authority = f"{userinfo}@{host}"
    out = f"{scheme}://{authority}{m.group('path')}"
    if m.group("query") is not None:
        out += "?" + _QUERY_ITEM.sub(_mask_query_item, m.group("query"))
    if m.group("fragment") is not None:
        out += "#" + (MASK if m.group("fragment") else "")
    return out


def _mask_query_item(item: re.Match) -> str:
    if not item.group(0):
        return ""
    if not item.group("eq"):  # a bare value (``?TOKEN``)
        return MASK
    return f"{item.group('key')}={MASK}"
