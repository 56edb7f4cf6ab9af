"""Run untrusted Python (HumanEval completions written by a model) in a throwaway, limited subprocess.

Threat model (docs/sandbox.md has the long form): the program is hostile and runs with everything its
own interpreter offers, ctypes included, so any Python-level guard inside it can be undone. What holds
is only what the kernel enforces from outside the program, and a verdict the program cannot write.

1. Verdict (``run_tests``): the tests run in a *second* sandboxed process, the checker, that holds only
   trusted code (the problem's prompt and tests). The program under test runs the completion and answers
   calls to the entry point over a pipe; values cross as plain data (see ``encode_value``), so nothing
   the program defines ever runs in the checker. The checker writes a per-run secret, which it read from
   its stdin, on a pipe of its own only after ``check(candidate)`` returned. The program never sees that
   secret or that pipe, so exiting 0, exit hooks, signals, threads, trace/profile hooks, ctypes ``exit``
   or killing itself cannot produce a pass. ``run_python`` (exit status 0 = passed) is for trusted code.
2. Process limits (always): own session/process group, rlimits on address space, CPU seconds, file size,
   open files, process count and core dumps; on timeout the whole group is SIGKILLed. stdout/stderr go
   to host-side files, so a lingering grandchild cannot block the wait.
3. Namespaces: a small launcher unshares a network namespace (only a down loopback: no network at all,
   abstract unix sockets included), a PID namespace (the parent and every host process are invisible,
   so they cannot be signalled or read through /proc; when its first process dies the kernel kills every
   process in it, even ones that called ``setsid``) and a mount namespace. There it makes every inherited
   mount read-only and pivots into a minimal root on a tmpfs: read-only binds of the system libraries
   (/usr, /lib*, /bin, /sbin, /etc/ld.so.cache), the interpreter's folders and /dev/null-like devices,
   the namespace's own /proc (an empty one where a container's masked /proc forbids that), fresh
   size-capped /tmp, /var/tmp and /dev/shm, and the work dir, the one writable host path. Datasets, home
   dirs and mounted secrets are simply not there. As root it then drops to a fresh, unused uid
   (RLIMIT_NPROC is then really enforced - Linux exempts root). As non-root it uses a user namespace.
4. A Python prelude run before the program: sockets, fork/exec/kill and writes outside the work dir
   raise. It only turns careless code into clear errors; it is no security boundary (ctypes undoes it).

Modes: ``"namespaces"`` (root: netns+pidns+mountns+uid drop), ``"userns"`` (the same in a user namespace,
for non-root users), ``"basic"`` (layers 2 and 4 only). ``basic`` cannot stop ctypes code from writing
outside the work dir, reaching a loopback listener, reading the scorer's secrets in /proc/<ppid>/environ,
killing the scorer or leaving ``setsid`` children behind, so it is refused unless the environment says
``LEMON_SANDBOX=unsafe-allow``. ``sandbox_mode()`` names the mode scoring will use.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import inspect
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
from typing import Any, Literal

try:  # this file also runs alone, copied for an unprivileged user (tests/test_sandbox_modes.py)
    from lemon_core.errors import LemonError
except ImportError:  # pragma: no cover - only in that standalone copy
    LemonError = RuntimeError  # type: ignore[misc,assignment]

log = logging.getLogger(__name__)
Mode = Literal["auto", "namespaces", "userns", "basic"]
Reason = Literal["passed", "failed", "timeout", "error"]

SANDBOX_EXIT = 125  # the launcher exits with this when it could not set the sandbox up
PROGRAM_NAME = "program.py"
POLICY_ENV = "LEMON_SANDBOX"  # "auto" (default): safe modes only; "unsafe-allow": may fall back to basic
POLICIES = ("auto", "unsafe-allow")
SAFE_MODES = ("namespaces", "userns")
MAX_MESSAGE_BYTES = 16 << 20  # one call's arguments or result, JSON-encoded


class SandboxUnavailableError(LemonError):
    """No mode that is safe for untrusted code works here (or the policy setting is invalid)."""


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
import ctypes, errno, json, os, re, resource, signal, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_PRIVATE, MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1024, 2048, 1 << 21, 1 << 24
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1  # same number on every arch


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


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

def remount_flags(path, read_only):
    # a bind remount must repeat the flags the kernel locked in a user namespace (nosuid, nodev, noexec, atime)
    have = os.statvfs(path).f_flag
    flags = MS_BIND | MS_REMOUNT | (MS_RDONLY if read_only else 0)
    for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                   (os.ST_NODIRATIME, MS_NODIRATIME)):
        flags |= ms if have & st else 0
    if have & os.ST_NOATIME:
        return flags | MS_NOATIME
    return flags | (MS_RELATIME if have & os.ST_RELATIME else MS_STRICTATIME)

def mount_points():
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in points]

def make_all_mounts_read_only():
    # one recursive mount_setattr (Linux >= 5.12), else one bind remount per mount point
    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    if not cfg.get("legacy_remount") and libc.syscall(
            SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) == 0:
        return
    for point in mount_points():
        try:
            if os.statvfs(point).f_flag & os.ST_RDONLY:
                continue
            flags = remount_flags(point, True)
        except OSError:
            continue  # gone, or under a later mount: unreachable, so not writable either
        if libc.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) != 0:
            err = ctypes.get_errno()
            if err != errno.EINVAL:  # EINVAL: a covered path, no longer a mount point; its cover is remounted
                fail(f"making {point} read-only failed: {os.strerror(err)}")

def mount_proc(target):
    # A container runtime's masked /proc (/dev/null bound over /proc/kcore, ...) makes the kernel refuse a
    # new proc mount in a user namespace (EPERM): then an empty, read-only /proc, so no process shows.
    if not cfg.get("no_fresh_proc"):  # tests take the fallback on purpose
        if libc.mount(b"proc", target.encode(), b"proc", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), None) == 0:
            return
        err = ctypes.get_errno()
        if err != errno.EPERM:
            fail(f"mount {target} failed: {os.strerror(err)}")
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=555")

def expose(path, root):
    # the host's path, read-only (every source mount is read-only by now), at the same place in the new root
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path):  # e.g. /bin -> usr/bin on merged-/usr systems
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    elif os.path.exists(path):
        open(target, "a").close()
    else:
        return
    mount(path, target, None, MS_BIND | MS_REC)

def build_root(root):
    # Only what the interpreter needs: the program never sees datasets, home dirs or mounted secrets.
    size = f"size={cfg['tmpfs_bytes']}"
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=755")
    # scratch first, binds after: an interpreter under /tmp (a CI or notebook virtualenv) must be bound
    # onto the fresh /tmp, not hidden under it
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):
        os.makedirs(root + scratch, exist_ok=True)
        mount("tmpfs", root + scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    for path in cfg["binds"]:
        expose(path, root)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + work, exist_ok=True)
    mount(work, root + work, None, MS_BIND)
    mount(None, root + work, None, remount_flags(root + work, False) | MS_NOSUID | MS_NODEV)  # the writable dir
    os.makedirs(root + "/proc", exist_ok=True)
    mount_proc(root + "/proc")
    mount(None, root, None, remount_flags(root, True))  # the root tmpfs itself: no new top-level files

def pivot_into(root):
    # pivot_root(".", ".") stacks the old root on the new one; detaching it leaves nothing of the host
    number = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(os.uname().machine)
    if number is None:
        fail(f"pivot_root: unknown syscall number on {os.uname().machine}")
    os.chdir(root)
    call("pivot_root", libc.syscall(number, b".", b"."))
    call("umount the host root", libc.umount2(b".", 2))  # MNT_DETACH
    os.chdir("/")

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
            for fd in cfg["fds"]:  # so the peer sees end-of-file as soon as the sandboxed program is gone
                os.close(fd)
            _, status = os.waitpid(child, 0)
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        make_all_mounts_read_only()  # the bind mounts below inherit it
        build_root(cfg["root"])
        pivot_into(cfg["root"])
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


# --- values between the checker and the program under test ------------------------------------------
# Both functions run inside the sandboxes (their source is copied into the programs), so they may only
# use builtins. Only plain data crosses: an object of the program's own class never reaches the checker,
# so none of its methods (an always-true ``__eq__``, say) can run where the tests are judged.


def encode_value(value: Any) -> Any:
    """A JSON-ready copy of a plain value; tuples, sets, dicts, bytes and complex numbers are tagged."""
    if value is None or type(value) in (bool, str, float):
        return value
    if isinstance(value, int):  # also int subclasses and IntEnum: only the number crosses
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v) for v in value]}
    if isinstance(value, frozenset):
        return {"frozenset": [encode_value(v) for v in value]}
    if isinstance(value, set):
        return {"set": [encode_value(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and hasattr(value, "dtype"):
        return encode_value(item())
    raise TypeError(f"cannot pass a {type(value).__name__} between the tested program and its checker; "
                    "return plain data (numbers, strings, lists, tuples, dicts, sets, bytes, None)")


def decode_value(data: Any) -> Any:
    """The value ``encode_value`` made; anything else is refused, so a hostile program sends data, not code."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_value(v) for v in data]
    if type(data) is dict and len(data) == 1:
        (tag, body), = data.items()
        if tag in ("tuple", "set", "frozenset") and type(body) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode_value(v) for v in body)
        if tag == "dict" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            return {decode_value(k): decode_value(v) for k, v in body}
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "complex" and type(body) is list and len(body) == 2 and all(type(x) is float for x in body):
            return complex(body[0], body[1])
    raise ValueError(f"the tested program sent something that is not a plain value: {str(data)[:200]}")


