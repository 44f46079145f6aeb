"""The fuzzer's two halves: a worker process that runs cases in a loop under a memory limit
(RLIMIT_AS) and a per-case alarm, and the parent that feeds it batches, restarts it when a
case kills it, and saves every finding's input.

The worker is a fork server: it imports everything once (numpy, torch, every module of
snapops), builds the seeds if they are missing, then forks one child per batch line
``TARGET START COUNT`` read on stdin. The child answers ``B i`` before case ``i`` and
``R i ok|typed`` or ``F {json}`` after it; when it dies (a signal, SIGALRM for a timeout,
an exit) the server says ``DIED CODE``, the last ``B`` names the case, and the parent
rebuilds its input from (seed, target, index), which is all a case is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .targets import ALL_TARGETS, TARGETS, Case

REPO = Path(__file__).resolve().parents[2]
WATCHDOG = 60.0          # seconds without a word from a worker before it is killed


@dataclass
class TargetStats:
    cases: int = 0
    ok: int = 0
    typed: int = 0
    findings: dict = field(default_factory=dict)      # key -> first finding


@dataclass
class Campaign:
    seed: int
    out: Path
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def cases(self) -> int:
        return sum(s.cases for s in self.stats.values())

    def findings(self) -> list[dict]:
        return [f for s in self.stats.values() for f in s.findings.values()]

    def summary(self) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        lines = [f"{self.cases} cases in {self.seconds:.1f} s ({rate:.1f} cases/s), seed "
                 f"{self.seed}, {len(self.findings())} findings"]
        for name, s in self.stats.items():
            lines.append(f"  {name:16} {s.cases:7} cases {s.ok:7} ok {s.typed:7} typed "
                         f"{len(s.findings):3} findings")
        for f in self.findings():
            lines.append(f"  FINDING {f['target']} case {f['index']}: {f['kind']} at "
                         f"{f['where']}: {f['message'][:160]} -> {f.get('input')}")
        return "\n".join(lines)


# --- worker --------------------------------------------------------------------------------

def _import_everything() -> None:
    """Import every module cases may use once, in the server: each forked batch starts warm,
    and a long run keeps testing the code it started with while files are edited."""
    import importlib
    import pkgutil

    import torch  # noqa: F401  (the .pt reader imports it lazily)

    import snapops.cli
    import snapops.formats
    import snapops.hooks
    from snapops.formats.registry import all_handlers

    for package in (snapops.formats, snapops.hooks, snapops.cli):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)

    all_handlers()
    snapops.cli.build_parser()


def _cap_memory(memory: int) -> None:
    """Cap the address space ``memory`` bytes above what is mapped now (the imports)."""
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + memory, used + memory))


def _where(exc: BaseException) -> str:
    """The innermost frame in the repository (not in tests/fuzz): what makes two findings
    the same bug."""
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if f.filename.startswith(str(REPO))
              and "/tests/fuzz/" not in f.filename]
    frame = (inside or frames or [None])[-1]
    if frame is None:
        return "?"
    return f"{os.path.relpath(frame.filename, REPO)}:{frame.lineno}"


def worker_main(seeds: str, seed: int, timeout: int, memory: int, work: str) -> None:
    """The fork server: imports once, then forks one child per batch line; a child that
    dies (signal, alarm) is reported as ``DIED CODE`` and the next batch gets a fresh one.
    ``work`` is its scratch folder, made and removed by the parent (which may kill it)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    pristine = Path(seeds)
    _import_everything()
    if not pristine.exists():
        from .seeds import build

        build(pristine)
    root, out = Path(work) / "seeds", Path(work) / "out"
    shutil.copytree(pristine, root)
    out.mkdir()
    print("READY", file=proto)
    for line in sys.stdin:
        name, start, count = line.split()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _cap_memory(memory)
                _run_cases(proto, ALL_TARGETS[name], name, int(start), int(count), seed,
                           timeout, pristine, root, out)
                proto.flush()
            except BaseException as exc:  # noqa: BLE001  (the harness itself failed)
                code = 3
                with contextlib.suppress(BaseException):
                    print("X " + json.dumps({"message": f"{type(exc).__name__}: {exc}"[:500],
                          "traceback": "".join(traceback.format_exception(exc))[-4000:]}),
                          file=proto)
            os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code:
            shutil.copytree(pristine, root, dirs_exist_ok=True)    # undo the dead case
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            print(f"DIED {code}", file=proto)
        else:
            print("DONE", file=proto)


