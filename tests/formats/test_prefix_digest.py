"""PrefixDigest: the SHA-256 of a file written out of order, hashed in file order."""

import hashlib
import os
import random
import threading

import pytest

from snapops.formats.prefix_digest import BLOCK, PrefixDigest


def _regions(size: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    cuts = sorted({0, size, *(rng.randrange(size) for _ in range(40))})
    regions = list(zip(cuts, cuts[1:]))
    rng.shuffle(regions)
    return regions


@pytest.mark.parametrize("base", [0, 5])
def test_regions_written_in_any_order_from_two_threads_give_the_file_digest(tmp_path, base):
    size = 2 * BLOCK + 12345  # more than one read block
    data = random.Random(1).randbytes(size)
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"x" * base, 0)
        digest = PrefixDigest(fd, base, size)
        regions = _regions(size, 2)

        def write(share):
            for start, end in share:
                os.pwrite(fd, data[start:end], base + start)
                digest.finished(start, end)

        threads = [threading.Thread(target=write, args=(regions[i::2],)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
        assert hashlib.sha256(path.read_bytes()[base:]).hexdigest() == digest.hexdigest()
    finally:
        os.close(fd)


@pytest.fixture
def four_bytes(tmp_path):
    """A descriptor of a file holding b"abcd"."""
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT)
    os.pwrite(fd, b"abcd", 0)
    yield fd
    os.close(fd)


def test_a_region_never_reported_is_an_error_not_a_hang(four_bytes):
    digest = PrefixDigest(four_bytes, 0, 4)
    digest.finished(2, 4)
    with pytest.raises(RuntimeError, match="from offset 0 were never reported"):
        digest.hexdigest()
    digest.cancel()


def test_a_file_shorter_than_reported_fails_with_the_offset(four_bytes):
    digest = PrefixDigest(four_bytes, 0, 8)
    digest.finished(0, 8)   # claims 8 bytes, the file holds 4
    with pytest.raises(OSError, match="short read at offset 4"):
        digest.hexdigest()
