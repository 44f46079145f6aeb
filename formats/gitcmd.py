"""The one way snapops runs ``git``: the daemon, the hooks and review all call it.

Every call runs the real ``git`` with the caller's environment plus :data:`GIT_ENV` (never a
password prompt), in a process group of its own, so that whatever git starts (``pack-objects``,
``index-pack``, ``ssh``, a remote helper, a local ``receive-pack``) is ended with it (leaves
first, so each parent fails and cleans up as on any error; SIGKILL after a grace time):

* on a wall-clock ``timeout``, on a ``stall`` (no output and no bytes moved by the group: see
  :mod:`snapops.formats.gitwatch`), on a ``cancel``, on any error in the caller, and when a
  streamed blob is closed early;
* when the disk it writes to runs low (``keep_free``, :mod:`snapops.formats.gitwatch`);
* when the owning process dies, even by SIGKILL, once :data:`children` was started: a small
  guard process holds the live groups (and their output pipes) and ends them when its channel
  from the owner closes (the daemon starts it; short-lived hooks and CLI calls do not need it).

Failures raise :class:`GitError` (or the ``error`` subclass given, e.g. ``PushError``) reading
``WHERE: git WHAT failed: SUMMARY``, where SUMMARY is the last lines git printed (or how it
ended), with the ``redact`` replacements applied so no URL secret reaches a log.

Example::

    run_git(["rev-parse", "--is-inside-work-tree"], cwd="/srv/repo").text
    # -> 'true'
    run_git(["push", "--progress", url, "main"], cwd=repo, stall=60, error=PushError,
            on_line=print, redact={url: shown})
    # -> Writing objects:  37% (12/32), 1.50 MiB | 1.49 MiB/s
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, BinaryIO, Callable, Iterator, Mapping, NamedTuple, Sequence

from . import procgroup
from .errors import GitError, LimitError
from .gitwatch import DISK_POLL, DiskFloor, DiskLow, Silence
from .procgroup import end_group, signal_group

__all__ = ["GIT_ENV", "LOCATING", "MAX_LISTED_PATHS", "GitExit", "GitResult", "children",
           "forget_hook_environment", "git_environment", "invocations", "open_git", "run_as_hook",
           "run_git", "run_listing", "summarize", "TreeRecord", "tree_records"]

log = logging.getLogger(__name__)

# Never wait for a password on a terminal or in a credential-manager dialog.
GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never"}
# git exports these to the hooks it runs, so that git commands there find the repository,
# the index being committed and (pre-receive) the quarantined objects. A command that names
# its repository must not inherit them from whatever ran it, such as a hook of another
# repository: every git call would then read and write that one.
LOCATING = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE",
            "GIT_QUARANTINE_PATH", "GIT_PREFIX")
SUMMARY_LINES = 4
SUMMARY_CHARS = 800
REMOTE_LINES = 3      # the first "remote:" lines a summary keeps from the middle of git's output
STDERR_KEEP = 64 << 10          # the tail of stderr kept for the error summary
CANCEL_POLL = 0.25              # seconds between looks at a cancel event
_READ = 1 << 16
OPEN_INPUT_MAX = 16 << 10       # open_git's stdin: well inside a pipe's 64 KiB
# Paths one listing of a tree (ls-tree -r) may name. Trees are shared by id,
# so a pushed tree of a few hundred bytes can stand for billions of paths ("tree bomb"), which
# git lists for hours; a snapshot repository's commits name thousands.
MAX_LISTED_PATHS = 200_000
MAX_PATH_BYTES = 4096           # average bytes per listed record allowed, paths and fields

_counter_lock = threading.Lock()
_started = 0
_as_hook = False       # run_as_hook(): keep git's repository variables


def run_as_hook() -> None:
    """This process is the git hook git runs (``snapops hook``): the repository variables
    git exported are meant for its git calls, and are kept."""
    global _as_hook
    _as_hook = True


def forget_hook_environment() -> None:
    """Remove git's repository variables (:data:`LOCATING`) from this process's environment,
    for libraries that start git themselves (gitpython) in a process that names its
    repository (the daemon)."""
    for name in LOCATING:
        os.environ.pop(name, None)


def git_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git child: ours without :data:`LOCATING` (unless
    :func:`run_as_hook`), :data:`GIT_ENV` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if _as_hook or k not in LOCATING}
    return {**env, **GIT_ENV, **(extra or {})}


def invocations() -> int:
    """How many git processes this process has started (what an idle daemon must not do)."""
    with _counter_lock:
        return _started


@dataclass(frozen=True)
class GitResult:
    """What a finished git printed; ``returncode`` < 0 means killed by that signal."""

    args: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        """stdout decoded (undecodable bytes kept as surrogates), without the final newline."""
        return self.stdout.decode("utf-8", "surrogateescape").rstrip("\n")


class GitExit(Exception):
    """How a failed call ended: chained as the ``__cause__`` of every GitError raised here.

    ``reason`` says which limit ended it (a timeout or stall), None when git exited itself.
    """

    def __init__(self, result: GitResult, reason: str | None = None) -> None:
        super().__init__(reason or f"exit status {result.returncode}")
        self.result, self.reason = result, reason

    @property
    def killed(self) -> bool:
        """Ended by a signal or by a limit: it may not have cleaned up (lock files)."""
        return self.result.returncode < 0 or self.reason is not None


class ChildGuard:
    """Ends every live git process group when its owner dies (see the module docstring).

    ``start()`` spawns the guard (``formats/procgroup.py`` run as a script, idempotent);
    ``stop()`` closes the channel and waits for it. Each git call registers its group with a
    message ``+PGID`` carrying the read ends of git's output pipes, and unregisters with
    ``-PGID``. When the owner dies, the channel ends and the guard ends what is still
    registered as a timeout would (:func:`~snapops.formats.procgroup.end_group`). Holding the
    pipes keeps them open meanwhile: git's last words go into a pipe with a reader instead of
    killing it with SIGPIPE before it cleans up (a local ``receive-pack`` leaves its
    quarantine behind then).

    Example::

        children.start()
        run_git(["push", url, "main"], cwd=repo)   # ended with us, whatever happens
        children.stop()
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._channel: socket.socket | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        with self._lock:
            if self._proc is not None:
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:
                # Its own process group: a signal to the owner's group does not reach it.
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", procgroup.__file__], stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
            self._channel = ours

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        if proc is not None:
            proc.wait()

    def _send(self, message: str, fds: list[int]) -> None:
        with self._lock:
            if self._channel is None:
                return
            try:
                socket.send_fds(self._channel, [message.encode()], fds)
            except OSError as err:  # the guard is gone: keep working, unguarded
                log.warning("git child guard stopped (%s); git children are unguarded", err)
                self._channel.close()
                self._proc, self._channel = None, None

    def register(self, proc: subprocess.Popen) -> None:
        pipes = [s.fileno() for s in (proc.stdout, proc.stderr) if s is not None]
        self._send(f"+{proc.pid}", pipes)

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}", [])


