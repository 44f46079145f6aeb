"""snapops verify: full verification of single files, of whole sealed generations, and of a
commit range as the hooks check it (CI)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

from snapops.formats.errors import ConfigError, FormatError
from snapops.formats.contract import VerifyOptions
from snapops.formats.registry import verify_any
from snapops.formats.report import Report

from ._common import (EXIT_INPUT, EXIT_OK, EXIT_VERIFY_FAILED, add_command,
                      add_key_options, check_key_files, progress_bar, step)
from ._paths import check_folder

MANIFEST_NAME = "MANIFEST"


def verify_one(path: str, args) -> Report:
    """Verify one file with the options the flags give (the same for every format; a
    signature or HMAC a format cannot carry fails closed, naming its generation)."""
    options = VerifyOptions(hmac_key=args.hmac_key, trusted_keys=tuple(args.trusted_key),
                            require_signature=args.require_signature,
                            require_hmac=args.require_hmac, wsum=args.wsum,
                            identity=args.identity)
    return verify_any(path, options)


def generation_options(args):
    from snapops.formats.generation.verify import GenerationOptions

    return GenerationOptions(trusted_keys=args.trusted_key or None, hmac_key=args.hmac_key,
                             require_signature=args.require_signature,
                             require_hmac=args.require_hmac, identity=args.identity)


@contextlib.contextmanager
def generation_source(target: str, rev: str | None):
    """A work tree (or any folder holding ``snapshots/``) as it is on disk; with ``rev`` or
    for a bare repository, that commit's tree, blobs materialised in a private scratch
    folder removed afterwards."""
    from snapops.formats.generation.source import FolderSource, GitTreeSource
    from snapops.hooks.gitio import Git

    if not os.path.isdir(target):
        raise ConfigError(f"{target}: not a folder (give a repository, a work tree, or a "
                          "path to a MANIFEST)")
    git = Git(target)
    bare = rev is None and (Path(target) / "HEAD").is_file() and git.is_bare()
    if rev is None and not bare:
        yield FolderSource(target)
        return
    commit = git.resolve(f"{rev or 'HEAD'}^{{commit}}")
    if commit is None:
        raise ConfigError(f"{target}: {rev or 'HEAD'} is not a commit there")
    with tempfile.TemporaryDirectory(prefix="snapops-verify-") as scratch:
        yield GitTreeSource(git, commit, scratch)


def around_manifest(path: str) -> tuple[str, str]:
    """(repository root, run) of ``.../snapshots/<run>/MANIFEST``."""
    manifest = Path(path)
    if manifest.parent.parent.name != "snapshots":
        raise ConfigError(f"{path}: a generation's MANIFEST lies at snapshots/<run>/MANIFEST")
    return os.fspath(manifest.parent.parent.parent), manifest.parent.name


def verify_generation_at(target: str, run: str, rev: str | None, args) -> Report:
    from snapops.formats.generation import valid_run
    from snapops.formats.generation.verify import verify_generation

    if not valid_run(run):
        raise ConfigError(f"--run {run!r}: not a run name ([A-Za-z0-9][A-Za-z0-9_.-]*)")
    with generation_source(target, rev) as source, \
            contextlib.ExitStack() as stack:
        if getattr(args, "fetch_lfs", False):
            source = lfs_source(source, target, run, args, stack)
        options = generation_options(args)
        if Path(target, ".git").exists() or Path(target, "HEAD").is_file():
            from snapops.formats.lfs.access import read_record
            from snapops.hooks.gitio import Git

            # with no --rev, the record and the MANIFEST come from the same tree
            options = dataclasses.replace(options, retention=read_record(Git(target), target,
                                                                         run),
                                          retention_of_tree=rev is None)
        report = verify_generation(source, run, options)
    report.details["source"] = source.label
    return report


def lfs_source(source, target: str, run: str, args, stack: contextlib.ExitStack):
    """``source`` with its LFS-store shards restored from the LFS server (``--lfs-url``, or
    the ``.lfsconfig`` the tree carries) through a cache folder (``--lfs-cache`` or a temp),
    the downloads counted on a progress bar when stderr is a terminal."""
    from snapops.formats.lfs.access import (
        MAX_LFSCONFIG,
        choose_endpoint,
        commit_file,
        open_client,
        read_token,
        token_for,
    )
    from snapops.formats.lfs.objects import ObjectStore
    from snapops.formats.lfs.source import LfsSource, tag_manifests
    from snapops.hooks.gitio import Git

    commit = getattr(source, "commit", None)
    lfsconfig = commit_file(source.git, commit, ".lfsconfig", MAX_LFSCONFIG) if commit else \
        _folder_lfsconfig(target, MAX_LFSCONFIG)
    url, origin = choose_endpoint(args.lfs_url, lfsconfig, None)
    if url is None:
        raise ConfigError("--fetch-lfs: give --lfs-url (the tree has no .lfsconfig url)")
    token = token_for(read_token(args.lfs_token_file, "--lfs-token-file"), url, origin,
                      Git(target).text("config", "--get", "remote.origin.url", check=False)
                      or None)
    downloaded = stack.enter_context(progress_bar("lfs objects", enabled=not args.json))
    client = open_client(url, token, origin, downloaded)
    cache = args.lfs_cache or stack.enter_context(
        tempfile.TemporaryDirectory(prefix="snapops-lfs-"))
    return LfsSource(source, run, ObjectStore(cache, client),
                     manifests=tag_manifests(Git(target), run))


def _folder_lfsconfig(target: str, limit: int) -> bytes | None:
    """The tree's ``.lfsconfig`` (at most ``limit`` bytes), None when it has no regular one."""
    from snapops.formats.iosafe import open_input

    try:
        with open_input(Path(target) / ".lfsconfig", follow=False) as f:
            return f.read(limit)
    except (OSError, FormatError):
        return None


