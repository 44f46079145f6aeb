"""What the fuzzer runs on a mutated file: every format's verbs (verify, inspect, load
without the verify pass, every array through open_lazy), the WTXT delta, WSUM, age armor,
MANIFEST and ledger readers, every CLI entry point through ``snapops.cli.main`` (with
``SNAPOPS_DEBUG=1`` so an untyped failure surfaces instead of its one-line message), and what
snapops reads besides snapshots: the daemon's inputs (spool, WAL, config, status file,
another node's PART), a loose git object copied out of the object store, a tree's LFS files
(pointer, ``.lfsconfig``, retention record), LFS batch answers, key files and the hooks'
input lines.

A case passes when every call returns or raises a :class:`SnapopsError`; anything else
(another exception, an exit code outside 0-2, a signal, a timeout, running out of the memory
limit) is a finding.
"""

from __future__ import annotations

import dataclasses
import io
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .mutate import mutate, mutate_member
from .seeds import LFS_OIDS, RUN

FORMAT_FILES = {"wtxt": "wtxt/s.wtxt", "aero": "aero/s.aero",
                "aeroset": "aeroset/model.aeroset.json", "fold": "fold/s.fold",
                "pycauset": "pycauset/s.pycauset", "finf": "finf/s.finf", "npz": "npz/s.npz",
                "safetensors": "safetensors/s.safetensors", "pt": "pt/s.pt"}
TEXT_FILES = (".wtxt", ".wsum", ".wtxtdelta", ".json", ".age", "MANIFEST", ".ledger", ".toml",
              "pointer", "lfsconfig", ".retention", ".key", ".pub", "stdin", "PART")
CONVERT_TO = ("wtxt", "fold", "npz", "safetensors", "aero", "finf", "pycauset")


class Finding(Exception):
    """A case broke the rules in a way that is not an exception (an exit code)."""


@dataclass
class Case:
    """One mutated input: ``path`` (the mutated file) inside the worker's copy ``root`` of
    the seeds; ``pristine`` is the untouched seed folder, ``out`` a scratch folder."""

    root: Path
    pristine: Path
    out: Path
    path: Path
    index: int
    typed: int = 0

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def wtxt_keys(self) -> dict:
        return {"hmac_key": self.keys / "hmac.key", "trusted_keys": (str(self.keys),)}

    def call(self, fn: Callable, *args, **kwargs):
        """Run ``fn``; a SnapopsError counts as a typed refusal, anything else propagates."""
        from snapops.formats.errors import SnapopsError

        try:
            return fn(*args, **kwargs)
        except SnapopsError:
            self.typed += 1
            return None

    def cli(self, *argv) -> None:
        from snapops.cli import main

        code = main([str(a) for a in argv])
        if code not in (0, 1, 2):
            raise Finding(f"snapops {argv[0]} exited {code}")
        self.typed += code != 0


@dataclass(frozen=True)
class Target:
    name: str
    files: tuple[str, ...]          # seed-relative files mutated (case index picks one)
    run: Callable[[Case], None]
    timeout: int | None = None      # seconds per case, when not the campaign's
    members: bool = False           # mutate one zip member and re-zip (CRCs right)

    def file_for(self, index: int) -> str:
        return self.files[index % len(self.files)]

    def case_bytes(self, original: bytes, seed: int, index: int) -> bytes:
        """The input of case ``index``: all a finding needs to be reproduced."""
        if self.members:
            return mutate_member(original, seed=seed, target=self.name, index=index)
        rel = self.file_for(index)
        return mutate(original, seed=seed, target=self.name, index=index,
                      text=self.is_text(rel), json_doc=rel.endswith(".json"))

    def is_text(self, rel: str) -> bool:
        return rel.endswith(TEXT_FILES)


def _read_lazy(fmt, path) -> None:
    with fmt.open_lazy(path) as lazy:
        for name in lazy.names:
            lazy[name]