children = ChildGuard()


def ref_lines(stdout: bytes) -> list[str]:
    """The lines of a ref listing (``for-each-ref``, ``ls-remote``), cut at LF only: a ref
    name may hold U+00A0 or U+2028, where ``str.split()`` and ``splitlines()`` would cut or
    strip it, so a check would see another ref than the one git has."""
    return [line for line in stdout.decode("utf-8", "surrogateescape").split("\n") if line]


def summarize(result: GitResult, redact: Mapping[str, str] | None = None) -> str:
    """The last few meaningful lines git printed (stderr, then stdout) on one line, with the
    server's first few ``remote:`` lines among them, or how it ended; progress lines (ended
    by CR) are left out."""
    lines: list[str] = []
    for data in (result.stderr, result.stdout):
        text = data.decode("utf-8", "replace")
        for line in text.replace("\r\n", "\n").split("\n"):
            line = line.rsplit("\r", 1)[-1].strip(" '\t")
            if line:
                lines.append(line)
    if result.returncode < 0:
        try:
            name = signal.Signals(-result.returncode).name
        except ValueError:
            name = f"signal {-result.returncode}"
        lines.append(f"git was killed by {name}")
    elif not lines:
        lines = [f"exit status {result.returncode}"]
    if len(lines) > SUMMARY_LINES:  # git's first line names the cause, the last ones the end
        # and a server's first words between them say why it refused (a hook's reason)
        middle = lines[1:-(SUMMARY_LINES - 1)]
        remote = [line for line in middle if line.startswith("remote:")][:REMOTE_LINES]
        lines = lines[:1] + ["..."] + remote + (["..."] if remote else []) + \
            lines[-(SUMMARY_LINES - 1):]
    text = " | ".join(lines)
    text = text if len(text) <= SUMMARY_CHARS else "..." + text[-SUMMARY_CHARS:]
    return _redacted(text, redact)


