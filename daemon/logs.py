"""Structured logging for the daemon: text for humans, one JSON object per line for shippers.

Every line goes through :func:`snapops.daemon.redact.redact_url` after formatting (message,
arguments and traceback alike), so a remote URL with a token never reaches a log.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from .redact import redact_url


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact_url(record.getMessage()),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exc"] = redact_url(self.formatException(record.exc_info))
        return json.dumps(entry, sort_keys=True)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact_url(super().format(record))


def setup_logging(level: str = "info", fmt: str = "text", stream=None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger("snapops")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
