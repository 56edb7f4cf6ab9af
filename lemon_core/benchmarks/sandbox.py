"""Run untrusted Python (HumanEval completions written by a model) in a throwaway, limited subprocess.

Why layered: a model mostly writes careless code (endless loops, giant lists), rarely hostile code,
but scoring runs thousands of programs unattended, so no single mechanism is trusted alone.

1. Process limits (always): the program runs in its own session/process group with rlimits on address
   space, CPU seconds, file size, open files, process count and core dumps; on timeout the whole group
   is SIGKILLed. stdout/stderr go to host-side files, so a lingering grandchild cannot block the wait.
2. Namespaces (when the kernel lets us; probed once, see ``isolation_mode``): a small launcher
   unshares a network namespace (only a down loopback: no network at all), a PID namespace (when its
   first process dies the kernel kills every process in it, even ones that called ``setsid``) and a
   mount namespace in which /tmp, /var/tmp, /dev/shm and /run/lock are fresh, size-capped tmpfs, so a
   write to an absolute scratch path lands in memory that vanishes with the run. As root it then
   drops to a fresh, unused uid (so RLIMIT_NPROC is really enforced - Linux exempts root from it - and
   host files are read-only to the program); directories on the interpreter's path that the new uid
   could not traverse (e.g. a 0700 /root holding pyenv) are replaced by a tmpfs holding read-only bind
   mounts of exactly the interpreter's folders. As non-root the launcher uses a user namespace instead.
3. A Python prelude (always) run before the program: sockets raise, fork/exec/subprocess/kill/setsid
   raise, and opening a file for writing (or removing/renaming one) outside the work dir raises.

Modes: ``"namespaces"`` (root: netns+pidns+mountns+uid drop), ``"userns"`` (same in a user namespace,
for non-root users), ``"basic"`` (layers 1 and 3 only, with a scrubbed environment). ``"auto"`` picks
the first mode that runs a trivial program on this machine.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)
Mode = Literal["auto", "namespaces", "userns", "basic"]
Reason = Literal["passed", "failed", "timeout", "error"]

SANDBOX_EXIT = 125  # the launcher exits with this when it could not set the sandbox up
PROGRAM_NAME = "program.py"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one run. Defaults fit HumanEval (each check runs in well under a second)."""

    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30  # RLIMIT_AS
    file_size_bytes: int = 10 << 20  # RLIMIT_FSIZE, also caps the captured stdout/stderr
    max_processes: int = 16  # RLIMIT_NPROC (counts threads too)
    max_open_files: int = 64  # RLIMIT_NOFILE
    tmpfs_bytes: int = 64 << 20  # size of each fresh scratch tmpfs in namespace modes


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    reason: Reason
    returncode: int | None
    stdout_tail: str
    stderr_tail: str
    duration_s: float
    mode: str


# Runs in the sandboxed interpreter before the program. Its names live inside a function (deleted after
# the call) so the program's global namespace is left as the harness expects.
PRELUDE = r'''
def _lemon_guard():
    import builtins, io, os, socket, _socket, subprocess
    root = os.path.realpath(os.getcwd())

    def blocked(what):
        def deny(*args, **kwargs):
            raise PermissionError(f"{what} is disabled in the lemon sandbox")
        return deny

    class NoSocket:
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the lemon sandbox")

    socket.socket = _socket.socket = NoSocket
    socket.create_connection = socket.socketpair = socket.fromfd = blocked("network access")
    socket.getaddrinfo = blocked("network access")
    for name in ("fork", "forkpty", "system", "popen", "kill", "killpg", "setsid", "setpgid",
                 "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle", "execlp",
                 "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle",
                 "spawnvp", "spawnvpe", "spawnlp", "spawnlpe"):
        if hasattr(os, name):
            setattr(os, name, blocked(f"os.{name}"))
    subprocess.Popen = blocked("subprocess")
    subprocess._fork_exec = blocked("subprocess")

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return True  # an already-open descriptor was checked when it was opened
        if dir_fd is not None:
            return False
        real = os.path.realpath(os.fspath(path))
        return real == root or real.startswith(root + os.sep)

    def check(path, what, dir_fd=None):
        if not inside(path, dir_fd):
            raise PermissionError(f"{what} outside the sandbox work dir is disabled: {path!r}")

    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax+"):
            check(file, "writing")
        return real_open(file, mode, *args, **kwargs)

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & write_flags:
            check(path, "writing", dir_fd)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    builtins.open = io.open = guarded_open
    os.open = guarded_os_open

    def path_guard(name, nargs):
        real = getattr(os, name)

        def guarded(*args, **kwargs):
            for path in args[:nargs]:
                check(path, f"os.{name}", kwargs.get("dir_fd"))
            return real(*args, **kwargs)
        setattr(os, name, guarded)

    for name in ("remove", "unlink", "rmdir", "mkdir", "chmod", "chown", "truncate", "utime",
                 "symlink", "link", "mkfifo", "mknod"):
        path_guard(name, 1)
    for name in ("rename", "replace"):
        path_guard(name, 2)

_lemon_guard()
del _lemon_guard
'''

