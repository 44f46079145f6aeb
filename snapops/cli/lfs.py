"""snapops lfs prune: retention for an LFS-store run (keep the last K, every Nth, milestones);
snapops lfs restore: an alias of snapops restore."""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

from snapops.formats.errors import ConfigError, GitError
from snapops.formats.gitcmd import ref_lines

from . import restore as restore_command
from ._common import EXIT_OK, add_command, add_group
from ._options import integer_in
from ._paths import check_folder


def run_manifests(git, run: str) -> dict[int, object]:
    """Every generation of ``run`` that has a tag ``<run>/gen-<gen>``, by gen."""
    from snapops.formats.generation.manifest import parse_gen_text, parse_manifest
    from snapops.formats.lfs.source import tag_manifests

    read = tag_manifests(git, run)
    out = {}
    for ref in ref_lines(git.run("for-each-ref", "--format=%(refname)", f"refs/tags/{run}/")):
        gen = parse_gen_text(ref.removeprefix(f"refs/tags/{run}/gen-"))
        if ref.startswith(f"refs/tags/{run}/gen-") and gen is not None:
            data = read(gen)
            if data is not None:
                out[gen] = parse_manifest(data, f"{ref}:snapshots/{run}/MANIFEST")
    return out


def other_runs_objects(git, run: str) -> frozenset[str]:
    """The LFS objects of every other run's tagged generations: one LFS store holds every run
    of the repository, and identical shards of two runs are one object there."""
    from snapops.formats.generation import valid_run

    tags = ref_lines(git.run("for-each-ref", "--format=%(refname)", "refs/tags/*/gen-*"))
    runs = {ref.removeprefix("refs/tags/").rpartition("/gen-")[0] for ref in tags}
    objects: set[str] = set()
    for other in sorted(r for r in runs - {run} if valid_run(r)):
        for manifest in run_manifests(git, other).values():
            objects |= {s.object for s in manifest.shards if s.object}
    return frozenset(objects)


def milestone_gens(git, run: str, patterns: list[str]) -> set[int]:
    """Gens of the commits that tags matching ``patterns`` name (their MANIFEST's gen)."""
    from snapops.formats.generation.manifest import parse_manifest

    gens = set()
    for ref in ref_lines(git.run("for-each-ref", "--format=%(refname)", "refs/tags/")):
        tag = ref.removeprefix("refs/tags/")
        if any(fnmatch.fnmatchcase(tag, p) for p in patterns):
            try:
                data = git.run("cat-file", "blob", f"{ref}^{{commit}}:snapshots/{run}/MANIFEST")
            except GitError:
                raise ConfigError(f"milestone tag {tag}: no generation of run {run} there") \
                    from None
            gens.add(parse_manifest(data, f"{tag}:snapshots/{run}/MANIFEST").header.gen)
    return gens


def run_prune(args) -> int:
    from snapops.formats.atomic import atomic_write_bytes
    from snapops.formats.generation import valid_run
    from snapops.formats.iosafe import refuse_symlinked
    from snapops.formats.lfs.access import read_record
    from snapops.formats.lfs.retention import (
        LocalStoragePruner,
        Policy,
        RetentionRecord,
        apply_retention,
        plan_retention,
        record_path,
    )
    from snapops.hooks.gitio import Git

    if not valid_run(args.run):
        raise ConfigError(f"--run {args.run!r}: not a run name")
    check_folder(args.repo)
    if not args.dry_run:
        check_folder(args.local_storage, what="LFS storage")
    git = Git(args.repo)
    manifests = run_manifests(git, args.run)
    if not manifests:
        raise ConfigError(f"{args.repo}: no generation tags {args.run}/gen-* there")
    milestones = milestone_gens(git, args.run, args.milestone_tag or [f"{args.run}/milestone-*"])
    previous = read_record(git, args.repo, args.run)
    policy = Policy(args.keep_last, args.keep_every, frozenset(milestones))
    plan = plan_retention(manifests, policy, other_runs_objects(git, args.run))
    pruned = set(plan.pruned) | (set(previous.pruned) if previous else set())
    deleted = 0
    if not args.dry_run:
        refuse_symlinked(args.repo, record_path(args.run))   # before any object is deleted
        deleted = apply_retention(plan, LocalStoragePruner(args.local_storage))
        record = RetentionRecord(policy, frozenset(pruned - plan.kept))
        target = Path(args.repo) / record_path(args.run)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, record.render())
    summary = {"policy": policy.describe(), "kept": sorted(plan.kept),
               "pruned": sorted(pruned - plan.kept), "objects_kept": len(plan.keep_objects),
               "objects_pruned": len(plan.prune_objects), "objects_deleted": deleted,
               "record": record_path(args.run), "dry_run": args.dry_run}
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"{args.run}: kept gens {summary['kept']}, pruned {summary['pruned']}; "
              f"{deleted} object(s) deleted, {len(plan.keep_objects)} kept "
              f"({'dry run' if args.dry_run else 'record ' + summary['record']})")
    return EXIT_OK


