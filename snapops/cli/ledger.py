"""snapops ledger append/verify/show: the merkle-chained, append-only generation ledger."""

from __future__ import annotations

import json
import os
import sys

from snapops.formats.ledger import Ledger

from ._common import EXIT_INPUT, EXIT_OK, EXIT_VERIFY_FAILED, add_command


def entry_root(ledger: str, root: str | None) -> str:
    """``--root`` when given, else the top level of the Git work tree holding ``ledger`` (entry
    paths are relative to it: ``snapshots/<run>/...``), else the ledger's folder."""
    if root is not None:
        return root
    from snapops.formats.gitcmd import run_git

    folder = os.path.dirname(os.path.abspath(ledger))
    if os.path.isdir(folder):
        result = run_git(["rev-parse", "--show-toplevel"], cwd=folder, check=False)
        if result.ok and result.text:
            return result.text
    return folder


def run_append(args) -> int:
    ledger = Ledger(args.ledger, root=entry_root(args.ledger, args.root))
    if not args.header_only:
        from snapops import verify

        report = verify(args.snapshot)
        if not report.ok:
            print(f"{report.summary()}\nnot appended: the ledger vouches only for snapshots "
                  "that verify", file=sys.stderr)
            return EXIT_VERIFY_FAILED
    rec = ledger.append_snapshot(args.snapshot)
    e = rec.entry
    print(f"appended line {rec.line_no}: gen={e.gen_text} path={e.path} "
          f"merkle_this={e.merkle_this} chain={rec.chain}")
    return EXIT_OK


def run_verify(args) -> int:
    report = Ledger(args.ledger, root=entry_root(args.ledger, args.root)).verify(
        check_files=not args.no_files, allow_missing=args.allow_missing,
        contiguous=args.contiguous, head=args.head)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    return EXIT_OK if report.ok else EXIT_VERIFY_FAILED


_COLUMNS = ("LINE", "GEN", "TS", "FORMAT", "KEYID", "MERKLE_THIS", "PATH")


def run_show(args) -> int:
    lines = Ledger(args.ledger).lines()
    if args.json:
        rows = [rec.entry.to_dict() | {"line": rec.line_no, "chain": rec.chain} for rec in lines]
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    print("{:>5}  {:<8} {:<20}  {:<6}  {:<16}  {:<16}  {}".format(*_COLUMNS))
    for rec in lines:  # streamed: a bad line stops the table with a typed error (exit 2)
        e = rec.entry
        print(f"{rec.line_no:>5}  {e.gen_text:<8} {e.ts:<20}  {e.format:<6}  "
              f"{e.keyid or '-':<16}  {e.merkle_this[:16]:<16}  {e.path}")
    return EXIT_OK


def register(sub) -> None:
    p = add_command(
        sub, "ledger", help="append to, verify or show a snapshot ledger",
        description="The ledger holds one merkle-chained line per generation "
                    "(gen, ts, sha256_all, merkle_prev, merkle_this, path, format, keyid, build, "
                    "chain). Paths are relative to --root (default: the top level of the Git work tree holding the ledger).",
        example="snapops ledger verify ledger/run1.ledger", func=None)

    def run_help(args) -> int:
        p.print_help(sys.stderr)
        return EXIT_INPUT

    p.set_defaults(func=run_help)
    lsub = p.add_subparsers(dest="ledger_command", metavar="ACTION")

    a = add_command(
        lsub, "append", help="append a WTXT snapshot's entry (refused if it does not chain)",
        description="Verify the snapshot (every check `snapops verify` makes; exit 1 and "
                    "nothing appended when it fails), then append the entry read from its "
                    "header (or the WSUM beside a streaming file). Refused when its gen is not "
                    "greater than the last one or its merkle_prev is not the last entry's "
                    "merkle_this.",
        example="snapops ledger append ledger/run1.ledger snapshots/run1/s.wtxt",
        func=run_append)
    a.add_argument("ledger", metavar="LEDGER")
    a.add_argument("snapshot", metavar="SNAPSHOT")
    a.add_argument("--root", help="folder entry paths are relative to (default: the top level of the Git work tree holding LEDGER, else LEDGER's folder)")
    a.add_argument("--header-only", action="store_true",
                   help="append from the header without verifying the snapshot's data first")

    v = add_command(
        lsub, "verify", help="check the chain and the snapshot files (exit 1 on failure)",
        description="Detect gaps (deleted lines), reorders, edited lines, entries whose "
                    "merkle_prev is not the previous merkle_this, merkle_this values that do not "
                    "re-derive, and snapshot files that are missing or whose header differs from "
                    "their entry. Every problem names its line.",
        example="snapops ledger verify ledger/run1.ledger --root . --allow-missing --json",
        func=run_verify)
    v.add_argument("ledger", metavar="LEDGER")
    v.add_argument("--root", help="folder entry paths are relative to (default: the top level of the Git work tree holding LEDGER, else LEDGER's folder)")
    v.add_argument("--allow-missing", action="store_true",
                   help="note missing snapshot files (pruned by retention) instead of failing")
    v.add_argument("--no-files", action="store_true", help="check the ledger text only")
    v.add_argument("--contiguous", action="store_true",
                   help="also require gen n+1 right after gen n")
    v.add_argument("--head", metavar="HEX", help="chain value the last line must carry")
    v.add_argument("--json", action="store_true", help="print the report as JSON")

    s = add_command(
        lsub, "show", help="print the ledger as a table (or --json)",
        description="List the entries; parsing only (use verify to check them).",
        example="snapops ledger show ledger/run1.ledger --json", func=run_show)
    s.add_argument("ledger", metavar="LEDGER")
    s.add_argument("--json", action="store_true", help="print the entries as JSON")