# The program under test: the completion's module, then a loop answering calls to the entry point.
# It is untrusted like the rest of the program (it may be replaced wholesale); it is only a convenience.
SERVE = '''
def _lemon_serve(entry_point, request_fd, reply_fd, codec_source):
    import json, os, sys
    sys.set_int_max_str_digits(0)
    codec = {{}}
    exec(codec_source, codec)
    function = globals()[entry_point]
    requests, replies = os.fdopen(request_fd, "rb"), os.fdopen(reply_fd, "wb")
    for line in iter(requests.readline, b""):
        args = [codec["decode_value"](a) for a in json.loads(line)["args"]]
        try:
            reply = {{"value": codec["encode_value"](function(*args))}}
        except Exception as exc:  # the checker re-raises it inside check(), as if the call raised there
            reply = {{"raised": f"{{type(exc).__name__}}: {{exc}}"[:2000]}}
        replies.write(json.dumps(reply).encode() + b"\\n")
        replies.flush()

_lemon_codec = {codec!r}
_lemon_serve({entry_point!r}, {request_fd}, {reply_fd}, _lemon_codec)
'''

# The checker: trusted code only (prompt and tests), plus a stand-in for the entry point that asks the
# program under test. The secret arrives on stdin and leaves on the verdict pipe after check() returned.
CHECK = '''
def _lemon_check(entry_point, request_fd, reply_fd, verdict_fd, codec_source):
    import ctypes, json, os, sys
    if sys.platform.startswith("linux"):  # PR_SET_DUMPABLE=0: no /proc/<pid>/mem, fd or ptrace for others
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    sys.set_int_max_str_digits(0)
    secret = sys.stdin.buffer.read()
    codec = {{}}
    exec(codec_source, codec)
    requests, replies = os.fdopen(request_fd, "wb"), os.fdopen(reply_fd, "rb")

    class CandidateError(Exception):
        """The tested function raised, or its program died or broke the protocol, during a call."""

    def candidate(*args):
        requests.write(json.dumps({{"args": [codec["encode_value"](a) for a in args]}}).encode() + b"\\n")
        requests.flush()
        line = replies.readline({max_bytes} + 1)
        if not line.endswith(b"\\n"):
            raise CandidateError("the tested program exited, or sent a reply over {max_bytes} bytes")
        reply = json.loads(line)
        if type(reply) is dict and set(reply) == {{"value"}}:
            return codec["decode_value"](reply["value"])
        if type(reply) is dict and set(reply) == {{"raised"}}:
            raise CandidateError(str(reply["raised"]))
        raise CandidateError("the tested program broke the call protocol")

    globals()[entry_point] = candidate  # tests that call the function by name reach it too, as officially
    check(candidate)
    os.write(verdict_fd, secret)

_lemon_codec = {codec!r}
_lemon_check({entry_point!r}, {request_fd}, {reply_fd}, {verdict_fd}, _lemon_codec)
'''