def _redacted(text: str, redact: Mapping[str, str] | None) -> str:
    for secret, shown in sorted((redact or {}).items(), key=lambda kv: -len(kv[0])):
        if secret:
            text = text.replace(secret, shown)
    return text


def _spawn(args: Sequence[str], cwd, env: Mapping[str, str] | None, stdin, stdout,
           bufsize: int = -1) -> subprocess.Popen:
    global _started
    try:
        proc = subprocess.Popen(
            ["git", *args], cwd=None if cwd is None else os.fspath(cwd),
            env=git_environment(env), stdin=stdin, stdout=stdout,
            stderr=subprocess.PIPE, process_group=0, bufsize=bufsize)
    except OSError as err:
        raise GitError(f"cannot run git: {err.strerror or err}") from err
    with _counter_lock:
        _started += 1
    children.register(proc)
    return proc


def _finish(proc: subprocess.Popen, *, kill: bool) -> int:
    """Wait for git and end whatever it left in its group; return its exit status.

    The group is signalled while the leader is an unreaped zombie (``WNOWAIT``): its pid,
    which is the group id, cannot be reused by another process until then.
    """
    if kill:
        end_group(proc.pid)
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    signal_group(proc.pid, signal.SIGKILL)
    children.unregister(proc.pid)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    return proc.wait()


class _Pump:
    """Moves bytes between git's pipes and memory; notices silence (a stall) and deadlines."""

    def __init__(self, proc: subprocess.Popen, data: bytes | None,
                 on_line: Callable[[str], None] | None) -> None:
        self.proc, self.on_line = proc, on_line
        self.data, self.sent = memoryview(data or b""), 0
        self.out: list[bytes] = []
        self.err = bytearray()
        self.partial = b""
        self.sel = selectors.DefaultSelector()
        if proc.stdin is not None:
            self.sel.register(proc.stdin, selectors.EVENT_WRITE)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                self.sel.register(stream, selectors.EVENT_READ)

    def run(self, timeout: float | None, stall: float | None,
            cancel: threading.Event | None = None,
            floor: DiskFloor | None = None) -> str | None:
        """Until every pipe is closed (None) or a limit is reached (the reason, as text)."""
        start = time.monotonic()
        silence = None if stall is None else Silence(self.proc.pid, stall)
        with self.sel:
            if self.proc.stdin is not None and not self.data:
                self._close(self.proc.stdin)
            while self.sel.get_map():
                if cancel is not None and cancel.is_set():
                    return "cancelled"
                now = time.monotonic()
                low = floor.low(now) if floor is not None else None
                if low is not None:
                    return low
                limits = [] if cancel is None else [(CANCEL_POLL, None)]
                if floor is not None:
                    limits.append((DISK_POLL, None))
                if timeout is not None:
                    limits.append((start + timeout - now, f"did not finish in {timeout:g} s"))
                if silence is not None:
                    limits.append((silence.left(now), f"stalled: no progress for {stall:g} s"))
                wait = min(limits, default=(None, None), key=lambda limit: limit[0])
                if wait[0] is not None and wait[0] <= 0:
                    return wait[1]
                if silence is not None:  # look at the group's bytes while git is silent
                    wait = (min(wait[0], silence.every), wait[1])
                for key, _ in self.sel.select(wait[0]):
                    if self._move(key.fileobj) and silence is not None:
                        silence.heard()
        return None

    def _move(self, stream) -> bool:
        """One read or write on a ready pipe; True when git printed something."""
        if stream is self.proc.stdin:
            chunk = self.data[self.sent:self.sent + select.PIPE_BUF]
            try:
                self.sent += os.write(stream.fileno(), chunk)
            except BrokenPipeError:
                self.sent = len(self.data)
            if self.sent >= len(self.data):
                self._close(stream)
            return False
        block = os.read(stream.fileno(), _READ)
        if not block:
            self._close(stream)
            return False
        if stream is self.proc.stdout:
            self.out.append(block)
        else:
            self._stderr(block)
        return True

    def _stderr(self, block: bytes) -> None:
        self.err += block
        if len(self.err) > 2 * STDERR_KEEP:
            del self.err[:-STDERR_KEEP]
        if self.on_line is None:
            return
        lines = (self.partial + block).replace(b"\r", b"\n").split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if line.strip():
                self.on_line(line.decode("utf-8", "replace").strip())

    def _close(self, stream) -> None:
        self.sel.unregister(stream)
        with contextlib.suppress(OSError):
            stream.close()


