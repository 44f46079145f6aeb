"""The LFS client against a real giftless: upload, skip what exists, download checked, auth."""

from __future__ import annotations

import hashlib

import pytest
from snapops.formats.errors import LfsError
from snapops.formats.lfs.client import LfsClient, LfsObject


def _obj(tmp_path, data: bytes) -> LfsObject:
    oid = hashlib.sha256(data).hexdigest()
    path = tmp_path / oid
    path.write_bytes(data)
    return LfsObject(oid, len(data), path)


def test_upload_once_download_exact(giftless, tmp_path):
    client = LfsClient(giftless.url, giftless.token())
    a, b = _obj(tmp_path, b"alpha" * 1000), _obj(tmp_path, b"beta")
    assert client.upload([a, b]) == (2, 0)
    assert set(giftless.objects()) == {a.oid, b.oid}
    assert giftless.objects()[a.oid].read_bytes() == b"alpha" * 1000
    assert client.upload([a, b]) == (0, 2)          # already there: nothing sent twice
    got = client.download(a.oid, a.size, tmp_path / "out" / "a")
    assert got.read_bytes() == b"alpha" * 1000


def test_refused_without_write_scope_and_token_never_shown(giftless, tmp_path):
    token = giftless.token("read")
    client = LfsClient(giftless.url, token)
    with pytest.raises(LfsError, match="HTTP 40[13]") as err:
        client.upload([_obj(tmp_path, b"x")])
    assert token not in str(err.value) and token not in repr(client)
    assert giftless.objects() == {}
    with pytest.raises(LfsError, match="HTTP 401"):
        LfsClient(giftless.url, "not-a-jwt.but.looks").upload([_obj(tmp_path, b"y")])


def test_download_of_missing_object_is_a_typed_error(giftless, tmp_path):
    client = LfsClient(giftless.url, giftless.token())
    with pytest.raises(LfsError, match="object"):
        client.download("0" * 64, 5, tmp_path / "x")
    assert not (tmp_path / "x").exists()



def test_an_upload_in_progress_is_not_an_object_of_the_store(giftless, tmp_path):
    """Until its last byte has arrived, an upload is not the object: a batch call (another
    node asking whether it exists) or a download during the upload never sees a partial one."""
    import http.client
    import time
    import urllib.parse

    from snapops.formats.lfs.client import offered_action

    data = bytes(range(256)) * 4096
    obj = _obj(tmp_path, data)
    client = LfsClient(giftless.url, giftless.token())
    item = client.batch("upload", [(obj.oid, obj.size)])[0]
    action = offered_action(item, "upload", obj.oid)
    href = urllib.parse.urlsplit(action["href"])
    conn = http.client.HTTPConnection(href.hostname, href.port, timeout=30)
    conn.putrequest("PUT", href.path + (f"?{href.query}" if href.query else ""))
    for key, value in {**action.get("header", {}), "Content-Length": str(len(data)),
                       "Content-Type": "application/octet-stream"}.items():
        conn.putheader(key, value)
    conn.endheaders()
    conn.send(data[:len(data) // 2])
    time.sleep(0.5)                       # the server has read and stored the first half
    assert obj.oid not in giftless.objects()
    assert offered_action(client.batch("upload", [(obj.oid, obj.size)])[0], "upload",
                          obj.oid) is not None      # still to be uploaded, as far as anyone knows
    conn.send(data[len(data) // 2:])
    assert conn.getresponse().status in (200, 201)
    conn.close()
    assert giftless.objects()[obj.oid].read_bytes() == data

def test_uploads_side_by_side_into_a_new_store_all_land_whole(giftless, tmp_path):
    """Several nodes (threads here) upload at once into a store that has no folder for the
    repository yet: every upload succeeds (giftless's own local storage answered HTTP 500 to
    all but the first that created the folder) and no partial object is ever left."""
    from concurrent.futures import ThreadPoolExecutor

    objects = [_obj(tmp_path, bytes([i]) * (1 << 20) + b"%d" % i) for i in range(8)]
    clients = [LfsClient(giftless.url, giftless.token()) for _ in objects]
    start = __import__("threading").Barrier(len(objects))

    def send(pair):
        client, obj = pair
        start.wait()
        return client.upload([obj])

    with ThreadPoolExecutor(len(objects)) as pool:
        assert list(pool.map(send, zip(clients, objects))) == [(1, 0)] * len(objects)
    stored = giftless.objects()
    assert {oid: hashlib.sha256(p.read_bytes()).hexdigest() for oid, p in stored.items()} == \
        {o.oid: o.oid for o in objects}
    assert not [p for p in (giftless.storage).rglob("*.part")]