def print_reports(reports: list[Report], as_json: bool, *, unread_is_input: bool = False) -> int:
    """Print the reports; the exit code is 1 when a check failed, 2 when (``unread_is_input``:
    the reports are of files named on the command line) one of them could not be read."""
    if as_json:
        json.dump([r.to_dict() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for report in reports:
            print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    if unread_is_input and any(unreadable(r) for r in reports):
        return EXIT_INPUT
    return EXIT_OK if all(r.ok for r in reports) else EXIT_VERIFY_FAILED


def unreadable(report: Report) -> bool:
    """The file itself could not be read (missing, a folder, a FIFO, no permission), or not
    with the keys given (an age file and no identity): an input error, not a verification
    failure."""
    return report.failure is not None and report.failure.check in ("io", "keys")


def run(args) -> int:
    check_key_files(args)
    if args.ci or args.range:
        return run_ci(args)
    if args.run:
        if len(args.files) != 1:
            return _usage("--run R takes exactly one REPO_OR_WORKTREE")
        return print_reports([verify_generation_at(args.files[0], args.run, args.rev, args)],
                             args.json)
    if args.rev:
        return _usage("--rev REV needs --run R")
    if not args.files:
        return _usage("give FILE..., REPO --run R, a MANIFEST, or --ci --range BASE..HEAD")
    reports = []
    sizes = [os.path.getsize(p) if os.path.isfile(p) else 0 for p in args.files]
    with progress_bar("verify", sum(sizes), enabled=not args.json) as progress:
        for path, size in zip(args.files, sizes):
            if Path(path).name == MANIFEST_NAME:
                root, run_name = around_manifest(path)
                reports.append(verify_generation_at(root, run_name, None, args))
            else:
                reports.append(verify_one(path, args))
            step(progress, size)
    return print_reports(reports, args.json, unread_is_input=True)


def _usage(message: str) -> int:
    print(f"snapops verify: error: {message}", file=sys.stderr)
    return EXIT_INPUT


def run_ci(args) -> int:
    """Every commit of a range as the hooks check it (whole generations, ledgers, tags)."""
    from snapops.hooks.gitio import Git
    from snapops.hooks.runner import run_range

    if not (args.ci and args.range) or args.files or args.run:
        return _usage("--ci needs --range BASE..HEAD and no FILE or --run")
    check_folder(args.repo)
    git = Git(args.repo)
    cfg = ci_config(git, args)
    with contextlib.ExitStack() as stack:
        lfs = None
        if args.fetch_lfs:
            def lfs(source, run):
                return lfs_source(source, args.repo, run, args, stack)
        return run_range(git, args.range, sys.stderr, cfg=cfg, as_json=args.json, lfs=lfs)


def ci_config(git, args):
    """The repository's hook settings (git config snapops.*) tightened by the key flags."""
    from snapops.hooks.repo_config import load_repo_config

    return load_repo_config(git).overridden(
        trusted_keys=args.trusted_key, require_signature=args.require_signature,
        hmac_key=args.hmac_key, require_hmac=args.require_hmac)


def register(sub) -> None:
    p = add_command(
        sub, "verify", help="verify snapshot files or whole generations (exit 1 on failure)",
        description="FILE...: check every hash, CRC, parity nibble, MAC and signature a file "
                    "carries (binary formats carry no signature or HMAC: requiring one fails; "
                    "verify their generation). REPO --run R [--rev REV], or a path to "
                    "snapshots/R/MANIFEST: verify the sealed generation as a whole (MANIFEST "
                    "seal, exact file set, every shard against its declared format and digest, "
                    "the ledger's last line); a work tree as it is on disk, a bare repository "
                    "or --rev from that commit. --ci --range BASE..HEAD: every commit as the "
                    "hooks check it. The first failure is named by file, line and check.",
        example="snapops verify . --run run1 --trusted-key keys/ --hmac-key keys/hmac.key "
                "--require-signature --require-hmac --json",
        func=run)
    p.add_argument("files", nargs="*", metavar="FILE_OR_REPO")
    p.add_argument("--run", help="verify the generation of this run in REPO")
    p.add_argument("--rev", help="with --run: the generation in this commit (default: the "
                                 "work tree; HEAD in a bare repository)")
    add_key_options(p)
    p.add_argument("--wsum", help="WSUM file for a streaming snapshot (default: FILE.wsum)")
    p.add_argument("--identity", help="age identity file: decrypt age-armored files on the fly")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("--fetch-lfs", action="store_true",
                   help="with --run or --ci, for LFS-store generations: download their objects "
                        "and verify the reconstructed shards (default: pointers only)")
    p.add_argument("--lfs-url", help="LFS endpoint for --fetch-lfs (default: the tree's "
                                     ".lfsconfig)")
    p.add_argument("--lfs-token-file", help="bearer token file for --fetch-lfs")
    p.add_argument("--lfs-cache", help="object cache folder for --fetch-lfs (default: a temp "
                                       "folder removed afterwards)")
    p.add_argument("--ci", action="store_true",
                   help="verify a commit range instead of files (with --range), as the hooks do")
    p.add_argument("--range", metavar="BASE..HEAD",
                   help="commits to verify with --ci (BASE all zeros or absent: whole history)")
    p.add_argument("--repo", default=".", help="repository for --ci (default: .)")