def _run_cases(proto, target, name: str, start: int, count: int, seed: int, timeout: int,
               pristine: Path, root: Path, out: Path) -> None:
    for index in range(start, start + count):
        rel = target.file_for(index)
        original = (pristine / rel).read_bytes()
        data = target.case_bytes(original, seed, index)
        path = root / rel
        path.write_bytes(data)
        case = Case(root=root, pristine=pristine, out=out, path=path, index=index)
        print(f"B {index}", file=proto)
        signal.alarm(target.timeout or timeout)   # default action: the child dies
        try:
            target.run(case)
            result = f"R {index} {'typed' if case.typed else 'ok'}"
        except Exception as exc:  # noqa: BLE001  (any escape is the finding)
            result = "F " + json.dumps({
                "index": index, "kind": type(exc).__name__, "where": _where(exc),
                "message": str(exc)[:500], "file": rel,
                "traceback": "".join(traceback.format_exception(exc))[-4000:]})
        finally:
            signal.alarm(0)
        path.write_bytes(original)
        for leftover in out.iterdir():
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink()
        print(result, file=proto)


# --- parent --------------------------------------------------------------------------------

class Worker:
    def __init__(self, seeds: Path, seed: int, timeout: int, memory: int) -> None:
        env = dict(os.environ, SNAPOPS_DEBUG="1", MALLOC_ARENA_MAX="2", PYTHONHASHSEED="0",
                   OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        self.work = Path(tempfile.mkdtemp(prefix="snapops-fuzz-"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.engine", str(seeds), str(seed), str(timeout),
             str(memory), str(self.work)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=REPO, env=env, start_new_session=True)
        self.buffer = ""
        line = self.readline(WATCHDOG * 3)
        if line != "READY":
            self.kill()
            raise RuntimeError(f"fuzz worker did not start: {line!r}")

    def readline(self, timeout: float) -> str | None:
        """The next line, or None when the worker died or said nothing for ``timeout``."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while "\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split("\n", 1)
        return line

    def send(self, name: str, start: int, count: int) -> None:
        self.proc.stdin.write(f"{name} {start} {count}\n")
        self.proc.stdin.flush()

    def kill(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)   # the server and its batch child
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if not pipe.closed:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass
        shutil.rmtree(self.work, ignore_errors=True)
        return self.proc.returncode

    def close(self) -> None:
        self.kill()


def save_input(campaign: Campaign, seeds: Path, finding: dict) -> None:
    """Write the finding's input (rebuilt from seed, target and index) and its report."""
    name, index = finding["target"], finding["index"]
    target = ALL_TARGETS[name]
    rel = target.file_for(index)
    try:
        data = target.case_bytes((seeds / rel).read_bytes(), campaign.seed, index)
    except Exception:  # noqa: BLE001  (the mutator itself failed: a harness finding)
        data = None
    key = hashlib.sha256(f"{finding['kind']}@{finding['where']}".encode()).hexdigest()[:10]
    folder = campaign.out / name
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{key}-{index}-{Path(rel).name}"
    if data is not None:
        stem.write_bytes(data)
    finding["input"] = str(stem) if data is not None else None
    finding["replay"] = (f"python -m tests.fuzz --replay {name} {index} --seed "
                         f"{campaign.seed}")
    Path(f"{stem}.json").write_text(json.dumps(finding, indent=1))


def run_campaign(*, seed: int = 0, out: Path, targets: list[str] | None = None,
                 cases_per_target: int | None = None, minutes: float | None = None,
                 batch: int = 25, timeout: int = 10, memory: int = 1 << 30,
                 seeds: Path | None = None, progress=None) -> Campaign:
    """Run every target (round robin, ``batch`` cases at a time) until each has run
    ``cases_per_target`` cases or ``minutes`` have passed."""
    names = targets or list(TARGETS)
    campaign = Campaign(seed=seed, out=Path(out))
    campaign.stats = {n: TargetStats() for n in names}
    owned = seeds is None
    seeds = Path(tempfile.mkdtemp(prefix="snapops-fuzz-seeds-")) / "s" if owned else seeds
    start = time.monotonic()
    worker = Worker(seeds, seed, timeout, memory)       # builds the seeds when missing
    deadline = time.monotonic() + minutes * 60 if minutes else None
    try:
        while True:
            pending = [n for n in names if cases_per_target is None
                       or campaign.stats[n].cases < cases_per_target]
            if not pending or (deadline and time.monotonic() > deadline):
                break
            for name in pending:
                stats = campaign.stats[name]
                count = batch if cases_per_target is None else min(
                    batch, cases_per_target - stats.cases)
                worker = _run_batch(worker, campaign, seeds, name, stats.cases, count,
                                    timeout, memory)
                if progress:
                    progress(campaign, time.monotonic() - start)
                if deadline and time.monotonic() > deadline:
                    break
    finally:
        worker.close()
        campaign.seconds = time.monotonic() - start
        if owned:
            shutil.rmtree(seeds.parent, ignore_errors=True)
    return campaign


def _run_batch(worker: Worker, campaign: Campaign, seeds: Path, name: str, start: int,
               count: int, timeout: int, memory: int) -> Worker:
    """Run cases start..start+count-1; a case that kills its child is a finding and the
    rest of the batch goes on (a new child; a new server only if the server went silent)."""
    stats = campaign.stats[name]
    stop = start + count
    while start < stop:
        worker.send(name, start, stop - start)
        current, died, harness = None, None, None     # current: a case begun, not finished
        after = start                                 # the first case not finished
        while True:
            line = worker.readline(max(WATCHDOG, timeout * 3))
            if line is None:                   # the server is silent or gone: restart it
                died = "watchdog"
                worker.kill()
                worker = Worker(seeds, campaign.seed, timeout, memory)
                break
            if line == "DONE":
                return worker
            kind, _, rest = line.partition(" ")
            if kind == "DIED":
                code = int(rest)
                died = ("timeout" if code == -signal.SIGALRM else
                        f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}")
                break
            if kind == "X":
                harness = json.loads(rest)
            elif kind == "B":
                current = int(rest)
            elif kind == "R":
                index, _, verdict = rest.partition(" ")
                stats.cases += 1
                stats.typed += verdict == "typed"
                stats.ok += verdict != "typed"
                current, after = None, int(index) + 1
            elif kind == "F":
                finding = json.loads(rest)
                stats.cases += 1
                _record(campaign, seeds, name, finding)
                current, after = None, finding["index"] + 1
        if current is None:     # the harness failed between cases: report it, skip that one
            current = after
            _record(campaign, seeds, name, {
                "index": current, "kind": "harness", "where": "harness", "file": None,
                **(harness or {"message": f"the worker failed before the case ({died})"})})
        else:
            _record(campaign, seeds, name, {"index": current, "kind": died, "where": died,
                                            "message": f"the case's process ended: {died}",
                                            "file": None})
        stats.cases += 1
        start = current + 1
    return worker


def _record(campaign: Campaign, seeds: Path, name: str, finding: dict) -> None:
    finding["target"] = name
    key = f"{finding['kind']}@{finding['where']}"
    stats = campaign.stats[name]
    if key not in stats.findings:
        save_input(campaign, seeds, finding)
        stats.findings[key] = finding


def replay(name: str, index: int, seed: int) -> None:
    """Run one case in this process (the traceback shows)."""
    target = ALL_TARGETS[name]
    from .seeds import build

    seeds = Path(tempfile.mkdtemp(prefix="snapops-fuzz-replay-"))
    build(seeds / "s")
    root, out = seeds / "work", seeds / "out"
    shutil.copytree(seeds / "s", root)
    out.mkdir()
    rel = target.file_for(index)
    path = root / rel
    path.write_bytes(target.case_bytes(path.read_bytes(), seed, index))
    os.environ["SNAPOPS_DEBUG"] = "1"
    print(f"replaying {name} case {index} (seed {seed}) on {path}", file=sys.stderr)
    target.run(Case(root=root, pristine=seeds / "s", out=out, path=path, index=index))
    print("no finding", file=sys.stderr)


if __name__ == "__main__":
    worker_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
