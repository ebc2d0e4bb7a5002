"""The one subprocess wrapper: every external program the toolkit runs goes through `run`.

It prints `+ <quoted command>`, checks that the program exists before starting it, keeps the full
output in a log file, streams it when verbose (or shows progress lines picked by the caller), and
on failure shows the tail of the output and where the whole log is.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from builder import output
from builder.errors import NoRoom, ToolError

TAIL_LINES = 40
T = TypeVar("T")
R = TypeVar("R")


def quote(args: Sequence[str | os.PathLike[str]]) -> str:
    return shlex.join(str(a) for a in args)


def which(program: str, env: Mapping[str, str] | None = None) -> str | None:
    """Resolve `program` on the PATH of the environment the command will really run in."""
    path = (env if env is not None else os.environ).get("PATH")
    return shutil.which(program, path=path)


COLOUR_FORCING = ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS", "PY_COLOR", "UV_COLOR", "PIP_COLOR")


def not_found(program: str, fix: str = "") -> ToolError:
    """A program that cannot be run, said as what it is: a path names a file that is missing, not a file
    (a folder, a FIFO) or not executable (`--python /etc/passwd` was "not found on PATH"); a bare name is
    not on PATH."""
    from builder.node import shown

    if os.sep not in program:
        return ToolError(
            f"'{shown(program)}' was not found on PATH", fix or f"install {shown(program)} or put it on PATH"
        )
    path = Path(program)
    why = ("does not exist" if not path.exists() else "is not a regular file (a folder, a FIFO or a device)"
           if not path.is_file() else "is not an executable program")  # fmt: skip
    return ToolError(f"{shown(program)} {why}", fix or "give the path of the program itself")


def plain(env: Mapping[str, str] | None) -> dict[str, str]:
    """`env` (default: this process's) with colour off: what the toolkit parses is what it asked for
    (with FORCE_COLOR=1 uv coloured its dry-run plan and the plan read as empty)."""
    out = {k: v for k, v in (os.environ if env is None else env).items() if k not in COLOUR_FORCING}
    out["NO_COLOR"] = "1"
    return out


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    verbose: bool = False,
    progress: Callable[[str], str | None] | None = None,
    fix: str = "",
    group: bool = False,
    check: bool = True,
) -> str:
    """Run a command to completion and return its combined stdout and stderr.

    `progress` sees every output line and returns a short text to print (or None), so a long
    step shows it is alive without flooding the terminal. Raises ToolError when the program is
    missing or exits non-zero. With `group`, the command and everything it starts (setup.py, ninja,
    the compilers) run in a process group of their own that dies with this process, however it
    ends (kill -9 included): a watchdog holding a pipe from us kills the group when the pipe closes.
    With `check` False a non-zero exit is the caller's to read from the output (pdsh's, host by host).
    """
    argv = [str(a) for a in args]
    program = argv[0]
    if _STOPPING.is_set():  # a signal reached the main thread: a unit's thread starts nothing new
        raise Stopped(f"not started, the run is stopping: {quote(argv)[:200]}", "")
    found = which(program, env)
    if found is None:
        raise not_found(program, fix)
    if os.sep in program:  # a relative path must survive the change to `cwd`
        argv[0] = os.path.abspath(found)
    output.command(quote(argv))
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    start = time.monotonic()
    with open(log if log is not None else os.devnull, "a", encoding="utf-8") as log_file:
        log_file.write(f"+ {quote(argv)}\n")
        log_file.flush()
        # The watchdog is up before the command starts: started after it, a kill while it started
        # (a fork and exec, seconds on a loaded machine) left the command's group running (CI).
        dog = _watchdog() if group else None
        try:
            proc = subprocess.Popen(
                argv,
                env=plain(env),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=group,
            )
        except BaseException:
            if dog is not None:
                _call_off(dog, None)
            raise
        if dog is not None:
            with contextlib.suppress(BrokenPipeError):  # a watchdog already gone guards nothing, stops nothing
                os.write(dog[1], f"{proc.pid}\n".encode())  # the session to kill when the pipe closes
        assert proc.stdout is not None
        with _RUNNING_LOCK:
            _RUNNING[proc.pid] = group
        if _STOPPING.is_set():  # stop_all ran while it started
            _kill(proc.pid, group)
        try:
            for line in proc.stdout:
                log_file.write(line)
                lines.append(line)
                tail.append(line)
                if verbose:
                    output.raw(line)
                elif progress is not None and (shown := progress(line.rstrip("\n"))):
                    output.note(f"[{time.monotonic() - start:5.0f}s] {shown}")
            code = proc.wait()
        except (
            BaseException
        ) as exc:  # Ctrl-C (the child had it too), SIGTERM, a failing reader: the child is gone first
            if group:  # its own group does not get the terminal's Ctrl-C: pass it on
                signal_session(proc.pid, signal.SIGINT)
            elif not isinstance(exc, KeyboardInterrupt) and proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # SIGTERM came to this process alone: the child cleans up as on Ctrl-C
            _stop(proc)
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(proc.pid, None)
            if dog is not None:
                _call_off(dog, proc)
        log_file.write(f"# exit status {code} after {time.monotonic() - start:.1f}s\n")
    if _STOPPING.is_set() and code != 0:
        raise Stopped(f"stopped, the run is stopping: {quote(argv)[:200]}", "")
    if code != 0 and check:
        where = f"\n  full log: {log}" if log is not None else ""
        full = "".join(lines)
        room = next((said for said in NO_ROOM if said in full), None)
        if room is not None:  # its own words about a full disk: the one line that matters, not its traceback
            line = next(x for x in reversed(full.splitlines()) if room in x).strip()[-300:]
            raise NoRoom(
                f"{os.path.basename(program)} ran out of room: {line}{where}",
                "free space where it writes (df -h; a temporary folder: TMPDIR), or raise the quota, then run "
                "the command again; nothing half-written was kept",
            )
        shown_tail = "" if verbose else "".join(tail)
        raise ToolError(
            f"command failed with exit status {code}: {quote(argv)}\n{shown_tail}{where}".rstrip(),
            fix or "read the output above; rerun with --verbose to stream it",
        )
    return "".join(lines)


# Commands running now (pid -> started in a session of its own) and whether the run is stopping: a
# SIGTERM or Ctrl-C lands in the main thread while units' threads run their compilers (stop_all).
_RUNNING: dict[int, bool] = {}
_RUNNING_LOCK = threading.Lock()
_STOPPING = threading.Event()


class Stopped(ToolError):
    """A command not started, or killed, because the run is stopping (stop_all)."""


def stopping() -> bool:
    return _STOPPING.is_set()


def stop_all() -> None:
    """The run is stopping (a signal reached the main thread): no command starts from now on, and every
    running one is killed at once, its whole session where it has one (setup.py, ninja, every compiler).
    A Slurm time limit gives 30 s between SIGTERM and SIGKILL: the compilers must not finish their files."""
    _STOPPING.set()
    with _RUNNING_LOCK:
        running = dict(_RUNNING)
    for pid, group in running.items():
        _kill(pid, group)


def _kill(pid: int, group: bool) -> None:
    if group:
        signal_session(pid, signal.SIGKILL)
    else:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def in_threads(work: Callable[[T], R], items: Sequence[T], workers: int, name: str) -> list[R]:
    """`work` over `items`, `workers` at once, results in order. Where the main thread is interrupted
    while they run (SIGTERM raised as an exception, Ctrl-C), every command they run is killed at once
    (stop_all), those not started never start, and the threads' own clean-up has run before the
    interruption goes on: nothing of theirs is left behind, nothing half-made is kept."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=name) as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            stop_all()
            for f in futures:
                f.cancel()
            raise  # the pool's exit waits for the running threads, whose commands are gone


