"""snapops demo: the main job, end to end, on this machine."""

from __future__ import annotations

from pathlib import Path

from ._common import add_command


def run(args) -> int:
    from snapops.demo import run_demo

    use_torch = False
    if not args.numpy:
        try:
            import torch  # noqa: F401

            use_torch = True
        except ImportError:
            use_torch = False
    print(f"demo: {'torch' if use_torch else 'numpy'} training, {args.steps} steps, snapshot "
          f"every {args.every}, format {args.format}, workdir {args.workdir}")
    return run_demo(Path(args.workdir).resolve(), args.steps, args.every, args.format, use_torch)


def register(sub) -> None:
    p = add_command(
        sub, "demo", help="run the end-to-end demo (training loop + daemon + git remote)",
        description="Start a snapops daemon, run a small training loop (torch when installed, "
                    "else numpy) that requests a snapshot every few steps, let the daemon "
                    "serialize, seal (HMAC + Ed25519), commit and push them to the bare remote "
                    "WORKDIR/remote.git, then clone the remote and verify every generation. "
                    "Exit 0 only if all verified.",
        example="snapops demo --workdir demo-work --steps 60", func=run)
    p.add_argument("--workdir", default="demo-work", help="folder for keys, repo and remote")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--every", type=int, default=10, help="snapshot every N steps (default 10)")
    p.add_argument("--format", default="wtxt", help="snapshot format (default wtxt)")
    p.add_argument("--numpy", action="store_true", help="numpy training even if torch exists")