def format_verbs(fmt_name: str, rel: str) -> Callable[[Case], None]:
    def run(case: Case) -> None:
        from snapops.formats.registry import handler

        fmt = handler(fmt_name)
        path = case.root / rel
        keys = case.wtxt_keys() if fmt_name == "wtxt" else {}
        report = case.call(fmt.verify, path, **keys)
        case.typed += report is not None and not report.ok
        case.call(fmt.inspect, path)
        case.call(fmt.load, path, verify=False, **keys)
        case.call(_read_lazy, fmt, path)
    return run


def chained(*runs: Callable[[Case], None]) -> Callable[[Case], None]:
    def run(case: Case) -> None:
        for one in runs:
            one(case)
    return run


def run_delta(case: Case) -> None:
    from snapops.formats.wtxt.delta import apply_delta

    case.call(apply_delta, case.root / "delta/base.wtxt", case.root / "delta/d.wtxtdelta",
              case.out / "o.wtxt", **case.wtxt_keys())


def run_age(case: Case) -> None:
    from snapops.formats.armor import decrypt_file
    from snapops.formats.registry import verify_any

    case.call(decrypt_file, case.path, case.out / "plain.wtxt", case.keys / "age.key")
    report = case.call(verify_any, case.path, identity=case.keys / "age.key")
    case.typed += report is not None and not report.ok


def run_lfs_batch(case: Case) -> None:
    """A server's batch answer read as the LFS client reads it (no network: the same
    functions, on the mutated bytes)."""
    from snapops.formats.lfs import client

    def read(data: bytes) -> None:
        answer = client.parse_answer(data, "LFS POST batch")
        for oid, item in zip(LFS_OIDS, client.batch_items(answer, [(o, 1) for o in LFS_OIDS])):
            case.call(client._raise_item_error, item, oid)
            for name in ("upload", "verify", "download"):
                action = case.call(client.offered_action, item, name, oid)
                if action is not None:
                    client._headers(action)
    case.call(read, case.path.read_bytes())


def generation_verbs(folder: str) -> Callable[[Case], None]:
    """Verify, load unverified, restore (decoded while verified, each shard proven by its
    arrays' content digest or else its file digest) and read the ledger of the generation
    in ``folder``."""
    def run(case: Case) -> None:
        from snapops.formats.generation.load import load_from_source
        from snapops.formats.generation.source import FolderSource
        from snapops.formats.generation.verify import GenerationOptions, verify_generation
        from snapops.formats.ledger import Ledger

        repo = case.root / folder
        opts = GenerationOptions(trusted_keys=[case.keys], hmac_key=case.keys / "hmac.key",
                                 require_signature=True)
        report = case.call(verify_generation, FolderSource(repo), RUN, opts)
        case.typed += report is not None and not report.ok
        case.call(load_from_source, FolderSource(repo), RUN, verify=False, options=opts)
        case.call(load_from_source, FolderSource(repo), RUN,
                  options=dataclasses.replace(opts, deep=False))
        ledger = Ledger(repo / "ledger" / f"{RUN}.ledger", root=repo)
        report = case.call(ledger.verify)
        case.typed += report is not None and not report.ok
        case.call(lambda: list(ledger.lines()))
    return run


run_generation = generation_verbs("gen")


def cli_verify(case: Case) -> None:
    case.cli("verify", case.path, "--hmac-key", case.keys / "hmac.key", "--trusted-key",
             case.keys)


def cli_inspect(case: Case) -> None:
    case.cli("inspect", case.path)


