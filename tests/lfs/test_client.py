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
