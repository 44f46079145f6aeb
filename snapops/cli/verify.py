"""snapops verify: full verification of any supported file."""

from __future__ import annotations

import json
import sys

from snapops.formats.contract import VerifyOptions
from snapops.formats.registry import verify_any
from snapops.formats.report import Report

from ._common import EXIT_INPUT, EXIT_OK, EXIT_VERIFY_FAILED, add_command


def verify_one(path: str, args) -> Report:
    """Verify one file with the options the flags give (the same for every format)."""
    options = VerifyOptions(hmac_key=args.hmac_key, trusted_keys=tuple(args.trusted_key),
                            require_signature=args.require_signature,
                            require_hmac=args.require_hmac, wsum=args.wsum,
                            identity=args.identity)
    return verify_any(path, options)


def run(args) -> int:
    if args.ci or args.range:
        return run_ci(args)
    if not args.files:
        print("snapops verify: error: give FILE... (or --ci --range BASE..HEAD)",
              file=sys.stderr)
        return EXIT_INPUT
    reports = [verify_one(path, args) for path in args.files]
    if args.json:
        json.dump([r.to_dict() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for report in reports:
            stream = sys.stdout if report.ok else sys.stderr
            print(report.summary(), file=stream)
    return EXIT_OK if all(r.ok for r in reports) else EXIT_VERIFY_FAILED


def run_ci(args) -> int:
    """Every snapshot file and ledger changed in a commit range (the pre-push checks)."""
    from snapops.hooks.gitio import Git
    from snapops.hooks.repo_config import load_repo_config
    from snapops.hooks.runner import run_range

    if not (args.ci and args.range) or args.files:
        print("snapops verify: error: --ci needs --range BASE..HEAD and no FILE",
              file=sys.stderr)
        return EXIT_INPUT
    git = Git(args.repo)
    cfg = load_repo_config(git).overridden(
        trusted_keys=args.trusted_key, require_signature=args.require_signature,
        hmac_key=args.hmac_key, require_hmac=args.require_hmac)
    return run_range(git, args.range, sys.stderr, cfg=cfg, as_json=args.json)


def register(sub) -> None:
    p = add_command(
        sub, "verify", help="verify snapshot files (exit 1 if any check fails)",
        description="Check every hash, CRC, parity nibble, MAC and signature a file carries "
                    "(any format; age-armored files with --identity). The first failure is "
                    "named by line, array, chunk and check. Unauthenticated arrays and a "
                    "missing signature are reported as notes; they fail only with "
                    "--require-hmac / --require-signature, which also fail for formats that "
                    "cannot carry them (their generation's MANIFEST is what is sealed).",
        example="snapops verify snapshots/*.wtxt --hmac-key keys/hmac.key "
                "--trusted-key keys/ --require-signature --json",
        func=run)
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--hmac-key", help="HMAC key file: check every array's HMAC")
    p.add_argument("--trusted-key", action="append", default=[],
                   help="trusted Ed25519 public key (PEM file, or a folder of *.pub); repeatable")
    p.add_argument("--require-signature", action="store_true",
                   help="fail unless signed by a trusted key")
    p.add_argument("--require-hmac", action="store_true",
                   help="fail unless every array is authenticated with --hmac-key")
    p.add_argument("--wsum", help="WSUM file for a streaming snapshot (default: FILE.wsum)")
    p.add_argument("--identity", help="age identity file: decrypt age-armored files on the fly")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("--ci", action="store_true",
                   help="verify a commit range instead of files (with --range), as pre-push does")
    p.add_argument("--range", metavar="BASE..HEAD",
                   help="commits to verify with --ci (BASE all zeros or absent: whole history)")
    p.add_argument("--repo", default=".", help="repository for --ci (default: .)")