# read once, at import: a file edited (or replaced by an upgrade) while scoring runs cannot skew it
CODEC_SOURCE = "from typing import Any\n\n" + inspect.getsource(encode_value) + "\n" + inspect.getsource(decode_value)


SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/localtime",
                "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def _root_binds() -> list[str]:
    """Host paths the sandbox's minimal root shows (read-only): system libraries and the interpreter's
    folders, each once (a path under another listed one comes with it)."""
    interpreter = {sys.base_prefix, sys.prefix, os.path.dirname(sys.executable),
                   os.path.dirname(os.path.realpath(sys.executable))}
    paths = set(SYSTEM_PATHS) | {p for d in interpreter for p in (d, os.path.realpath(d)) if os.path.isdir(p)}
    return sorted(p for p in paths if not any(p.startswith(other + os.sep) for other in paths))


def _config(mode: str, host_dir: Path, limits: SandboxLimits, uid: int | None, fds: list[int]) -> dict:
    workdir = str(host_dir / "work")
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
    return {"mode": mode, "workdir": workdir, "root": str(host_dir / "root"), "binds": _root_binds(),
            "tmpfs_bytes": limits.tmpfs_bytes, "rlimits": rlimits, "uid": uid, "fds": fds,
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


@dataclass
class _Sandboxed:
    """One started sandbox: its launcher process and the host folder holding its work dir and output."""

    proc: subprocess.Popen
    host_dir: Path
    uid: int | None

    def stdout(self) -> str:
        return _tail(self.host_dir / "stdout")

    def stderr(self) -> str:
        return _tail(self.host_dir / "stderr")


def _start(code: str, limits: SandboxLimits, mode: str, guard: bool, fds: tuple[int, ...] = (),
           stdin: int = subprocess.DEVNULL) -> _Sandboxed:
    """Start ``code`` in a sandbox of ``mode``; ``fds`` stay open (same numbers) in the program."""
    uid = _fresh_uid() if mode == "namespaces" and os.geteuid() == 0 else None
    host_dir = Path(tempfile.mkdtemp(prefix="lemon_sbx_"))
    try:
        workdir = host_dir / "work"
        workdir.mkdir()
        (host_dir / "root").mkdir()  # where namespace modes build the program's minimal root
        (workdir / PROGRAM_NAME).write_text((PRELUDE if guard else "") + "\n" + code)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(workdir / PROGRAM_NAME, uid, uid)
        os.chmod(workdir, 0o700)
        cfg = _config(mode, host_dir, limits, uid, list(fds))
        with (host_dir / "stdout").open("wb") as out, (host_dir / "stderr").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(cfg)],
                stdin=stdin, stdout=out, stderr=err, cwd=host_dir, env=cfg["env"],
                start_new_session=True, close_fds=True, pass_fds=fds,
            )
    except BaseException:
        shutil.rmtree(host_dir, ignore_errors=True)
        raise
    return _Sandboxed(proc, host_dir, uid)


