"""snapops demo: the main job, end to end, on this machine."""

from __future__ import annotations

from pathlib import Path

from ._common import add_command


def run(args) -> int:
    from snapops.demo import run_demo

    seconds = args.seconds if args.seconds is not None else (6.0 if args.quick else 120.0)
    print(f"demo: {'quick' if args.quick else 'full'} run, about {seconds:.0f} s of training, "
          f"format {args.format}, workdir {args.workdir}")
    return run_demo(Path(args.workdir).resolve(), quick=args.quick, seconds=seconds,
                    fmt=args.format)


def register(sub) -> None:
    p = add_command(
        sub, "demo", help="run the end-to-end demo (GPT training + daemon + guarded git remote)",
        description="Train a GPT-style transformer (~32 M parameters, f32 weights and bf16 "
                    "embeddings, AdamW) on CPU for about two minutes beside a real snapops "
                    "daemon. Training alternates phases without and with snapshot requests; the "
                    "daemon serializes, seals (HMAC + Ed25519), commits and pushes every "
                    "generation through a pre-receive hook that requires signatures, to a bare "
                    "remote served by `git daemon` on 127.0.0.1. Then the remote is cloned, "
                    "every generation verified, the newest restored from the remote into a "
                    "fresh model and compared tensor by tensor, the last two generations "
                    "reviewed into WORKDIR/review/ (Markdown + PNG), and the numbers written "
                    "to WORKDIR/summary.md. "
                    "Exit 0 only if everything held.",
        example="snapops demo --workdir demo-work      # ~6 minutes; --quick: ~30 s", func=run)
    p.add_argument("--workdir", default="demo-work", help="folder for keys, repo and remote")
    p.add_argument("--quick", action="store_true",
                   help="a tiny model for a few seconds (what the tests run)")
    p.add_argument("--seconds", type=float, default=None,
                   help="training time (default 120, or 6 with --quick)")
    p.add_argument("--format", default="wtxt", help="shard format (default wtxt)")