# What a program says when its disk is full, its quota spent or its folder read-only (errno's words).
NO_ROOM = ("No space left on device", "Disk quota exceeded", "Read-only file system")


def signal_session(sid: int, sig: int) -> None:
    """`sig` to every process of the session `sid` (a command started with start_new_session): ninja
    starts each compile in a process group of its own, so the command's group alone misses them."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) == sid:
                os.kill(int(name), sig)
        except (OSError, ValueError, IndexError):
            pass


# The watchdog: a tiny Python that reads its stdin (a pipe only we hold the other end of) until it
# closes, that is until we exit or are killed, then kills every process of the command's session,
# whose id we write first (with the same function as above, its source handed over).
_WATCHDOG = (
    "import os, signal, sys\n" + inspect.getsource(signal_session) + "sid = sys.stdin.buffer.read().split(b'\\n')[0]\n"
    "if sid.isdigit():\n    signal_session(int(sid), signal.SIGKILL)\n"
)


def _watchdog() -> tuple[subprocess.Popen[bytes], int]:
    read_end, write_end = os.pipe()  # not inherited by any other child (os.pipe is non-inheritable)
    try:
        dog = subprocess.Popen([sys.executable, "-c", _WATCHDOG], stdin=read_end, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    finally:
        os.close(read_end)
    return dog, write_end


def _call_off(dog: tuple[subprocess.Popen[bytes], int], proc: subprocess.Popen[str] | None) -> None:
    """The command is over (or stopped, or never started): what is left of its group goes, then the watchdog."""
    watchdog, write_end = dog
    if proc is not None and proc.poll() is not None:
        signal_session(proc.pid, signal.SIGKILL)  # stragglers a finished command left in its session
    watchdog.kill()
    watchdog.wait()
    os.close(write_end)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Let an interrupted child finish its own cleanup (podman removes its build container on
    SIGINT), then make sure it is gone, so what runs next sees what it left."""
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class NoAnswer(ToolError):
    """A short query that hung past its timeout: a busy or restarting service, which a caller
    that follows jobs may ask again rather than give up on."""


def ask(
    args: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A short query whose failure matters (squeue while following jobs, a script piped to ssh):
    silent, its exit status and both streams returned; ToolError when the program is missing,
    NoAnswer when it hangs."""
    if which(args[0], env) is None:
        raise not_found(args[0])
    try:
        return subprocess.run(
            list(args), capture_output=True, text=True, errors="replace", timeout=timeout, check=False,
            env=plain(env), input=stdin,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise NoAnswer(f"{quote(list(args))} did not answer in {timeout:.0f} s", "check the service it asks") from exc


def query(args: Sequence[str]) -> str:
    """Stdout of a short, quiet query (`nvcc --version`, `gcc -dumpfullversion`); '' if missing or failing.

    Detection asks many such questions where "no answer" is itself the answer, so nothing is
    printed or raised; a minute's timeout keeps a hung driver query from hanging detection. Output
    that is not UTF-8 (a broken or hostile program) is decoded with replacement characters.
    """
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, errors="replace", timeout=60, check=False,
                              env=plain(None))  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""
