"""Loose blobs stored without compression are copied out of a real repository's object store
directly, with their SHA-256; anything git would read differently (deflated, packed, damaged,
crafted, not a blob) is left to ``git cat-file``, which answers or fails as git does."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from snapops.formats.errors import GitError
from snapops.formats.generation.source import GitTreeSource
from snapops.formats.looseobject import copy_stored_blob
from snapops.hooks.gitio import Git


def git(repo: Path, *args: str, data: bytes | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, input=data, capture_output=True,
                          check=True).stdout.decode().strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "core.looseCompression", "0")
    return path


def store(repo: Path, content: bytes) -> str:
    return git(repo, "hash-object", "-w", "--stdin", data=content)


def object_file(repo: Path, oid: str) -> Path:
    return repo / ".git" / "objects" / oid[:2] / oid[2:]


def copy(repo: Path, oid: str, size: int, tmp_path: Path) -> tuple[str | None, bytes]:
    target = tmp_path / "out.bin"
    target.unlink(missing_ok=True)
    with open(target, "xb") as out:
        digest = copy_stored_blob(repo / ".git" / "objects", oid, out, size=size)
    return digest, target.read_bytes()


def zlib_stored(payload: bytes, block: int) -> bytes:
    """A valid zlib stream of ``payload`` in stored blocks of ``block`` bytes (git never
    writes such tiny ones; zlib itself reads them)."""
    parts = [b"\x78\x01"]
    pieces = [payload[i:i + block] for i in range(0, len(payload), block)] or [b""]
    for index, piece in enumerate(pieces):
        final = index == len(pieces) - 1
        parts.append(bytes([1 if final else 0]) + struct.pack("<HH", len(piece),
                                                               len(piece) ^ 0xFFFF) + piece)
    parts.append(struct.pack(">I", zlib.adler32(payload)))
    stream = b"".join(parts)
    assert zlib.decompress(stream) == payload
    return stream


def replace_object(repo: Path, oid: str, stream: bytes) -> None:
    path = object_file(repo, oid)
    path.chmod(0o644)
    path.write_bytes(stream)


@pytest.mark.parametrize("size", [0, 1, 70_000, 3 * 2**20 + 17])
def test_a_stored_blob_is_copied_with_its_digest(repo: Path, tmp_path: Path, size: int) -> None:
    content = os.urandom(size)
    oid = store(repo, content)
    digest, copied = copy(repo, oid, size, tmp_path)
    assert copied == content
    assert digest == hashlib.sha256(content).hexdigest()


def test_a_deflated_blob_is_left_to_git(repo: Path, tmp_path: Path) -> None:
    git(repo, "config", "core.looseCompression", "1")
    content = b"weights " * 10_000
    oid = store(repo, content)
    assert copy(repo, oid, len(content), tmp_path) == (None, b"")
    out = tmp_path / "via-git.bin"
    with open(out, "xb") as f:
        assert Git(repo).blob_to(oid, f, size=len(content)) is None
    assert out.read_bytes() == content


def test_a_packed_blob_is_left_to_git(repo: Path, tmp_path: Path) -> None:
    content = os.urandom(100_000)
    oid = store(repo, content)
    git(repo, "tag", "t", oid)
    git(repo, "repack", "-a", "-d", "-q")
    git(repo, "prune-packed")
    assert not object_file(repo, oid).exists()
    assert copy(repo, oid, len(content), tmp_path) == (None, b"")
    out = tmp_path / "via-git.bin"
    with open(out, "xb") as f:
        Git(repo).blob_to(oid, f, size=len(content))
    assert out.read_bytes() == content


def test_a_damaged_blob_fails_as_git_fails(repo: Path, tmp_path: Path) -> None:
    """One flipped content byte: the Adler-32 differs, nothing is copied, and git's own
    reading of the object fails (no damaged bytes reach the caller either way)."""
    content = os.urandom(200_000)
    oid = store(repo, content)
    stream = bytearray(object_file(repo, oid).read_bytes())
    stream[len(stream) // 2] ^= 0x01
    replace_object(repo, oid, bytes(stream))
    assert copy(repo, oid, len(content), tmp_path) == (None, b"")
    with open(tmp_path / "via-git.bin", "xb") as f, \
            pytest.raises(GitError, match="cat-file blob"):
        Git(repo).blob_to(oid, f, size=len(content))


@pytest.mark.parametrize("damage", ["truncated", "trailing byte", "wrong size",
                                    "length complement", "deflated block"])
def test_a_stream_that_is_not_whole_is_left_to_git(repo: Path, tmp_path: Path,
                                                   damage: str) -> None:
    content = os.urandom(150_000)
    oid = store(repo, content)
    stream = bytearray(object_file(repo, oid).read_bytes())
    size = len(content)
    if damage == "truncated":
        stream = stream[:-1000]
    elif damage == "trailing byte":
        stream += b"\0"
    elif damage == "wrong size":
        size += 1
    elif damage == "length complement":
        stream[5] ^= 0xFF            # NLEN of the first block no longer complements LEN
    else:
        stream[2] |= 0x02            # the first block claims fixed Huffman codes
    replace_object(repo, oid, bytes(stream))
    assert copy(repo, oid, size, tmp_path) == (None, b"")


def test_crafted_valid_streams_git_would_read_are_left_to_git(repo: Path,
                                                              tmp_path: Path) -> None:
    """Valid zlib that git reads, in shapes git never writes: 1-byte blocks (a bound on the
    work per byte), a header split across blocks. git still answers, with the content."""
    content = os.urandom(20_000)
    oid = store(repo, content)
    payload = b"blob %d\0" % len(content) + content
    for stream in (zlib_stored(payload, 1), zlib_stored(payload, 4)):
        replace_object(repo, oid, stream)
        assert copy(repo, oid, len(content), tmp_path) == (None, b"")
        out = tmp_path / "via-git.bin"
        out.unlink(missing_ok=True)
        with open(out, "xb") as f:
            Git(repo).blob_to(oid, f, size=len(content))
        assert out.read_bytes() == content


def test_only_blobs_are_copied(repo: Path, tmp_path: Path) -> None:
    (repo / "f").write_bytes(b"x" * 5000)
    git(repo, "add", "f")
    tree = git(repo, "write-tree")
    size = int(git(repo, "cat-file", "-s", tree))
    assert copy(repo, tree, size, tmp_path) == (None, b"")


def test_names_and_links_that_are_not_objects(repo: Path, tmp_path: Path) -> None:
    content = os.urandom(5000)
    oid = store(repo, content)
    for name in ("../../HEAD", oid.upper(), oid[:-1], "g" * 40):
        assert copy(repo, name, len(content), tmp_path) == (None, b"")
    outside = tmp_path / "elsewhere"
    outside.write_bytes(object_file(repo, oid).read_bytes())
    object_file(repo, oid).unlink()
    object_file(repo, oid).symlink_to(outside)
    assert copy(repo, oid, len(content), tmp_path) == (None, b"")


def test_the_quarantine_area_is_where_new_objects_are_read(repo: Path, tmp_path: Path,
                                                         monkeypatch) -> None:
    """In a pre-receive hook git points GIT_OBJECT_DIRECTORY at the push's quarantine (only
    `snapops hook` takes git's variables: any other command names its repository)."""
    import snapops.formats.gitcmd as gitcmd

    monkeypatch.setattr(gitcmd, "_as_hook", True)
    quarantine = tmp_path / "incoming"
    quarantine.mkdir()
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(quarantine))
    monkeypatch.setenv("GIT_ALTERNATE_OBJECT_DIRECTORIES", str(repo / ".git" / "objects"))
    assert Git(repo).objects_dir().resolve() == quarantine.resolve()


