"""MANIFEST v2: canonical render/parse, strict grammar, structure rules, seal."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from snapops.formats.errors import ChecksumError, FormatError, LimitError, SignatureError
from snapops.formats.generation import (
    ArrayRecord, FileRecord, Header, Manifest, Part, Prev, ShardRecord, Stats, array_stats,
    check_seal, parse_manifest, seal_manifest,
)
from snapops.formats.generation.manifest import MAX_BYTES, quote_name, unquote_name

TS = "2026-01-02T03:04:05Z"
H1, H2 = "1" * 64, "2" * 64


def sample(gen: int = 3, **header) -> Manifest:
    m = Manifest(Header("run1", gen, TS, "b-7", "wtxt", **header), Prev(gen - 1, H1))
    m.shards += [ShardRecord("shards/0000.wtxt", "wtxt", 1234, H1, gen, H2, merkle_this=H2),
                 ShardRecord("shards/0001.wtxt", "wtxt", 99, H2, 1, H1, merkle_this=H1)]
    m.files.append(FileRecord("shards/0000.wtxt.wsum", "wsum", "shards/0000.wtxt", 331, H2))
    m.arrays += [
        ArrayRecord("blocks.0.attn.in_proj_bias", "bf16", (6, 4), stored="u16",
                    stats=Stats(1.5, -0.25, 2.0, 0.125, nan=1, inf=2),
                    parts=(Part("shards/0000.wtxt", "blocks__0__attn__in_proj_bias",
                                ((0, 6), (0, 4))),)),
        ArrayRecord("emb", "f32", (10, 3), stats=Stats(3.0, -1.0, 1.0, 0.0),
                    parts=(Part("shards/0000.wtxt", "emb", ((0, 4), (0, 3))),
                           Part("shards/0001.wtxt", "emb", ((4, 10), (0, 3))))),
        ArrayRecord("step", "i64", (), parts=(Part("shards/0001.wtxt", "step", ()),)),
    ]
    return m


def test_round_trip_is_exact():
    data = sample().render()
    parsed = parse_manifest(data)
    assert parsed == sample()
    assert parsed.render() == data
    assert data.startswith(b"SNAPOPS-MANIFEST 2\ngeneration run=run1 gen=000003 ")
    assert b"\narray name=blocks.0.attn.in_proj_bias dtype=bf16 stored=u16 shape=6,4 " in data
    assert data.endswith(b"end\nseal ed25519=- hmac=-\n")


def test_names_are_percent_encoded_both_ways():
    for name in ["a b", "x=y", "ünï", "tab\there", "%", "a/b:c-d.e_f"]:
        assert unquote_name(quote_name(name)) == name
    assert quote_name("a b=") == "a%20b%3D"


@pytest.mark.parametrize("old,new,expected", [
    (b"SNAPOPS-MANIFEST 2", b"SNAPOPS-MANIFEST 1", "SNAPOPS-MANIFEST 2"),
    (b"gen=000003 ts", b"gen=0000003 ts", "canonical gen"),
    (b"size=1234", b"size=01234", "shard line"),
    (b"path=shards/0001.wtxt format", b"path=../0001.wtxt format", "relative path"),
    (b"path=shards/0001.wtxt format", b"path=/etc/x format", "relative path"),
    (b"path=shards/0001.wtxt format", b"path=shards/./x format", "relative path"),
    (b"path=shards/0001.wtxt format", b"path=shards/" + b"x" * 256 + b" format",
     "at most 255 characters each"),                 # no file system holds such a name
    (b"norm=1.5 ", b"norm=1.50 ", "canonical"),
    (b"end\n", b"end \n", "shard, file or array"),
    (b"seal ed25519=- hmac=-", b"seal ed25519=- hmac=-\nextra", "nothing after"),
    (b"run=run1", b"run=run..1", "run name"),
    (b"dtype=f32", b"dtype=F32", "array line"),
])
def test_grammar_violations_name_the_line(old, new, expected):
    data = sample().render()
    assert old in data
    with pytest.raises(FormatError, match=expected):
        parse_manifest(data.replace(old, new, 1), "snapshots/run1/MANIFEST")


def test_non_ascii_cr_and_missing_lf_refused():
    data = sample().render()
    with pytest.raises(FormatError, match="ASCII"):
        parse_manifest(data.replace(b"b-7", b"b\xff7"))
    with pytest.raises(FormatError, match="CR or TAB"):
        parse_manifest(data.replace(b"\nend\n", b"\nend\r\n"))
    with pytest.raises(FormatError, match="final LF"):
        parse_manifest(data[:-1])


def test_size_limit_checked_before_decoding():
    with pytest.raises(LimitError, match="at most"):
        parse_manifest(b"x" * (MAX_BYTES + 1))


def test_truncation_at_every_line_is_a_typed_error():
    lines = sample().render().split(b"\n")
    for cut in range(len(lines) - 1):
        with pytest.raises(FormatError, match=r"MANIFEST:\d+|MANIFEST:@\d+"):
            parse_manifest(b"\n".join(lines[:cut]) + b"\n")


@pytest.mark.parametrize("mutate,expected", [
    (lambda m: _replace_part(m, 1, 1, box=((3, 10), (0, 3))), "tile"),
    (lambda m: _replace_part(m, 1, 1, box=((5, 10), (0, 3))), "tile"),
    (lambda m: _replace_part(m, 1, 1, shard="shards/9999.wtxt"), "unlisted shard"),
    (lambda m: _replace_part(m, 1, 1, box=((4, 11), (0, 3))), "outside the shape"),
    (lambda m: m.shards.append(m.shards[0]), "listed twice"),
    (lambda m: m.arrays.reverse(), "name order"),
    (lambda m: m.files.append(FileRecord("x.wsum", "wsum", "nope", 1, H1)), "not listed"),
])
def test_structure_rules(mutate, expected):
    m = sample()
    mutate(m)
    with pytest.raises(FormatError, match=expected):
        parse_manifest(m.render())


def _replace_part(m: Manifest, a: int, p: int, **changes) -> None:
    import dataclasses

    arr = m.arrays[a]
    parts = list(arr.parts)
    parts[p] = dataclasses.replace(parts[p], **changes)
    m.arrays[a] = dataclasses.replace(arr, parts=tuple(parts))


def test_prev_must_be_older():
    m = sample()
    m.prev = Prev(3, H1)
    with pytest.raises(FormatError, match="prev gen must be lower"):
        parse_manifest(m.render())


def test_multirank_boxes_and_world():
    m = Manifest(Header("r", 1, TS, "b", "aero", world=2))
    m.shards.append(ShardRecord("shards/0000.aero", "aero", 1, H1, 1, H2))
    parts = tuple(Part("shards/0000.aero", f"w@{r}", ((0, 4), (2 * r, 2 * r + 2)), rank=r)
                  for r in range(2))
    m.arrays.append(ArrayRecord("w", "f32", (4, 4), parts=parts))
    assert parse_manifest(m.render()) == m
    m.arrays[0] = ArrayRecord("w", "f32", (4, 4), parts=parts[:1] + (
        Part("shards/0000.aero", "w@2", ((0, 4), (2, 4)), rank=2),))
    with pytest.raises(FormatError, match="not below world size"):
        parse_manifest(m.render())


@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 5),
                          st.floats(allow_nan=True, allow_infinity=True)),
                min_size=1, max_size=6, unique_by=lambda t: t[0]))
def test_round_trip_property(items):
    m = Manifest(Header("r", 7, TS, "b", "fold"), Prev())
    m.shards.append(ShardRecord("shards/0000.fold", "fold", 5, H1, 7, H2))
    for name, n, value in sorted(items, key=lambda t: t[0].encode("utf-8", "surrogatepass")):
        stats = Stats(abs(value) if not math.isnan(value) else 0.0, value, value, value)
        canonical = parse_manifest(Manifest(m.header, m.prev, m.shards, [], [ArrayRecord(
            name, "f64", (n,), stats=stats,
            parts=(Part("shards/0000.fold", name, ((0, n),)),))]).render())
        m.arrays.append(canonical.arrays[0])
    assert parse_manifest(m.render()).render() == m.render()


def test_stats_finite_values_and_counts():
    a = np.array([[1, -2], [np.nan, np.inf]], np.float16)
    assert array_stats(a) == Stats(math.sqrt(5), -2.0, 1.0, -0.5, nan=1, inf=1)
    assert array_stats(np.array([True, False])) == Stats(1.0, 0.0, 1.0, 0.5)
    empty = array_stats(np.zeros((0, 3), np.float32))
    assert empty.norm == 0.0 and math.isnan(empty.min)
    assert array_stats(np.zeros(3, np.complex64)) is None
    import ml_dtypes

    bf = np.array([1.0, 2.0], ml_dtypes.bfloat16)
    assert array_stats(bf).max == 2.0



@pytest.mark.parametrize("specials", [[], [3], [0, 9], [4, 5, 6, 7], list(range(12))])
def test_stats_over_chunks_skip_only_what_is_not_finite(monkeypatch, specials):
    """Chunks of 4: an inf or NaN anywhere leaves the extremes, sums and counts of the finite
    values, wherever in a chunk (or in every chunk) it falls."""
    from snapops.formats.generation import stats

    monkeypatch.setattr(stats, "CHUNK_ELEMS", 4)
    a = np.array([5.0, -1.5, 2.0, 0.25, 9.0, -7.0, 3.0, 1.0, -0.5, 4.0, 6.0, -2.0], np.float32)
    for n, i in enumerate(specials):
        a[i] = [np.inf, np.nan, -np.inf][n % 3]
    finite = a[np.isfinite(a)].astype(np.float64)
    got = stats.array_stats(a)
    assert (got.nan, got.inf) == (int(np.isnan(a).sum()), int(np.isinf(a).sum()))
    if finite.size:
        assert (got.min, got.max) == (finite.min(), finite.max())
        assert got.mean == pytest.approx(finite.mean()) and got.norm == pytest.approx(
            math.sqrt((finite ** 2).sum()))
    else:
        assert math.isnan(got.min) and math.isnan(got.max)

# --- seal ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def key():
    return Ed25519PrivateKey.generate()


def test_seal_binds_every_byte_of_the_body(key):
    sealed = seal_manifest(sample(), key, b"h" * 32)
    data = sealed.render()
    assert parse_manifest(data).seal == sealed.seal
    assert check_seal(sealed, trusted_keys=key.public_key(), hmac_key=b"h" * 32,
                      require_signature=True, require_hmac=True) == []
    body_len = len(sealed.body())
    for pos in range(0, body_len, 7):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        try:
            tampered = parse_manifest(bytes(flipped))
        except FormatError:
            continue  # the grammar caught it first
        with pytest.raises(SignatureError, match="does not verify|not trusted|both be present"):
            check_seal(tampered, trusted_keys=key.public_key())
        with pytest.raises((ChecksumError, SignatureError), match="HMAC|keyid"):
            check_seal(tampered, hmac_key=b"h" * 32)


def test_seal_is_deterministic(key):
    assert seal_manifest(sample(), key, b"k").render() == seal_manifest(sample(), key, b"k").render()


def test_untrusted_key_and_missing_signature(key):
    other = Ed25519PrivateKey.generate()
    sealed = seal_manifest(sample(), other)
    with pytest.raises(SignatureError, match="not trusted"):
        check_seal(sealed, trusted_keys=key.public_key())
    with pytest.raises(SignatureError, match="not signed"):
        check_seal(sample(), trusted_keys=key.public_key())
    with pytest.raises(SignatureError, match="not signed"):
        check_seal(sample(), require_signature=True)
    with pytest.raises(SignatureError, match="no trusted keys"):
        check_seal(sealed, require_signature=True)
    assert check_seal(sealed) == [
        f"signature by keyid {sealed.header.keyid} not checked (no trusted keys given)",
        "MANIFEST HMAC not checked (no HMAC key given)"]


def test_hmac_rules(key):
    with pytest.raises(ChecksumError, match="HMAC does not match"):
        check_seal(seal_manifest(sample(), None, b"a"), hmac_key=b"b")
    with pytest.raises(ChecksumError, match="HMAC does not match"):
        check_seal(sample(), hmac_key=b"b")
    with pytest.raises(ChecksumError, match="no HMAC key"):
        check_seal(sample(), require_hmac=True)


def test_stripped_seal_is_refused(key):
    sealed = seal_manifest(sample(), key)
    stripped = parse_manifest(sealed.body() + b"seal ed25519=- hmac=-\n")
    with pytest.raises(SignatureError, match="both be present"):
        check_seal(stripped)


def test_read_manifest_parses_bytes_once_and_hands_each_caller_its_own_lists(tmp_path,
                                                                              monkeypatch):
    """A restore reads the MANIFEST in three places (verifier, loader, LFS layer): one parse;
    a caller changing its lists does not change what the next caller gets."""
    from snapops.formats.generation import verify
    from snapops.formats.generation.source import FolderSource

    folder = tmp_path / "snapshots" / "run1"
    folder.mkdir(parents=True)
    (folder / "MANIFEST").write_bytes(sample().render())
    parsed = []
    monkeypatch.setattr(verify, "parse_manifest",
                        lambda data, path: parsed.append(path) or parse_manifest(data, path))
    verify._parsed.cache_clear()
    source = FolderSource(tmp_path)
    _, first = verify.read_manifest(source, "run1")
    first.shards.clear()
    first.arrays.append(first.arrays[0])
    data, second = verify.read_manifest(source, "run1")
    assert len(parsed) == 1 and second == sample() and second.render() == data
    (folder / "MANIFEST").write_bytes(sample(gen=4).render())     # new bytes: parsed anew
    assert verify.read_manifest(source, "run1")[1].header.gen == 4 and len(parsed) == 2