def _wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """The exit status, or None when ``timeout_s`` passed first."""
    try:
        return proc.wait(timeout=max(timeout_s, 0.0))
    except subprocess.TimeoutExpired:
        return None


def _stop(box: _Sandboxed) -> None:
    """Kill the sandbox's process group (the PID namespace dies with it) and its uid, drop its files."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(box.proc.pid, signal.SIGKILL)
    try:
        box.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        box.proc.kill()
    if box.uid is not None:
        _kill_uid(box.uid)
    shutil.rmtree(box.host_dir, ignore_errors=True)


def _reason(returncode: int | None, proven: bool, stderr: str) -> Reason:
    if returncode is None:
        return "timeout"
    if proven:
        return "passed"
    return "failed" if "AssertionError" in stderr else "error"


def run_python(code: str, limits: SandboxLimits | None = None, mode: Mode = "auto",
               guard: bool = True) -> SandboxResult:
    """Run ``code`` sandboxed; passed means exit status 0 within the time limit.

    Exit status 0 proves nothing about hostile code (``os._exit(0)``), so scoring untrusted code uses
    ``run_tests``. ``guard=False`` drops the Python prelude so tests can check the OS layers alone.
    """
    limits = limits or SandboxLimits()
    mode = _usable_mode(mode)
    start = time.monotonic()
    box = _start(code, limits, mode, guard)
    try:
        returncode = _wait(box.proc, limits.timeout_s)
        duration, stderr = time.monotonic() - start, box.stderr()
        return SandboxResult(returncode == 0, _reason(returncode, returncode == 0, stderr), returncode,
                             box.stdout(), stderr, duration, mode)
    finally:
        _stop(box)


def run_tests(solution: str, tests: str, entry_point: str, limits: SandboxLimits | None = None,
              mode: Mode = "auto", guard: bool = True) -> SandboxResult:
    """Judge ``solution`` (untrusted source defining ``entry_point``) with ``tests`` (trusted source
    defining ``check(candidate)``): passed only when the checker proves ``check`` returned normally.

    The two run in separate sandboxes joined by pipes (see the module docstring). ``stdout_tail`` is
    the solution's output; ``stderr_tail`` holds the checker's stderr, then the solution's.
    """
    limits = limits or SandboxLimits()
    mode = _usable_mode(mode)
    secret = secrets.token_hex(32).encode()
    to_solution, to_checker, verdict, secret_in = os.pipe(), os.pipe(), os.pipe(), os.pipe()
    os.write(secret_in[1], secret)
    os.close(secret_in[1])
    codec, boxes = CODEC_SOURCE, []
    start = time.monotonic()
    try:
        served = SERVE.format(entry_point=entry_point, request_fd=to_solution[0], reply_fd=to_checker[1],
                              codec=codec)
        boxes.append(_start(solution + "\n" + served, limits, mode, guard, fds=(to_solution[0], to_checker[1])))
        checked = CHECK.format(entry_point=entry_point, request_fd=to_solution[1], reply_fd=to_checker[0],
                               verdict_fd=verdict[1], codec=codec, max_bytes=MAX_MESSAGE_BYTES)
        boxes.append(_start(tests + "\n" + checked, limits, mode, guard=False,
                            fds=(to_solution[1], to_checker[0], verdict[1]), stdin=secret_in[0]))
    except BaseException:
        for box in boxes:
            _stop(box)
        os.close(verdict[0])
        raise
    finally:  # the sandboxes hold their own copies now
        for fd in (*to_solution, *to_checker, verdict[1], secret_in[0]):
            os.close(fd)
    solution_box, checker_box = boxes
    try:
        returncode = _wait(checker_box.proc, limits.timeout_s - (time.monotonic() - start))
        duration = time.monotonic() - start
        proven = returncode == 0 and hmac.compare_digest(_read_available(verdict[0]), secret)
        stderr = checker_box.stderr() + "\n--- tested program stderr ---\n" + solution_box.stderr()
        return SandboxResult(proven, _reason(returncode, proven, checker_box.stderr()), returncode,
                             solution_box.stdout(), stderr, duration, mode)
    finally:
        os.close(verdict[0])
        for box in boxes:
            _stop(box)


def _read_available(fd: int) -> bytes:
    """What is in a pipe now, without waiting for a writer that may never close it."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


