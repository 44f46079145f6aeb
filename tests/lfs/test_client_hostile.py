"""The LFS client against a hostile LFS server (a real HTTP server on 127.0.0.1 answering
what an attacker would): malformed batch answers are typed errors, and redirects neither
leave http(s) nor carry the token or an action's headers to another origin."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from snapops.formats.errors import LfsError
from snapops.formats.lfs.client import LfsClient

DATA = b"shard bytes\n"
OID, SIZE = hashlib.sha256(DATA).hexdigest(), len(DATA)
TOKEN = "SECRET-TOKEN-123"


class Server:
    """``answer(handler)`` decides each response; every request's path and headers are kept."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict]] = []
        self.answer = lambda handler: handler.reply(404, b"")
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_any(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.seen.append((self.command, self.path, dict(self.headers)))
                server.answer(self)

            do_GET = do_POST = do_PUT = do_any

            def reply(self, status: int, body: bytes, **headers) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = [Server(), Server()]
    yield made
    for one in made:
        one.close()


def batch_answer(body) -> callable:
    def answer(handler):
        if handler.path.endswith("/objects/batch"):
            handler.reply(200, json.dumps(body).encode(),
                          Content_Type="application/vnd.git-lfs+json")
        else:
            handler.reply(404, b"")
    return answer


@pytest.mark.parametrize("body,message", [
    ([1, 2], r"answer is not a JSON object"),
    ({"objects": 5}, r"'objects' is not a list"),
    ({"objects": [{"oid": [1]}]}, r"lacks object " + OID),
    ({"objects": [{"oid": OID, "actions": [1]}]}, r"'actions' is not an object"),
    ({"objects": [{"oid": OID, "actions": {"download": "x"}}]}, r"download action has no href"),
    ({"objects": [{"oid": OID, "actions": {"download": {"href": 7}}}]},
     r"download action has no href"),
    ({"objects": [{"oid": OID, "actions": {"download": {"href": "file:///etc/passwd"}}}]},
     r"href is not http\(s\)"),
    ({"objects": [{"oid": OID, "error": {"code": 404, "message": "x" * 5000}}]},
     r"server error 404: x{200}$"),
])
def test_malformed_batch_answers_are_typed_errors(servers, tmp_path, body, message):
    lfs = servers[0]
    lfs.answer = batch_answer(body)
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    with pytest.raises(LfsError, match=message) as raised:
        client.download(OID, SIZE, tmp_path / "cache" / OID)
    assert TOKEN not in str(raised.value)
    assert not (tmp_path / "cache" / OID).exists()


def test_a_redirect_to_another_origin_carries_neither_token_nor_action_headers(servers,
                                                                               tmp_path):
    lfs, elsewhere = servers
    elsewhere.answer = lambda handler: handler.reply(200, DATA)
    action = {"href": f"{lfs.url}/objects/{OID}", "header": {"Authorization": "RemoteAuth s3"}}

    def answer(handler):
        if handler.path.endswith("/objects/batch"):
            batch_answer({"objects": [{"oid": OID, "actions": {"download": action}}]})(handler)
        elif handler.path == f"/objects/{OID}":        # same origin, another path: kept
            handler.reply(302, b"", Location=f"{lfs.url}/moved/{OID}")
        else:                                          # then off to another server
            handler.reply(302, b"", Location=f"{elsewhere.url.replace('127.0.0.1', 'localhost')}"
                                             f"/stolen/{OID}")
    lfs.answer = answer
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    client.download(OID, SIZE, tmp_path / OID)

    assert (tmp_path / OID).read_bytes() == DATA
    by_path = {path: headers for _, path, headers in lfs.seen}
    assert by_path["/r.git/info/lfs/objects/batch"]["Authorization"] == f"Bearer {TOKEN}"
    assert by_path[f"/moved/{OID}"]["Authorization"] == "RemoteAuth s3"
    ((_, path, headers),) = elsewhere.seen
    assert path == f"/stolen/{OID}" and "Authorization" not in headers, headers


@pytest.mark.parametrize("target", ["ftp://127.0.0.1/x", "file:///etc/passwd"])
def test_a_redirect_away_from_http_is_refused(servers, tmp_path, target):
    lfs = servers[0]
    lfs.answer = lambda handler: handler.reply(302, b"", Location=target)
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    with pytest.raises(LfsError, match=r"redirected to a URL that is not http\(s\)|HTTP 302"):
        client.download(OID, SIZE, tmp_path / OID)
    assert len(lfs.seen) == 1


def test_a_deeply_nested_answer_is_a_typed_error(servers, tmp_path):
    lfs = servers[0]
    nested = b'{"objects": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    lfs.answer = lambda handler: handler.reply(200, nested,
                                               Content_Type="application/vnd.git-lfs+json")
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    with pytest.raises(LfsError, match=r"objects/batch: answer is not JSON"):
        client.download(OID, SIZE, tmp_path / OID)


@pytest.mark.parametrize("href", ["http://127.0.0.1:abc/x", "http://[::1/x",
                                  "http://exa mple.com/x", "http://127.0.0.1:99999999/x"])
def test_an_href_no_url_parser_takes_is_a_typed_error(servers, tmp_path, href):
    lfs = servers[0]
    lfs.answer = batch_answer({"objects": [{"oid": OID, "actions": {"download": {"href": href}}}]})
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    with pytest.raises(LfsError, match=r"LFS GET "):
        client.download(OID, SIZE, tmp_path / OID)


def test_a_redirect_to_a_malformed_url_is_a_typed_error(servers, tmp_path):
    lfs = servers[0]
    lfs.answer = lambda handler: handler.reply(302, b"", Location="http://127.0.0.1:99999999/x")
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    with pytest.raises(LfsError, match=r"objects/batch: .*[Pp]ort"):
        client.download(OID, SIZE, tmp_path / OID)


@pytest.mark.parametrize("body", [b"5\r\nshard\r\nzz\r\n", b"5\r\nshard\r\n"])
def test_an_answer_that_breaks_off_is_a_typed_error_and_leaves_no_file(servers, tmp_path, body):
    """A chunked body with a chunk size that is not hex (ValueError from http.client), or cut
    after its first chunk (IncompleteRead)."""
    lfs = servers[0]
    action = {"href": f"{lfs.url}/objects/{OID}"}

    def answer(handler):
        if handler.path.endswith("/objects/batch"):
            batch_answer({"objects": [{"oid": OID, "actions": {"download": action}}]})(handler)
            return
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()
        handler.close_connection = True
    lfs.answer = answer
    client = LfsClient(f"{lfs.url}/r.git/info/lfs", token=TOKEN)
    with pytest.raises(LfsError, match=rf"LFS object {OID}: the answer broke off"):
        client.download(OID, SIZE, tmp_path / "cache" / OID)
    assert list((tmp_path / "cache").iterdir()) == []
