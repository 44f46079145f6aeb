"""snapops finf explode/implode: FINF's exploded form (a tree file plus one file per block)."""

from __future__ import annotations

import glob
import json
import os
import sys

from ._common import EXIT_INPUT, EXIT_OK, add_command, report_error


def run_explode(args) -> int:
    from snapops.formats.finf import explode

    result = explode(args.file, args.dir)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"wrote {result['tree']} and {len(result['blocks'])} block file(s)")
        if result["unreferenced_blocks_dropped"]:
            print(f"note: {result['unreferenced_blocks_dropped']} block(s) referenced by no "
                  "array were not written", file=sys.stderr)
    return EXIT_OK


def run_implode(args) -> int:
    from snapops.formats.finf import implode

    if os.path.isdir(args.tree_file):       # the folder explode wrote, not its tree file
        trees = sorted(glob.glob(os.path.join(glob.escape(args.tree_file), "*.finf")), key=len)
        report_error(f"{args.tree_file} is a folder: give the tree file inside it (DIR/FILE, "
                     f"e.g. {trees[0] if trees else os.path.join(args.tree_file, 'model.finf')})"
                     " and OUT")
        return EXIT_INPUT
    result = implode(args.tree_file, args.out)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"wrote {result['path']}: {result['blocks']} block(s), "
              f"{result['file_bytes']} bytes")
    return EXIT_OK


def register(sub) -> None:
    p = add_command(
        sub, "finf", help="FINF exploded form: explode a file, implode it back",
        description="FINF 0.1.0 files can be kept exploded: the tree file (pure YAML, "
                    "editable by hand) plus one single-block FINF file per block, referenced "
                    "by relative URIs. A URI that leaves the tree file's folder is refused.",
        example="snapops finf explode model.finf parts/", func=None)

    def run_help(args) -> int:
        p.print_help(sys.stderr)
        return EXIT_INPUT

    p.set_defaults(func=run_help)
    fsub = p.add_subparsers(dest="finf_command", metavar="ACTION")
    e = add_command(
        fsub, "explode", help="write FILE as DIR/FILE plus DIR/<stem>NNNN.finf per block",
        description="Each block file holds the header line and one block exactly as stored "
                    "(encoding and checksum kept, no unused space); the tree file's sources "
                    "become their names.",
        example="snapops finf explode model.finf parts/", func=run_explode)
    e.add_argument("file", metavar="FILE")
    e.add_argument("dir", metavar="DIR")
    e.add_argument("--json", action="store_true", help="print the files written as JSON")
    i = add_command(
        fsub, "implode", help="gather DIR/FILE and its block files into OUT",
        description="Every relative URI becomes a local block again (stored bytes copied "
                    "as they are); OUT is written atomically. For a file snapops wrote with "
                    "default options, explode then implode gives the same bytes.",
        example="snapops finf implode parts/model.finf model.finf", func=run_implode)
    i.add_argument("tree_file", metavar="DIR/FILE")
    i.add_argument("out", metavar="OUT")
    i.add_argument("--json", action="store_true", help="print a summary as JSON")