def run_git(args: Sequence[str], *, cwd: str | os.PathLike | None = None,
            input: bytes | None = None, env: Mapping[str, str] | None = None,
            check: bool = True, timeout: float | None = None, stall: float | None = None,
            on_line: Callable[[str], None] | None = None, stdout: IO[bytes] | None = None,
            cancel: threading.Event | None = None, error: type[GitError] = GitError,
            what: str | None = None, where: str | None = None,
            redact: Mapping[str, str] | None = None,
            keep_free: tuple[str | os.PathLike, int] | None = None) -> GitResult:
    """Run ``git args`` in ``cwd`` and return what it printed.

    ``input`` is fed to its stdin (else stdin is empty); ``stdout`` (a binary file) receives
    its output instead of memory. ``timeout``: seconds in all; ``stall``: seconds without
    output; ``cancel`` set (another thread stops the call); ``keep_free`` (folder, bytes):
    less than that left free on the folder's disk: each ends git and its whole group and
    raises ``error``. ``on_line`` receives
    every stderr line (progress lines too, CR-separated) as it comes. ``check=False`` returns
    a failed result instead of raising (a timeout or stall still raises).

    Example::

        run_git(["cat-file", "-t", "HEAD"], cwd=repo).text
        # -> 'commit'
    """
    proc = _spawn(args, cwd, env, subprocess.PIPE if input is not None else subprocess.DEVNULL,
                  stdout if stdout is not None else subprocess.PIPE)
    pump, reason, done = _Pump(proc, input, on_line), None, False
    floor = DiskFloor(*keep_free) if keep_free is not None else None
    try:
        reason = pump.run(timeout, stall, cancel, floor)
        done = reason is None
    finally:
        code = _finish(proc, kill=not done)
    result = GitResult(tuple(args), code, b"".join(pump.out), bytes(pump.err[-STDERR_KEEP:]))
    if reason is not None or (check and code != 0):
        summary = summarize(result, redact)
        text = f"git {what or args[0]} failed: " + (f"{reason} | {summary}" if reason
                                                      else summary)
        kind = DiskLow if floor is not None and floor.tripped else error
        raise kind(f"{where}: {text}" if where else text) from GitExit(result, reason)
    return result