# --- which mode ----------------------------------------------------------------------------------------


def _policy() -> str:
    policy = os.environ.get(POLICY_ENV, "auto").strip() or "auto"
    if policy not in POLICIES:
        raise SandboxUnavailableError(
            f"{POLICY_ENV}={policy!r} is not a sandbox policy; use one of {', '.join(POLICIES)} "
            "(unsafe-allow permits the unisolated 'basic' mode, see docs/sandbox.md)")
    return policy


@functools.cache
def _probe(mode: str) -> str:
    """Why ``mode`` cannot run a trivial program here ('' when it can); probed once per process."""
    if mode != "basic" and not sys.platform.startswith("linux"):
        return "namespaces need Linux"
    if mode == "namespaces" and os.geteuid() != 0:
        return "needs root (CAP_SYS_ADMIN)"
    result = run_python("import json; print(json.dumps([1]))", SandboxLimits(timeout_s=20), mode=mode)  # type: ignore[arg-type]
    if result.passed and result.stdout_tail.strip() == "[1]":
        return ""
    return result.stderr_tail.strip() or f"exit status {result.returncode}"


def _refusal(errors: dict[str, str]) -> SandboxUnavailableError:
    tried = "; ".join(f"{mode}: {why}" for mode, why in errors.items())
    return SandboxUnavailableError(
        "refusing to run model-written code: no safe sandbox mode works here (" + tried + "). "
        "Enable one: run the scorer as root with CAP_SYS_ADMIN (mode 'namespaces'), or allow "
        "unprivileged user namespaces (sysctl user.max_user_namespaces > 0, "
        "kernel.unprivileged_userns_clone=1 where it exists, kernel.apparmor_restrict_unprivileged_userns=0 "
        "on Ubuntu >= 23.10, and seccomp/AppArmor profiles that permit unshare(CLONE_NEWUSER) and mount, e.g. "
        "Kubernetes securityContext seccompProfile.type and appArmorProfile.type: Unconfined) "
        f"(mode 'userns'). To accept the risk anyway set {POLICY_ENV}=unsafe-allow (see docs/sandbox.md).")


