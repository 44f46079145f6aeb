"""snapops keys generate: signing, HMAC and age keys for a snapshot pipeline."""

from __future__ import annotations

from snapops.formats.keys import generate_keys, keyid, load_public_key

from ._common import add_command, add_group
from ._paths import check_output_folder


def run_generate(args) -> int:
    check_output_folder(args.dir, what="keys")
    written = generate_keys(args.dir, overwrite=args.force)
    kid = keyid(load_public_key(written["signing.pub"]))
    for name, path in written.items():
        secret = name.endswith(".key")
        print(f"{path}{'  (secret, mode 0600)' if secret else ''}")
    print(f"signing keyid: {kid}")
    return 0


def register(sub) -> None:
    p = add_group(sub, "keys", help="manage key files", description="Manage key files.",
                  example="snapops keys generate keys/")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION")
    g = add_command(
        ksub, "generate", help="write a fresh set of keys into DIR",
        description="Write signing.key (Ed25519 PKCS#8 PEM), signing.pub, hmac.key (64 hex), "
                    "age.key (age identity) and age.pub (age recipient). Secret files get mode "
                    "0600 and are never printed.",
        example="snapops keys generate ~/.config/snapops/keys", func=run_generate)
    g.add_argument("dir", help="folder for the key files (created if missing)")
    g.add_argument("--force", action="store_true", help="overwrite existing key files")