def cli_convert(case: Case) -> None:
    to = CONVERT_TO[(case.index // len(FORMAT_FILES)) % len(CONVERT_TO)]
    extra = ("--no-verify",) if case.index % 3 == 0 else ()
    case.cli("convert", case.path, case.out / "o.bin", "--to", to, "--ts",
             "2026-01-02T03:04:05Z", *extra)


def cli_textconv(case: Case) -> None:
    case.cli("textconv", case.path)


def cli_diff(case: Case) -> None:
    case.cli("diff", case.pristine / case.path.relative_to(case.root), case.path)


def run_residual(case: Case) -> None:
    """A residual as an LFS server could hand it over: its target's bytes or a typed error,
    never other bytes."""
    from snapops.formats.generation.residual import decode_residual

    folder = case.root / "residual"
    out = case.call(decode_residual, (folder / "base.bin").read_bytes(), case.path.read_bytes())
    if out is not None and out != (folder / "target.bin").read_bytes():
        raise Finding("a residual decoded to bytes other than its target's")


def run_spool(case: Case) -> None:
    """A spool file as the daemon opens it: every array, CRC-checked."""
    from snapops.daemon.spool import Spool

    def read() -> None:
        spool = Spool(case.path)
        try:
            for array in spool.arrays().values():
                array.tobytes()
        finally:
            spool.close()
    case.call(read)


def run_wal(case: Case) -> None:
    """The WAL replayed as the daemon replays it at start-up (bad lines are skipped and
    reported, never raised) for one writer and for a world of two ranks."""
    from snapops.daemon.wal import replay

    for writers in (frozenset({"0"}), frozenset({"0", "1"})):
        state, reader = case.call(replay, case.path, writers) or (None, None)
        if state is not None:       # a skipped line or an ignored record is the refusal
            state.in_state("REQ", "SPOOLED", "SERIALIZED", "COMMITTED", "PUSHED")
            case.typed += bool(reader.bad or state.rejected or reader.problem)


def review_manifests(case: Case) -> None:
    """The generation review from two MANIFESTs alone (what CI posts on a pull request,
    which it does not verify first), the pristine one against the mutated one, both ways."""
    pristine = case.pristine / case.path.relative_to(case.root)
    for a, b, fmt in ((pristine, case.path, "md"), (case.path, pristine, "json")):
        case.cli("diff", a, b, "--manifest-only", "--format", fmt, "-o", case.out / "r")


def cli_delta_apply(case: Case) -> None:
    case.cli("delta", "apply", case.root / "delta/base.wtxt", case.root / "delta/d.wtxtdelta",
             case.out / "o.wtxt", "--hmac-key", case.keys / "hmac.key")


def cli_decrypt(case: Case) -> None:
    case.cli("decrypt", case.path, case.out / "plain", "-i", case.keys / "age.key")


def run_config(case: Case) -> None:
    """The daemon's config file as ``load_config`` reads it (no environment overrides)."""
    from snapops.config import load_config

    case.call(load_config, case.path, env={})


def run_daemon_status(case: Case) -> None:
    """``snapops daemon status`` (text and JSON) on a status file the daemon did not write."""
    from snapops.cli.daemon import daemon_state

    config = case.root / "status" / "snapops.toml"
    case.cli("daemon", "status", "--config", config)
    case.cli("daemon", "status", "--config", config, "--json")
    case.typed += daemon_state(case.path)[1] is not None    # set aside, with a warning


def run_lfs_pointer(case: Case) -> None:
    """A pointer file in a tree: recognised and parsed, or refused."""
    from snapops.formats.lfs.pointer import is_pointer, parse_pointer

    data = case.path.read_bytes()
    is_pointer(data)
    case.call(parse_pointer, data, str(case.path))


def run_retention(case: Case) -> None:
    """A tree's retention record (which generations' LFS objects were pruned): parsed and
    rendered back to the same bytes, or refused."""
    from snapops.formats.lfs.retention import parse_record

    data = case.path.read_bytes()
    record = case.call(parse_record, data, str(case.path))
    if record is not None and record.render() != data:
        raise Finding("a retention record parsed into one that renders other bytes")


def run_lfsconfig(case: Case) -> None:
    """A tree's ``.lfsconfig``: the endpoint it names, and a client for it (refused unless
    http(s))."""
    from snapops.formats.lfs.access import choose_endpoint, open_client

    url, where = choose_endpoint(None, case.path.read_bytes(), "https://git.example/o/r.git")
    if url is not None:
        case.call(open_client, url, None, where)


def run_key_file(case: Case) -> None:
    """A key file as the commands that take one read it; then a verify that uses it."""
    from snapops.formats.armor import load_identities
    from snapops.formats.keys import (
        load_hmac_key, load_public_key, load_signing_key, load_trusted_keys,
    )

    loader = {"hmac.key": load_hmac_key, "signing.key": load_signing_key,
              "signing.pub": load_public_key, "age.key": load_identities}[case.path.name]
    case.call(loader, case.path)
    case.call(load_trusted_keys, [case.keys])
    cli_verify(dataclasses.replace(case, path=case.root / FORMAT_FILES["wtxt"]))


def run_part(case: Case) -> None:
    """Another node's PART as the committer reads it: with the run's HMAC key and, to reach
    past the seal, without; a part that passes is assembled into a generation beside the
    committer's own rank 0 (layout, statistics, seal), whose MANIFEST must parse back."""
    import numpy as np

    from snapops.daemon.parts import parse_part
    from snapops.formats.errors import SnapopsError
    from snapops.formats.generation.manifest import parse_manifest
    from snapops.formats.generation.plan import Shard
    from snapops.formats.generation.write import GenerationSpec, write_parts
    from snapops.formats.keys import load_hmac_key

    from .seeds import state

    data = case.path.read_bytes()
    key = load_hmac_key(case.keys / "hmac.key")
    case.call(parse_part, data, str(case.path), key)
    part = case.call(parse_part, data, str(case.path), None)
    if part is None or part.header.store != "git":
        return
    h = part.header
    w, emb = state()["blocks.0.w"], state()["emb"]
    own = {0: {"blocks.0.w": Shard(w[:5], global_shape=w.shape, offsets=(0, 0)),
               "emb": Shard(np.ascontiguousarray(emb[:2]), global_shape=emb.shape,
                            offsets=(0, 0))}}
    spec = GenerationSpec(run=h.run, format=h.format, shard_max=256, build="b1", hmac_key=key)
    written = case.call(write_parts, case.out / "repo", spec, h.gen, h.ts, own,
                        world=h.world, received=(part.written,))
    if written is None:
        return
    try:
        parse_manifest(written.data, "assembled MANIFEST")
    except SnapopsError as exc:
        raise Finding(f"the committer sealed a MANIFEST it cannot read: {exc}") from exc


def run_loose_object(case: Case) -> None:
    """A loose object file as a restore copies it out of the object store: either refused
    (nothing written, git is asked instead) or the very content zlib reads from it, after a
    ``blob <size>`` header, with that content's SHA-256."""
    import hashlib
    import zlib

    from snapops.formats.looseobject import copy_stored_blob

    data = case.path.read_bytes()
    size = int((case.root / "loose" / "size").read_text())
    oid = "ab" + "c" * 38
    objects = case.out / "objects"
    (objects / oid[:2]).mkdir(parents=True, exist_ok=True)
    (objects / oid[:2] / oid[2:]).write_bytes(data)
    target = case.out / "copied"
    with open(target, "xb") as out:
        digest = copy_stored_blob(objects, oid, out, size=size)
    copied = target.read_bytes()
    if digest is None:
        if copied:
            raise Finding(f"a refused object left {len(copied)} bytes in the output")
        case.typed += 1
        return
    try:
        whole = zlib.decompress(data)
    except zlib.error as exc:
        raise Finding(f"copied an object zlib refuses: {exc}") from exc
    if whole != b"blob %d\0" % size + copied:
        raise Finding("the copy is not the object's content")
    if digest != hashlib.sha256(copied).hexdigest():
        raise Finding("the returned SHA-256 is not the copy's")


def run_hook_input(name: str, args: tuple[str, ...]) -> Callable[[Case], None]:
    """A hook's input lines (what git writes to its stdin), on a repository that holds a
    sealed generation: an exit code of 0 or 1, never an exception."""
    def run(case: Case) -> None:
        from snapops.hooks.runner import run_hook

        code = case.call(run_hook, name, list(args), repo=str(case.root / "hook" / "remote.git"),
                         stdin=io.BytesIO(case.path.read_bytes()), out=io.StringIO())
        if code not in (None, 0, 1):
            raise Finding(f"{name} exited {code}")
        case.typed += code == 1
    return run


# writers: random snapshots (odd names, every dtype, empty and 0-d shapes, edge gen values)
# written and read back: a DataError refusal, or the same names, dtypes and bits
NAMES = ("w", "a.b", "layer.0.weight", "\u00e9", "x" * 300, "", " ", "a/b", "..", "a\nb",
         "%41", "\u540d", "a=b", "\"q\"", "-", "arr name=w", "\x00", "snapops.json",
         "__metadata__")
ODD_DTYPES = (">f4", ">i8", "M8[s]", "m8[ns]", "U3", "S4", "V2", "f2", "c8", "u1")


def random_snapshot(rng: random.Random) -> dict:
    import numpy as np

    from snapops.formats.dtypes import DTYPES

    kinds = list(DTYPES.values()) + [np.dtype(d) for d in ODD_DTYPES]
    arrays = {}
    for _ in range(rng.randint(1, 4)):
        name = rng.choice(NAMES) if rng.random() < 0.7 else "".join(
            chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randint(1, 12)))
        dtype = rng.choice(kinds)
        shape = tuple(rng.choice((0, 1, 2, 3, 7)) for _ in range(rng.choice((0, 1, 1, 2, 3))))
        count = int(np.prod(shape, dtype=np.int64))
        raw = bytes(rng.randrange(256) for _ in range(count * dtype.itemsize))
        arrays[name] = np.frombuffer(raw, dtype).reshape(shape).copy()
    return arrays


def writer_round_trip(fmt_name: str) -> Callable[[Case], None]:
    def run(case: Case) -> None:
        import numpy as np

        from snapops.formats.dtypes import dtype_name
        from snapops.formats.errors import SnapopsError
        from snapops.formats.registry import handler

        fmt = handler(fmt_name)
        rng = random.Random(case.path.read_bytes())
        arrays = random_snapshot(rng)
        fields = {"gen": rng.choice((None, 0, 3, -1, 2**64))}
        path = case.out / f"rt{fmt.suffixes[0]}"
        if case.call(fmt.save, arrays, path, **{k: v for k, v in fields.items()
                                                if v is not None}) is None:
            return
        try:
            back = fmt.load(path)
        except SnapopsError as exc:
            raise Finding(f"{fmt_name} wrote a file it cannot read back: {exc}") from exc
        if sorted(back.arrays) != sorted(arrays):
            raise Finding(f"{fmt_name}: names {sorted(arrays)!r} came back as "
                          f"{sorted(back.arrays)!r}")
        for name, want in arrays.items():
            got = np.asarray(back[name])
            if (dtype_name(got.dtype) != dtype_name(want.dtype) or got.shape != want.shape
                    or got.astype(got.dtype.newbyteorder("=")).tobytes()
                    != want.astype(want.dtype.newbyteorder("=")).tobytes()):
                raise Finding(f"{fmt_name}: {name!r} {dtype_name(want.dtype)} {want.shape} "
                              f"came back as {dtype_name(got.dtype)} {got.shape}"
                              + (" (other bits)" if got.shape == want.shape else ""))
    return run


# canaries: targets that break the rules on purpose, to show the harness reports each kind
def canary_error(case: Case) -> None:
    if case.path.read_bytes()[:1] != b"\x93":
        raise KeyError("canary")


def canary_crash(case: Case) -> None:
    if case.index == 1:
        os.kill(os.getpid(), signal.SIGSEGV)


def canary_hang(case: Case) -> None:
    if case.index == 1:
        time.sleep(600)


def canary_memory(case: Case) -> None:
    if case.index == 1:
        bytearray(64 << 30)


_FMT = tuple(FORMAT_FILES.values())
TARGETS = {t.name: t for t in [
    *(Target(name, (rel,), format_verbs(name, rel)) for name, rel in FORMAT_FILES.items()
      if name != "aeroset"),
    Target("aeroset", ("aeroset/model.aeroset.json", "aeroset/index.aero",
                       "aeroset/part-000.aero"), format_verbs("aeroset", FORMAT_FILES["aeroset"])),
    *(Target(f"{fmt}-members", (rel,), chained(format_verbs(fmt, rel), cli_textconv, cli_diff),
             members=True) for fmt, rel in (("npz", "npz/s.npz"), ("pt", "pt/s.pt"))),
    *(Target(name, (rel,), format_verbs(fmt, rel)) for name, fmt, rel in (
        ("aero-pages", "aero", "aero/p.aero"), ("fold-ecc", "fold", "fold/e.fold"),
        ("finf-raw", "finf", "finf/n.finf"),
        ("pycauset-dense", "pycauset", "pycauset/r.pycauset"))),
    Target("lfs-batch", ("lfs/batch.json",), run_lfs_batch),
    Target("npz-deflated", ("npz/c.npz",),
           chained(format_verbs("npz", "npz/c.npz"), cli_textconv, cli_diff)),
    Target("wtxt-delta", ("delta/d.wtxtdelta",), run_delta),
    Target("wsum", ("wsum/s.wtxt.wsum",), format_verbs("wtxt", "wsum/s.wtxt")),
    Target("age", ("age/s.wtxt.age",), run_age),
    Target("manifest", (f"gen/snapshots/{RUN}/MANIFEST",), run_generation),
    Target("ledger", (f"gen/ledger/{RUN}.ledger",), run_generation),
    Target("gen-shard", (f"gen/snapshots/{RUN}/shards/0000.wtxt",), run_generation),
    Target("gen-shard-aero", (f"gen-aero/snapshots/{RUN}/shards/0000.aero",),
           generation_verbs("gen-aero")),
    Target("residual", ("residual/r.snrs",), run_residual),
    Target("spool", ("daemon/gen-000001.spool",), run_spool),
    Target("wal", ("daemon/wal.log",), run_wal),
    Target("config", ("config/snapops.toml",), run_config),
    Target("daemon-status", ("status/state/status.json",), run_daemon_status),
    Target("lfs-pointer", ("lfs/pointer",), run_lfs_pointer),
    Target("lfsconfig", ("lfs/lfsconfig",), run_lfsconfig),
    Target("retention", ("lfs/run1.retention",), run_retention),
    Target("key-file", ("keys/hmac.key", "keys/signing.key", "keys/signing.pub",
                        "keys/age.key"), run_key_file),
    Target("part", ("parts/PART",), run_part),
    Target("loose-object", ("loose/object",), run_loose_object),
    Target("pre-receive", ("hook/stdin",), run_hook_input("pre-receive", ())),
    Target("pre-push", ("hook/push-stdin",), run_hook_input("pre-push", ("origin", "/x.git"))),
    Target("review-manifest", (f"gen/snapshots/{RUN}/MANIFEST",), review_manifests),
    Target("cli-verify", _FMT, cli_verify),
    Target("cli-inspect", _FMT, cli_inspect),
    Target("cli-convert", _FMT, cli_convert),
    Target("cli-textconv", _FMT, cli_textconv),
    Target("cli-diff", _FMT, cli_diff),
    Target("cli-delta-apply", ("delta/d.wtxtdelta", "delta/base.wtxt"), cli_delta_apply),
    Target("cli-decrypt", ("age/s.wtxt.age",), cli_decrypt),
    *(Target(f"write-{name}", ("npz/s.npz",), writer_round_trip(name))
      for name in ("wtxt", "aero", "fold", "pycauset", "finf", "npz", "safetensors", "pt")),
]}
@dataclass(frozen=True)
class HarnessCanary(Target):
    """Its mutator fails for case 1, before the case runs (as a deep JSON document once made
    ``json_value`` raise RecursionError): reported as a ``harness`` finding, the rest run."""

    def case_bytes(self, original: bytes, seed: int, index: int) -> bytes:
        if index == 1:
            raise RecursionError("canary")
        return super().case_bytes(original, seed, index)


CANARIES = {t.name: t for t in [
    Target("canary-error", ("npz/s.npz",), canary_error),
    Target("canary-crash", ("npz/s.npz",), canary_crash),
    Target("canary-hang", ("npz/s.npz",), canary_hang, timeout=1),
    HarnessCanary("canary-harness", ("npz/s.npz",), lambda case: None),
    Target("canary-memory", ("npz/s.npz",), canary_memory),
]}
ALL_TARGETS = {**TARGETS, **CANARIES}