@functools.cache
def _warn_unsafe(errors: str) -> None:
    """Once per process, not once per scored completion."""
    log.warning("code sandbox: UNSAFE basic mode (%s=unsafe-allow): model-written code is not contained; "
                "namespaces failed: %s", POLICY_ENV, errors)


def sandbox_mode() -> str:
    """The mode scoring will use here: 'namespaces', 'userns', or 'basic' (only with
    LEMON_SANDBOX=unsafe-allow). Raises SandboxUnavailableError, naming what to enable, when no mode fits."""
    policy = _policy()
    candidates = list(SAFE_MODES) if os.geteuid() == 0 else ["userns"]
    errors: dict[str, str] = {}
    for mode in candidates:
        errors[mode] = _probe(mode)
        if not errors[mode]:
            return mode
    if policy == "unsafe-allow":
        errors["basic"] = _probe("basic")
    if policy == "unsafe-allow" and not errors["basic"]:
        _warn_unsafe(json.dumps(errors))
        return "basic"
    raise _refusal(errors)


isolation_mode = sandbox_mode  # the old name


def _usable_mode(mode: str) -> str:
    """``mode`` resolved ('auto') and checked against the policy: 'basic' needs the explicit opt-in."""
    if mode == "auto":
        return sandbox_mode()
    if mode not in (*SAFE_MODES, "basic"):
        raise ValueError(f"sandbox mode must be auto, namespaces, userns or basic, not {mode!r}")
    if mode == "basic" and _policy() != "unsafe-allow":
        raise SandboxUnavailableError(
            f"the 'basic' sandbox mode cannot contain hostile code; set {POLICY_ENV}=unsafe-allow to use it "
            "anyway, or enable namespaces (see docs/sandbox.md)")
    return mode