# Runs as `python -I -S -c LAUNCHER <config json>` in a fresh session. Sets up namespaces, mounts,
# limits and the uid, then execs the interpreter on the program. Any setup failure exits 125.
LAUNCHER = r'''
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18

def fail(msg):
    os.write(2, f"lemon-sandbox: {msg}\n".encode())
    os._exit(125)

def call(what, result):
    if result != 0:
        err = ctypes.get_errno()
        fail(f"{what} failed: {os.strerror(err)}")

def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    call(f"mount {target}", libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))

def write(path, text):
    with open(path, "w") as f:
        f.write(text)

mode, work = cfg["mode"], cfg["workdir"]
try:
    if mode in ("namespaces", "userns"):
        uid, gid = os.getuid(), os.getgid()
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (CLONE_NEWUSER if mode == "userns" else 0)
        call("unshare", libc.unshare(flags))
        if mode == "userns":
            write("/proc/self/setgroups", "deny")
            write("/proc/self/uid_map", f"0 {uid} 1")
            write("/proc/self/gid_map", f"0 {gid} 1")
        child = os.fork()
        if child:  # outside the new PID namespace: relay the exit status, die with the session
            _, status = os.waitpid(child, 0)
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV)
        # descriptors must be opened inside the new mount namespace to be bind sources, and before
        # the tmpfs mounts below cover their paths
        keep = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in cfg["expose"]}
        work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        size = f"size={cfg['tmpfs_bytes']}"
        for d in cfg["scratch"]:
            mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
        for d in cfg["hide"]:
            mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=755")
        for p, fd in keep.items():
            os.makedirs(p, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            mount(None, p, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
            os.close(fd)
        os.makedirs(work, exist_ok=True)
        mount(f"/proc/self/fd/{work_fd}", work, None, MS_BIND)
        os.close(work_fd)
    os.chdir(work)
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    if mode in ("namespaces", "userns"):
        PR_SET_PDEATHSIG = 1
        call("prctl", libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0))
except OSError as exc:
    fail(f"setup failed: {exc}")
os.execve(cfg["python"], [cfg["python"], "-I", cfg["program"]], cfg["env"])
'''


def _exposed_dirs() -> list[str]:
    """Folders the interpreter needs: its prefix(es) and the folders holding its executable."""
    dirs = {sys.base_prefix, sys.prefix, os.path.dirname(sys.executable),
            os.path.dirname(os.path.realpath(sys.executable))}
    real = sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})
    return [d for d in real if not any(d.startswith(other + os.sep) for other in real)]


def _untraversable_ancestors(paths: list[str]) -> list[str]:
    """Topmost ancestors of ``paths`` that an unprivileged uid cannot enter (no o+x)."""
    hidden: set[str] = set()
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts) + 1):
            ancestor = str(Path(*parts[:i]))
            if not os.stat(ancestor).st_mode & 0o001:
                hidden.add(ancestor)
                break
    return sorted(hidden)


SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _config(mode: str, workdir: str, limits: SandboxLimits, uid: int | None) -> dict:
    expose = _exposed_dirs()
    scratch = [d for d in SCRATCH_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    hide = _untraversable_ancestors(expose) if uid is not None else []
    # exposed dirs that live under a scratch dir must be re-bound after it is covered
    expose = [p for p in expose if any(p.startswith(d + os.sep) for d in scratch + hide)]
    rlimits = {
        "RLIMIT_AS": limits.memory_bytes,
        "RLIMIT_CPU": math.ceil(limits.timeout_s) + 1,
        "RLIMIT_FSIZE": limits.file_size_bytes,
        "RLIMIT_NOFILE": limits.max_open_files,
        "RLIMIT_CORE": 0,
    }
    if mode != "basic" or os.geteuid() != 0:  # root ignores RLIMIT_NPROC; a low cap only hurts threads
        rlimits["RLIMIT_NPROC"] = limits.max_processes
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
           "PYTHONDONTWRITEBYTECODE": "1"}
    return {"mode": mode, "workdir": workdir, "expose": expose, "scratch": scratch, "hide": hide,
            "tmpfs_bytes": limits.tmpfs_bytes, "rlimits": rlimits, "uid": uid,
            "python": sys.executable, "program": os.path.join(workdir, PROGRAM_NAME), "env": env}


def _fresh_uid() -> int:
    """A uid no account uses, so RLIMIT_NPROC counts only this run's processes."""
    return 3_000_000 + secrets.randbelow(1_000_000)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process still running as the run's private uid (belt and braces)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Uid:"):
                if int(line.split()[1]) == uid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(status.parent.name), signal.SIGKILL)
                break


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4 * chars))
            return f.read().decode("utf-8", "replace")[-chars:]
    except OSError:
        return ""


def run_python(code: str, limits: SandboxLimits | None = None, mode: Mode = "auto",
               guard: bool = True) -> SandboxResult:
    """Run ``code`` sandboxed; passed means exit status 0 within the time limit.

    ``guard=False`` drops the Python prelude (layer 3) so tests can check the OS layers alone.
    """
    limits = limits or SandboxLimits()
    if mode == "auto":
        mode = isolation_mode()
    uid = _fresh_uid() if mode == "namespaces" and os.geteuid() == 0 else None
    host_dir = Path(tempfile.mkdtemp(prefix="lemon_sbx_"))
    workdir = host_dir / "work"
    workdir.mkdir()
    start = time.monotonic()
    proc: subprocess.Popen | None = None
    try:
        (workdir / PROGRAM_NAME).write_text((PRELUDE if guard else "") + "\n" + code)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(workdir / PROGRAM_NAME, uid, uid)
        os.chmod(workdir, 0o700)
        cfg = _config(mode, str(workdir), limits, uid)
        out_path, err_path = host_dir / "stdout", host_dir / "stderr"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(cfg)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=host_dir, env=cfg["env"],
                start_new_session=True, close_fds=True,
            )
            try:
                returncode: int | None = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
        duration = time.monotonic() - start
        stderr = _tail(err_path)
        if returncode is None:
            reason: Reason = "timeout"
        elif returncode == 0:
            reason = "passed"
        elif "AssertionError" in stderr:
            reason = "failed"
        else:
            reason = "error"
        return SandboxResult(reason == "passed", reason, returncode, _tail(out_path), stderr,
                             duration, mode)
    finally:
        if proc is not None:
            _kill_group(proc)
        if uid is not None:
            _kill_uid(uid)
        shutil.rmtree(host_dir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


@functools.cache
def isolation_mode() -> str:
    """The strongest mode that works here, probed once per process by running a trivial program."""
    candidates = ["namespaces", "userns", "basic"] if os.geteuid() == 0 else ["userns", "basic"]
    if not sys.platform.startswith("linux"):
        candidates = ["basic"]
    last_error = ""
    for mode in candidates:
        result = run_python("import json; print(json.dumps([1]))", SandboxLimits(timeout_s=20), mode=mode)
        if result.passed and result.stdout_tail.strip() == "[1]":
            if mode == "basic" and len(candidates) > 1:
                log.warning("code sandbox: namespaces unavailable (%s); using rlimits + Python guard only",
                            last_error or "no detail")
            return mode
        last_error = result.stderr_tail.strip()
    raise RuntimeError(
        "the code sandbox cannot run even a trivial program here; last stderr:\n" + last_error
    )