def register(sub) -> None:
    p = add_group(sub, "lfs", help="the LFS store of snapshot runs",
                  description="The LFS store of snapshot runs: retention and restore.",
                  example="snapops lfs prune snapshot-repo --run run1 --keep-last 8 "
                          "--local-storage /srv/lfs/org/weights --dry-run")
    lsub = p.add_subparsers(dest="lfs_command", metavar="ACTION")
    prune = add_command(
        lsub, "prune", help="retention: delete LFS objects of generations the policy drops",
        description="Keep the last K generations, every Nth (gen divisible by N) and "
                    "milestones (tags matching --milestone-tag, default <run>/milestone-*); "
                    "every object a kept generation needs stays, its keyframe/residual chain "
                    "included, and so does every object another run's tagged generations name "
                    "(one store holds every run). Other objects are deleted from the store "
                    "(--local-storage: a folder of one file per oid, <oid> or "
                    "<oid[0:2]>/<oid[2:4]>/<oid>: giftless's local backend's "
                    "<storage>/<org>/<repo>, git-lfs's object folder). Writes "
                    "retention/<run>.retention into REPO (commit it): verify then reports "
                    "those generations as pruned by retention.",
        example="snapops lfs prune snapshot-repo --run run1 --keep-last 8 --keep-every 50 "
                "--local-storage /srv/lfs/org/weights --json",
        func=run_prune)
    prune.add_argument("repo", metavar="REPO", help="a clone (work tree) of the snapshot repo")
    prune.add_argument("--run", required=True, help="the run whose generations are pruned")
    prune.add_argument("--keep-last", type=integer_in(1), required=True, metavar="K",
                       help="keep the K newest generations (at least 1)")
    prune.add_argument("--keep-every", type=integer_in(0), default=0, metavar="N",
                       help="also keep every generation whose number N divides (default 0: "
                            "none)")
    prune.add_argument("--milestone-tag", action="append", metavar="GLOB",
                       help="also keep generations tagged so (repeatable; default "
                            "<run>/milestone-*)")
    prune.add_argument("--local-storage", required=True, metavar="DIR",
                       help="the store's object folder the objects are deleted from "
                            "(not touched with --dry-run)")
    prune.add_argument("--dry-run", action="store_true",
                       help="show what would be kept and pruned; delete and write nothing")
    prune.add_argument("--json", action="store_true", help="print the summary as JSON")
    restore = add_command(
        lsub, "restore", help="alias of `snapops restore` (LFS-store runs restore there too)",
        description="The same command as `snapops restore` (same options, same code): kept "
                    "for scripts written when only this one restored LFS-store runs. "
                    + restore_command.DESCRIPTION,
        example="snapops lfs restore snapshot-repo --run run1 --rev run1/gen-000012 "
                "--lfs-token-file keys/lfs-read.token --out gen12.npz",
        func=restore_command.run)
    restore_command.add_arguments(restore)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