@contextlib.contextmanager
def open_git(args: Sequence[str], *, cwd: str | os.PathLike | None = None,
             env: Mapping[str, str] | None = None, what: str | None = None,
             bufsize: int = -1, input: bytes | None = None) -> Iterator[BinaryIO]:
    """Stream git's stdout (``cat-file blob``: no copy in memory or on disk).

    Leaving the block before the end stops git (a sniff, a header, a failure); reading it all
    and then finding git failed raises GitError. ``input`` (at most ``OPEN_INPUT_MAX``
    bytes: it is written whole before anything is read, so it must fit the pipe) is git's
    stdin (``cat-file --batch`` questions), else stdin is empty.

    Example::

        with open_git(["cat-file", "blob", oid], cwd=repo) as blob:
            head = blob.read(64)
    """
    if input is not None and len(input) > OPEN_INPUT_MAX:
        raise ValueError(f"open_git input of {len(input)} bytes: at most {OPEN_INPUT_MAX}")
    proc = _spawn(args, cwd, env, subprocess.DEVNULL if input is None else subprocess.PIPE,
                  subprocess.PIPE, bufsize)
    finished = False
    try:
        if input is not None:
            with contextlib.suppress(BrokenPipeError):     # git ended early: its status says why
                proc.stdin.write(input)
                proc.stdin.close()
        yield proc.stdout
        finished = True
    finally:
        drained = finished and proc.stdout.read(1) == b""
        err = b""
        if drained:
            err = proc.stderr.read(STDERR_KEEP)
        code = _finish(proc, kill=not drained)
    if drained and code != 0:
        result = GitResult(tuple(args), code, b"", err)
        raise GitError(f"git {what or ' '.join(args[:2])} failed: {summarize(result)}") \
            from GitExit(result)


def run_listing(args: Sequence[str], *, cwd: str | os.PathLike | None = None,
                env: Mapping[str, str] | None = None, what: str | None = None,
                max_paths: int = MAX_LISTED_PATHS) -> bytes:
    """stdout of a git command that lists paths with ``-z`` (``ls-tree -r``: one NUL ends
    each), read as it comes; LimitError, git stopped, once it names more than ``max_paths``
    paths or more bytes than that many records can hold. (``diff-tree -r`` is no such
    command: it collects every path before it prints one.)

    Example::

        run_listing(["ls-tree", "-r", "-z", commit], cwd=repo, max_paths=10)
        # -> LimitError: [limit] git ls-tree -r: the tree names more paths ... expected at
        #    most 10 paths, got more
    """
    out, nuls = bytearray(), 0
    max_bytes = max_paths * MAX_PATH_BYTES
    label = what or " ".join(args[:2])
    with open_git(args, cwd=cwd, env=env, what=label, bufsize=_READ) as stream:
        while block := stream.read(_READ):
            out += block
            nuls += block.count(b"\0")
            if nuls > max_paths or len(out) > max_bytes:
                raise LimitError(f"git {label}: the tree names more paths than snapops lists "
                                 "(a tree repeating its subtrees can stand for billions; raise "
                                 "git config snapops.maxPaths if this one is real)",
                                 expected=f"at most {max_paths} paths", got="more")
    return bytes(out)


class TreeRecord(NamedTuple):
    """One record of ``ls-tree -z`` output; ``size`` only with ``-l`` and for a blob."""

    mode: str
    kind: str
    oid: str
    size: int | None
    path: str


def tree_records(listed: bytes) -> Iterator[TreeRecord]:
    """The records of ``ls-tree -z`` output, with or without ``-l`` (the one parser of it);
    GitError on a record git would not write."""
    for record in filter(None, listed.split(b"\0")):
        meta, _, name = record.partition(b"\t")
        fields = meta.decode("ascii", "replace").split()
        if len(fields) not in (3, 4):
            raise GitError(f"git ls-tree: unexpected record {record[:80]!r}")
        size = fields[3] if len(fields) == 4 else ""
        yield TreeRecord(fields[0], fields[1], fields[2], int(size) if size.isdigit() else None,
                         name.decode("utf-8", "surrogateescape"))