def test_a_tree_source_knows_the_digest_of_what_it_copied(repo: Path, tmp_path: Path) -> None:
    content = os.urandom(300_000)
    (repo / "snapshots").mkdir()
    (repo / "snapshots" / "0000.aero").write_bytes(content)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    source = GitTreeSource(Git(repo), "HEAD", scratch)
    with source.file("snapshots/0000.aero") as local:
        assert local.read_bytes() == content
        assert source.hashed(local) == hashlib.sha256(content).hexdigest()
    assert source.hashed(local) is None and not local.exists()


def test_a_read_error_midway_leaves_nothing_and_git_answers(repo: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    """An I/O error on the object file after part of it was copied (injected from the third
    read on): the part is removed and git is asked, which reads the object itself."""
    import snapops.formats.looseobject as loose

    content = os.urandom(3 * 2**20)
    oid = store(repo, content)
    reads = {"n": 0}
    real = os.preadv

    def failing(fd, buffers, offset):
        reads["n"] += 1
        if reads["n"] >= 3:
            raise OSError(5, "Input/output error")
        return real(fd, buffers, offset)

    monkeypatch.setattr(loose.os, "preadv", failing)
    assert copy(repo, oid, len(content), tmp_path) == (None, b"")
    assert reads["n"] == 3          # the header, one window, then the error
    out = tmp_path / "via-git.bin"
    with open(out, "xb") as f:
        assert Git(repo).blob_to(oid, f, size=len(content)) is None   # git wrote it
    assert out.read_bytes() == content


def stored_block(piece: bytes, final: bool = False) -> bytes:
    return bytes([int(final)]) + struct.pack("<HH", len(piece), len(piece) ^ 0xFFFF) + piece


def test_the_window_kernel_joins_whole_blocks_and_stops_at_a_cut_one() -> None:
    """join_stored_blocks against a plain reading of the same blocks: contents joined at the
    front, the block cut by the window's end left for the next window, the final block
    ending the stream, a block header that is not a stored block's refused."""
    from snapops.formats._kernels import join_stored_blocks

    pieces = [os.urandom(n) for n in (5, 0, 32768, 1)]
    window = bytearray(b"".join(stored_block(p) for p in pieces) + stored_block(b"x" * 50)[:20])
    got = len(window)
    window += b"\xee" * 100                          # beyond `got`: never read
    consumed, filled, blocks, final = join_stored_blocks(window, got)
    assert (consumed, blocks, final) == (sum(5 + len(p) for p in pieces), 4, False)
    assert bytes(window[:filled]) == b"".join(pieces)

    ending = bytearray(stored_block(b"ab") + stored_block(b"cd", final=True) + stored_block(b"e"))
    assert join_stored_blocks(ending, len(ending)) == (14, 4, 2, True)
    assert bytes(ending[:4]) == b"abcd"

    for bad in (b"\x02" + stored_block(b"ab")[1:], stored_block(b"ab")[:3] + b"\0\0"):
        assert join_stored_blocks(bytearray(bad), len(bad)) is None
    with pytest.raises(ValueError, match="got must be 0..4"):
        join_stored_blocks(bytearray(4), 5)
    with pytest.raises(BufferError, match="read-only|not writable"):
        join_stored_blocks(bytes(10), 10)


def test_blocks_cut_by_every_window_are_copied_whole(repo: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    """Windows far smaller than the object (and than a block): each block is read again
    from its start by the next window, and the copy is exact."""
    import snapops.formats.looseobject as loose

    content = os.urandom(400_000)
    oid = store(repo, content)
    monkeypatch.setattr(loose, "_WINDOW", 100_003)
    digest, copied = copy(repo, oid, len(content), tmp_path)
    assert copied == content and digest == hashlib.sha256(content).hexdigest()
