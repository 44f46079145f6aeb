"""A small Git LFS batch-API client: upload objects that the server lacks, download by oid.

``POST {url}/objects/batch`` (JSON, ``application/vnd.git-lfs+json``) with a bearer token, then
the ``basic`` transfer: ``PUT`` (upload) or ``GET`` (download) to each action's ``href`` with
the action's own headers, and the ``verify`` action when the server gives one. An object the
server already has comes back without actions and is not sent again, so an upload interrupted
anywhere is simply repeated. The token goes into headers only; errors never show it, and URLs
in errors are redacted.

Example::

    client = LfsClient("https://lfs.example/org/repo.git/info/lfs", token="...")
    client.upload([LfsObject(oid, size, Path("shard.aero"))])   # -> (1, 0): sent, skipped
    client.download(oid, size, Path("cache/obj"))
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from snapops.daemon.redact import redact_url
from snapops.formats.errors import LfsError
from snapops.formats.workers import HelperPool

MEDIA = "application/vnd.git-lfs+json"
MAX_JSON = 16 << 20
BLOCK = 1 << 20
LOW_SPEED = (64 << 10, 60.0)   # a transfer bringing fewer bytes than this in as many seconds
                               # is given up
BATCH_MAX = 100        # objects per batch call, as git-lfs sends them
TRANSFERS = 4          # downloads at a time


class LfsHttpError(LfsError):
    """The server answered with an HTTP error status (``status``, its body's ``media`` type)."""

    def __init__(self, message: str, status: int, media: str) -> None:
        super().__init__(message)
        self.status, self.media = status, media


@dataclass(frozen=True)
class LfsObject:
    oid: str
    size: int
    path: Path          # the local file holding the object's bytes (uploads)


def lfs_url_for(remote_url: str) -> str:
    """git-lfs's endpoint discovery for an HTTP(S) remote: ``<remote>[.git]/info/lfs``.

    >>> lfs_url_for("https://git.example/org/repo")
    'https://git.example/org/repo.git/info/lfs'
    """
    if not remote_url.startswith(("http://", "https://")):
        raise LfsError(f"no LFS endpoint can be derived from {redact_url(remote_url)!r}: set "
                       "[repo] lfs_url")
    base = remote_url.rstrip("/")
    return (base if base.endswith(".git") else base + ".git") + "/info/lfs"


class LfsClient:
    def __init__(self, url: str, token: str | None = None, *, timeout: float = 60.0,
                 progress: Callable[[int], object] | None = None,
                 low_speed: tuple[int, float] = LOW_SPEED) -> None:
        """``progress(nbytes)`` is called as downloaded bytes arrive (from several threads,
        one call at a time). ``low_speed`` (bytes, seconds): a download that brings fewer
        bytes than that in any such span is ended (``timeout`` bounds one silent read only:
        a server trickling a byte now and then would hold a download for ever)."""
        if not url.startswith(("http://", "https://")):
            raise LfsError(f"LFS url must be http(s): {redact_url(url)!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.low_speed = low_speed
        self.progress = progress
        self._progress_lock = threading.Lock()
        self.uploaded = 0      # objects sent by this client (PUT)
        self.skipped = 0       # objects the server already had
        self.batch_failure: LfsError | None = None   # the endpoint failed, not one object

    def __repr__(self) -> str:  # never the token
        return f"LfsClient({redact_url(self.url)!r})"

    def batch(self, operation: str, objects: list[tuple[str, int]]) -> list[dict]:
        """The server's answer per object (``actions`` or ``error``), in the order asked."""
        body = json.dumps({"operation": operation, "transfers": ["basic"],
                           "objects": [{"oid": o, "size": s} for o, s in objects]}).encode()
        headers = {"Accept": MEDIA, "Content-Type": MEDIA}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            answer = self._json("POST", f"{self.url}/objects/batch", body, headers)
        except LfsError as exc:
            # giftless answers a batch none of whose objects it holds with a Git LFS 404 (the
            # spec's 404 is "no such repository"): missing objects, not a broken endpoint
            if not (isinstance(exc, LfsHttpError) and exc.status == 404 and exc.media == MEDIA):
                self.batch_failure = exc
            raise
        return batch_items(answer, objects)

    def upload(self, objects: list[LfsObject]) -> tuple[int, int]:
        """Send each object the server lacks; returns (sent, already there)."""
        sent = skipped = 0
        if not objects:
            return 0, 0
        answers = self.batch("upload", [(o.oid, o.size) for o in objects])
        for obj, item in zip(objects, answers):
            _raise_item_error(item, obj.oid)
            up = offered_action(item, "upload", obj.oid)
            if up is None:
                skipped += 1
                continue
            with open(obj.path, "rb") as f:
                self._request("PUT", up["href"], f, {**_headers(up),
                              "Content-Type": "application/octet-stream",
                              "Content-Length": str(obj.size)})
            ver = offered_action(item, "verify", obj.oid)
            if ver is not None:
                self._json("POST", ver["href"], json.dumps({"oid": obj.oid, "size": obj.size})
                           .encode(), {**_headers(ver), "Accept": MEDIA, "Content-Type": MEDIA})
            sent += 1
        self.uploaded += sent
        self.skipped += skipped
        return sent, skipped

    def download(self, oid: str, size: int, dest: Path, *, durable: bool = True) -> Path:
        """Object ``oid`` into ``dest`` (atomically), checked by size and SHA-256;
        ``durable=False``: not fsync'd (a throw-away cache, see ``atomic_write``)."""
        (item,) = self.batch("download", [(oid, size)])
        return self._get(oid, size, item, dest, durable)

    def download_many(self, objects: list[tuple[str, int]], dest: Callable[[str], Path],
                      workers: int = TRANSFERS, *, durable: bool = True) -> None:
        """Every ``(oid, size)`` into ``dest(oid)``, checked as :meth:`download` checks one:
        one batch call per ``BATCH_MAX`` objects, then ``workers`` downloads at a time (as
        git-lfs's ``lfs.concurrenttransfers``). The first failure is raised once the running
        downloads have ended; the objects already downloaded stay."""
        for start in range(0, len(objects), BATCH_MAX):
            chunk = objects[start:start + BATCH_MAX]
            items = self.batch("download", chunk)
            with HelperPool(max(1, workers)) as pool:
                running = [pool.submit(self._get, oid, size, item, dest(oid), durable)
                           for (oid, size), item in zip(chunk, items)]
            for done in running:
                done.result()

    def _get(self, oid: str, size: int, item: dict, dest: Path, durable: bool = True) -> Path:
        _raise_item_error(item, oid)
        action = offered_action(item, "download", oid)
        if action is None:
            raise LfsError(f"LFS server offers no download of object {oid}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = download_temp(dest)
        h, got = hashlib.sha256(), 0
        try:
            with self._open("GET", action["href"], None, _headers(action)) as resp, \
                    open(tmp, "xb") as out:
                pace = Pace(*self.low_speed, f"LFS object {oid}")
                while block := _read(resp, BLOCK, f"LFS object {oid}"):
                    pace.add(len(block))
                    got += len(block)
                    if got > size:
                        raise LfsError(f"LFS object {oid}: server sent more than {size} bytes")
                    h.update(block)
                    out.write(block)
                    if self.progress is not None:
                        with self._progress_lock:
                            self.progress(len(block))
                out.flush()
                if durable:
                    os.fsync(out.fileno())
            if got != size or h.hexdigest() != oid:
                raise LfsError(f"LFS object {oid}: got {got} bytes with sha256 "
                               f"{h.hexdigest()}, expected {size} bytes")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    # --- HTTP ----------------------------------------------------------------------------
    def _open(self, method: str, url: str, body, headers: dict):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise LfsError(f"LFS action href is not http(s): {redact_url(str(url))[:200]!r}")
        try:
            request = urllib.request.Request(url, data=body, headers=headers, method=method)
            return _OPENER.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            detail = one_line(exc.read(400).decode("utf-8", "replace"))
            raise LfsHttpError(f"LFS {method} {redact_url(url)}: HTTP {exc.code} {detail}",
                               exc.code,
                               (exc.headers.get("Content-Type") or "").split(";")[0]) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            # ValueError, InvalidURL: an href or a redirect no URL parser takes
            reason = getattr(exc, "reason", exc)
            raise LfsError(f"LFS {method} {redact_url(url)[:200]}: "
                           f"{redact_url(str(reason))[:200]}") from None

    def _request(self, method: str, url: str, body, headers: dict) -> bytes:
        """The answer's body: at most ``MAX_JSON`` + 1 bytes, at the ``low_speed`` pace."""
        what = f"LFS {method} {redact_url(url)[:200]}"
        data, pace = bytearray(), Pace(*self.low_speed, what)
        with self._open(method, url, body, headers) as resp:
            while len(data) <= MAX_JSON and (block := _read(resp, MAX_JSON + 1 - len(data),
                                                            what)):
                pace.add(len(block))
                data += block
        return bytes(data)

    def _json(self, method: str, url: str, body: bytes, headers: dict) -> dict:
        data = self._request(method, url, body, headers)
        return parse_answer(data, f"LFS {method} {redact_url(url)}")


def parse_answer(data: bytes, what: str) -> dict:
    """A server's JSON answer (at most ``MAX_JSON`` bytes; empty: ``{}``) as an object."""
    if len(data) > MAX_JSON:
        raise LfsError(f"{what}: answer larger than {MAX_JSON} bytes")
    if not data.strip():
        return {}
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):
        raise LfsError(f"{what}: answer is not JSON") from None
    if not isinstance(answer, dict):
        raise LfsError(f"{what}: answer is not a JSON object")
    return answer


def batch_items(answer: dict, objects: list[tuple[str, int]]) -> list[dict]:
    """The batch answer's object for each ``(oid, size)`` asked, in that order."""
    listed = answer.get("objects", [])
    if not isinstance(listed, list):
        raise LfsError("LFS batch answer: 'objects' is not a list")
    found = {o["oid"]: o for o in listed
             if isinstance(o, dict) and isinstance(o.get("oid"), str)}
    out = []
    for oid, _size in objects:
        item = found.get(oid)
        if item is None:
            raise LfsError(f"LFS batch answer lacks object {oid}")
        out.append(item)
    return out


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects are followed to http(s) URLs only (urllib alone would follow ftp), and one
    to another origin (scheme, host, port) keeps no header but Accept and Content-Type: the
    token and an action's own headers are for the server that was asked, never for whoever
    it points to (urllib alone re-sends them; git-lfs drops them too)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        try:
            if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
                raise LfsError(f"LFS {req.get_method()} {redact_url(req.full_url)}: redirected "
                               f"to a URL that is not http(s): {redact_url(newurl)[:200]!r}")
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            if new is not None and _origin(newurl) != _origin(req.full_url):
                new.headers = {k: v for k, v in new.headers.items()
                               if k.lower() in ("accept", "content-type")}
            return new
        except BaseException:      # urllib closes the answer only when a request comes back
            fp.close()
            raise


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)      # ValueError (a bad port): handled by _open
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def download_temp(dest: Path) -> Path:
    """Where ``dest`` is downloaded before it is checked and renamed: a name nobody can guess,
    created new (``open(..., "xb")``), so never a planted symlink's target."""
    return dest.with_name(f".{dest.name}.{secrets.token_hex(8)}.part")


DOWNLOAD_TEMP = re.compile(r"\.[0-9a-f]{64}\.[0-9a-f]{16}\.part")   # of an object's download


class Pace:
    """Ends a transfer that brings fewer than ``least`` bytes in a span of ``span`` seconds
    (curl's --speed-limit / --speed-time)."""

    def __init__(self, least: int, span: float, what: str) -> None:
        self.least, self.span, self.what = least, span, what
        self.since, self.seen = time.monotonic(), 0

    def add(self, n: int) -> None:
        self.seen += n
        now = time.monotonic()
        if now - self.since < self.span:
            return
        if self.seen < self.least:
            raise LfsError(f"{self.what}: the server sent {self.seen} bytes in "
                           f"{now - self.since:.0f} s (at least {self.least} expected): too "
                           "slow, given up")
        self.since, self.seen = now, 0


def _read(resp, size: int, what: str) -> bytes:
    """Up to ``size`` bytes of a response, as soon as some arrive (``read1``: a slow server
    is seen by :class:`Pace`); a connection cut or a malformed chunk mid-body
    (``IncompleteRead``, a reset, a timeout, a chunk size that is not hex) is an LfsError."""
    try:
        return resp.read1(size)
    except (http.client.HTTPException, OSError, ValueError) as exc:
        raise LfsError(f"{what}: the answer broke off ({type(exc).__name__}: "
                       f"{str(exc)[:120]})") from None


_OPENER = urllib.request.build_opener(_Redirects)


def offered_action(item: dict, name: str, oid: str) -> dict | None:
    """The ``name`` action of a batch answer's object (None: not offered), shape checked."""
    actions = item.get("actions") or {}
    if not isinstance(actions, dict):
        raise LfsError(f"LFS object {oid}: 'actions' is not an object")
    action = actions.get(name)
    if action is None:
        return None
    if not isinstance(action, dict) or not isinstance(action.get("href"), str):
        raise LfsError(f"LFS object {oid}: the {name} action has no href")
    return action


def _headers(action: dict) -> dict:
    headers = action.get("header") or {}
    if not isinstance(headers, dict):
        raise LfsError("LFS action headers are not an object")
    return {str(k): str(v) for k, v in headers.items()}


def _raise_item_error(item: dict, oid: str) -> None:
    error = item.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        raise LfsError(f"LFS object {oid}: server error {one_line(code, 40)}: "
                       f"{one_line(message)}")


def one_line(text: object, limit: int = 200) -> str:
    """Text a server chose, fit for a one-line message: no line breaks or control characters
    (a forged log line), URLs redacted, at most ``limit`` characters."""
    printable = "".join(c if c.isprintable() else " " for c in str(text))
    return redact_url(" ".join(printable.split()))[:limit]
