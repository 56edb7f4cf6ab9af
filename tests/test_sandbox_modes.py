"""Sandbox modes: each usable mode contains ctypes-level attacks; the unsafe fallback is refused unless opted in.

Attacks run with ``guard=False`` (no Python prelude), which is what ctypes gives a hostile program anyway.
"No namespaces" is simulated by making the mode probe report failure for the namespace modes.
"""

from __future__ import annotations

import ast
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from lemon_core.benchmarks import DataNotFoundError, find_data_root, sandbox
from lemon_core.benchmarks.sandbox import (
    SandboxLimits,
    SandboxUnavailableError,
    run_python,
    run_tests,
    sandbox_mode,
)


def _safe_modes() -> list[str]:
    try:
        sandbox_mode()
    except SandboxUnavailableError:
        return []
    return ["namespaces", "userns"] if os.geteuid() == 0 else ["userns"]


MODES = _safe_modes()
try:
    HAVE_DATA = find_data_root() is not None
except DataNotFoundError:  # pragma: no cover - the repo is checked out next to shared/datasets
    HAVE_DATA = False  # as root both namespace flavours run here; otherwise only the user-namespace one
LIMITS = SandboxLimits(timeout_s=5)


@pytest.fixture
def no_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as a cluster pod whose seccomp profile blocks unshare would look to the probe."""
    real = sandbox._probe
    monkeypatch.setattr(sandbox, "_probe", lambda mode: "unshare failed: Operation not permitted (simulated)"
                        if mode != "basic" else real(mode))
    monkeypatch.delenv(sandbox.POLICY_ENV, raising=False)


def test_no_safe_mode_refuses_with_what_to_enable(no_namespaces: None) -> None:
    with pytest.raises(SandboxUnavailableError) as info:
        sandbox_mode()
    message = str(info.value)
    assert "LEMON_SANDBOX=unsafe-allow" in message and "user namespaces" in message and "CAP_SYS_ADMIN" in message
    assert "simulated" in message  # the probe's own error is kept, for whoever reads the log
    with pytest.raises(SandboxUnavailableError):
        run_tests("def f():\n    return 1\n", "def check(c):\n    assert c() == 1\n", "f")


def test_scoring_refuses_instead_of_scoring_zero(no_namespaces: None) -> None:
    from lemon_core.benchmarks.base import Example
    from lemon_core.benchmarks.humaneval import HumanEval

    example = Example(id="humaneval/all/0", benchmark="humaneval", question="q", answer="HumanEval/0",
                      answer_format="f", meta={"prompt": "def f():\n", "test": "def check(c):\n    assert c() == 1\n",
                                               "entry_point": "f", "canonical_solution": "    return 1\n"})
    with pytest.raises(SandboxUnavailableError, match="unsafe-allow"):
        HumanEval().score("    return 1\n", example)


def test_explicit_basic_mode_needs_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sandbox.POLICY_ENV, raising=False)
    with pytest.raises(SandboxUnavailableError, match="LEMON_SANDBOX=unsafe-allow"):
        run_python("print(1)", mode="basic")


def test_unsafe_opt_in_uses_basic_and_records_it(no_namespaces: None, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(sandbox.POLICY_ENV, "unsafe-allow")
    sandbox._warn_unsafe.cache_clear()
    with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
        assert sandbox_mode() == "basic" and sandbox_mode() == "basic"
    assert caplog.text.count("UNSAFE") == 1  # said once, loudly, not once per scored completion
    result = run_tests("def f(x):\n    return x + 1\n", "def check(c):\n    assert c(1) == 2\n", "f", LIMITS)
    assert result.passed and result.mode == "basic"


@pytest.mark.skipif(not MODES, reason="no namespace mode works here")
def test_opt_in_still_prefers_a_safe_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sandbox.POLICY_ENV, "unsafe-allow")
    assert sandbox_mode() in ("namespaces", "userns")


def test_bad_policy_names_the_variable_and_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sandbox.POLICY_ENV, "yolo")
    with pytest.raises(SandboxUnavailableError, match=r"LEMON_SANDBOX='yolo'.*auto, unsafe-allow"):
        sandbox_mode()


@pytest.mark.parametrize("legacy_remount", [False, True], ids=["mount_setattr", "per-mount-remount"])
@pytest.mark.parametrize("mode", MODES)
def test_no_write_outside_workdir_by_any_route(mode: str, legacy_remount: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A world-writable host folder shown inside the sandbox the way the interpreter's folders are: writable
    # to the uid-0 of a user namespace (and to anyone) unless every mount is read-only. Each route below
    # bypasses the prelude's open()/os.open() patches.
    host_dir = Path("/var/lib") / f"lemon-sandbox-test-{uuid.uuid4().hex}"
    real_config = sandbox._config
    monkeypatch.setattr(sandbox, "_config", lambda *a: {**real_config(*a), "legacy_remount": legacy_remount,
                                                        "binds": [*real_config(*a)["binds"], str(host_dir)]})
    host_dir.mkdir()
    host_dir.chmod(0o777)  # world-writable, so the private uid of namespaces mode is no obstacle either
    try:
        code = f"""
import ctypes, os, posix, _io
d = {str(host_dir)!r}
libc = ctypes.CDLL(None, use_errno=True)

def c_open(*args):
    fd = libc.open(*args)
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return fd

routes = {{
    "posix.open": lambda: posix.open(d + "/a", posix.O_WRONLY | posix.O_CREAT),
    "_io.open": lambda: _io.open(d + "/b", "w"),
    "_io.FileIO": lambda: _io.FileIO(d + "/c", "w"),
    "ctypes open": lambda: c_open((d + "/d").encode(), 0o101, 0o644),
}}
for name, route in routes.items():
    try:
        print(name, "->", route())
    except OSError as exc:
        print(name, "refused:", exc)
open("inside.txt", "w").write("ok")
print("inside ok")
"""
        result = run_python(code, LIMITS, mode=mode, guard=False)  # type: ignore[arg-type]
        assert result.passed and "inside ok" in result.stdout_tail, result.stderr_tail
        assert result.stdout_tail.count("Read-only file system") == 4, result.stdout_tail  # it was there to hit
        assert list(host_dir.iterdir()) == [], result.stdout_tail
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def _listener() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    return server, server.getsockname()[1]


@pytest.mark.parametrize("mode", MODES)
def test_only_a_minimal_root_is_visible(mode: str) -> None:
    # A world-readable answer key on the host (a dataset copy, a home dir, a mounted token) must not be
    # there at all: reading the expected outputs would be a reward hack that passes any verdict.
    host_dir = Path("/var/lib") / f"lemon-answers-{uuid.uuid4().hex}"
    host_dir.mkdir(mode=0o755)
    (host_dir / "key.txt").write_text("canonical solutions")
    host_dir.chmod(0o755)
    (host_dir / "key.txt").chmod(0o644)
    data = find_data_root() if HAVE_DATA else host_dir
    code = (f"import os\nprint(sorted(os.listdir('/')))\n"
            f"for p in ({str(host_dir / 'key.txt')!r}, {str(data)!r}, '/home', '/run', '/var/run', '/etc/passwd'):\n"
            "    print(p, os.path.exists(p))\n")
    try:
        result = run_python(code, LIMITS, mode=mode, guard=False)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    assert result.passed, result.stderr_tail
    lines = result.stdout_tail.splitlines()
    assert all(line.endswith(" False") for line in lines[1:]) and len(lines) == 7, lines
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "tmp", "var"}
    interpreter = {Path(p).parts[1] for p in sandbox._root_binds()}
    assert set(ast.literal_eval(lines[0])) <= allowed | interpreter, lines[0]


@pytest.mark.parametrize("mode", MODES)
def test_loopback_listener_is_unreachable(mode: str) -> None:
    server, port = _listener()
    code = f"""
import ctypes, importlib, struct, sys
sys.modules.pop("_socket", None)
_socket = importlib.import_module("_socket")
try:
    _socket.socket().connect(("127.0.0.1", {port}))
    print("connected via _socket")
except OSError as exc:
    print("_socket refused:", exc)
libc = ctypes.CDLL(None)
fd = libc.socket(2, 1, 0)
addr = struct.pack("=H", 2) + struct.pack(">H", {port}) + bytes([127, 0, 0, 1]) + bytes(8)
print("ctypes connect ->", libc.connect(fd, addr, 16))
"""
    try:
        result = run_python(code, LIMITS, mode=mode, guard=False)  # type: ignore[arg-type]
        assert "connected" not in result.stdout_tail and "connect -> -1" in result.stdout_tail, result.stdout_tail
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


@pytest.mark.parametrize("fresh_proc", [True, False], ids=["own-proc", "masked-container-proc"])
@pytest.mark.parametrize("mode", MODES)
def test_scorer_secrets_are_unreadable_through_proc(mode: str, fresh_proc: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the kernel refuses a new proc mount (a container's masked /proc, in a user namespace) the
    # launcher covers the old /proc with an empty tmpfs instead; "no_fresh_proc" takes that route here.
    real_config = sandbox._config
    monkeypatch.setattr(sandbox, "_config", lambda *a: {**real_config(*a), "no_fresh_proc": not fresh_proc})
    secret = f"hunter2-{uuid.uuid4().hex}"
    # a stand-in scorer: same uid, the secret in its initial environment and on its command line
    scorer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--api-key={secret}"],
                              env={**os.environ, "AWS_SECRET_ACCESS_KEY": secret})
    try:
        for _ in range(250):  # until it has exec'd: then the secret is there to be found
            if secret.encode() in Path(f"/proc/{scorer.pid}/environ").read_bytes():
                break
            time.sleep(0.02)
        else:
            pytest.fail("the stand-in scorer never showed its environment")
        # the probe is told what to look for, so it can report every place it finds it in a few lines
        code = f"""
import os
pids = {{os.getppid(), {scorer.pid}, {os.getpid()}, *[int(p) for p in os.listdir("/proc") if p.isdigit()]}}
read = 0
for pid in pids:
    for name in ("environ", "cmdline"):
        try:
            data = open(f"/proc/{{pid}}/{{name}}", "rb").read()
        except OSError:
            continue
        read += 1
        if {secret.encode()!r} in data:
            print("LEAK", pid, name)
print("LEAK env" if {secret!r} in str(os.environ) else "clean env", "read", read)
"""
        result = run_python(code, LIMITS, mode=mode, guard=False)  # type: ignore[arg-type]
    finally:
        scorer.kill()
        scorer.wait()
    assert result.passed and "clean env read" in result.stdout_tail, result.stderr_tail
    assert "LEAK" not in result.stdout_tail


@pytest.mark.parametrize("mode", MODES)
def test_host_processes_cannot_be_signalled(mode: str) -> None:
    # a stand-in for the scoring process: same uid as the scorer, outside the sandbox
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = (f"import ctypes, os, signal\nlibc = ctypes.CDLL(None)\n"
                f"print(libc.kill({victim.pid}, signal.SIGKILL), os.getppid(), flush=True)\n"
                "if os.getppid() > 0:\n    libc.kill(os.getppid(), signal.SIGKILL)\n")
        result = run_python(code, LIMITS, mode=mode, guard=False)  # type: ignore[arg-type]
        assert result.stdout_tail.split() == ["-1", "0"], result.stdout_tail  # no such pid; no parent in sight
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


def _processes_named(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.parametrize("mode", MODES)
def test_setsid_descendants_die_with_the_run(mode: str) -> None:
    marker = f"lemon-orphan-{uuid.uuid4().hex}"
    code = (f"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', [{marker!r}, '60'])\n    os._exit(0)\n"
            f"import time\ntime.sleep(0.5)\nprint('parent exits')\n")
    result = run_python(code, LIMITS, mode=mode, guard=False)  # type: ignore[arg-type]
    try:
        assert result.passed and "parent exits" in result.stdout_tail, result.stderr_tail
        assert _processes_named(marker) == []
    finally:
        for pid in _processes_named(marker):
            os.kill(pid, 9)


@pytest.mark.parametrize("mode", MODES)
def test_environment_holds_nothing_of_the_scorer(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_TEST_TOKEN", "s3cr3t")
    result = run_python("import os\nprint(sorted(os.environ))", LIMITS, mode=mode, guard=False)  # type: ignore[arg-type]
    assert result.passed
    assert ast.literal_eval(result.stdout_tail.strip()) == ["HOME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE", "TMPDIR"]


def _system_python_for_nobody() -> str | None:
    """An interpreter the unprivileged 'nobody' can start (the venv's may live under a 0700 /root)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return None
    for python in ("/usr/bin/python3", "/usr/local/bin/python3"):
        probe = subprocess.run(["runuser", "-u", "nobody", "--", python, "-c",
                                "import sys; assert sys.version_info >= (3, 11)"], capture_output=True)
        if probe.returncode == 0:
            return python
    return None


NOBODY_PYTHON = _system_python_for_nobody()


# A file a container runtime masks with /dev/null (Docker/containerd do it for /proc/kcore, /proc/keys,
# /proc/timer_list, ...): with such a mount under /proc the kernel refuses a new proc mount in a user namespace.
MASKABLE = next((p for p in ("/proc/kcore", "/proc/keys", "/proc/timer_list") if os.path.isfile(p)), None)


@pytest.mark.skipif(NOBODY_PYTHON is None, reason="needs root, runuser and a Python >= 3.11 'nobody' can run")
@pytest.mark.parametrize("masked_proc", [False, True], ids=["plain-host", "container-masked-proc"])
def test_unprivileged_user_gets_userns_and_cannot_write_its_own_files(masked_proc: bool) -> None:
    # The cluster's likely case: a non-root scorer, maybe in a container whose /proc is masked. Files it
    # owns would be writable to the uid-0 of its user namespace; they are not even in the sandbox's root
    # (both remount routes); host processes stay out of sight either way.
    if masked_proc and (MASKABLE is None or shutil.which("unshare") is None):
        pytest.skip("needs unshare(1) and a /proc file to mask")
    shared = Path(tempfile.mkdtemp(prefix="lemon-nobody-", dir="/var/tmp"))
    own = Path("/var/lib") / f"lemon-nobody-{uuid.uuid4().hex}"  # not under a scratch dir: visible inside
    try:
        shared.chmod(0o755)
        shutil.copy(sandbox.__file__, shared / "sandbox_copy.py")
        own.mkdir()
        shutil.chown(own, "nobody")
        script = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sbx", {str(shared / "sandbox_copy.py")!r})
sbx = importlib.util.module_from_spec(spec)
sys.modules["sbx"] = sbx
spec.loader.exec_module(sbx)
print("mode", sbx.sandbox_mode())
attack = "import posix\\nposix.close(posix.open({str(own / "x")!r}, posix.O_WRONLY | posix.O_CREAT))"
for legacy in (False, True):
    real = sbx._config
    sbx._config = lambda *a: {{**real(*a), "legacy_remount": legacy}}
    print("attack", sbx.run_python(attack, mode="userns", guard=False).stderr_tail.splitlines()[-1:])
    sbx._config = real
count = "import os\\nprint(sum(p.isdigit() for p in os.listdir('/proc')))"
print("visible processes", sbx.run_python(count, mode="userns").stdout_tail)
solved = sbx.run_tests("def f(x):\\n    return x + 1\\n", "def check(c):\\n    assert c(1) == 2\\n", "f")
faked = sbx.run_tests("import os\\nos._exit(0)\\n", "def check(c):\\n    assert c(1) == 2\\n", "f")
print("verdicts", solved.passed, faked.passed)
"""
        command = ["runuser", "-u", "nobody", "--", NOBODY_PYTHON, "-c", script]
        if masked_proc:  # a private mount namespace with the mask, as the container runtime would set it up
            command = ["unshare", "-m", "sh", "-c", f'mount --make-rprivate / && mount --bind /dev/null {MASKABLE} '
                       '&& exec "$@"', "sh", *command]
        run = subprocess.run(command, cwd=shared, capture_output=True, text=True, timeout=120)
        assert "mode userns" in run.stdout, run.stdout + run.stderr
        assert ("visible processes 0" if masked_proc else "visible processes 1") in run.stdout, run.stdout
        assert run.stdout.count("No such file or directory") == 2, run.stdout + run.stderr  # not even visible
        assert "verdicts True False" in run.stdout, run.stdout + run.stderr
        assert list(own.iterdir()) == []
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(own, ignore_errors=True)


@pytest.mark.skipif(not MODES, reason="no safe sandbox mode works here")
def test_an_interpreter_under_tmp_runs_in_the_sandbox(tmp_path: Path) -> None:
    # issue #42: the interpreter's folders were bound into the root and then hidden under the fresh /tmp
    # tmpfs, so a virtualenv under /tmp (CI, notebooks) failed every completion with "no safe sandbox
    # mode works here (namespaces: FileNotFoundError ... /tmp/.../python)"
    venv = Path(tempfile.mkdtemp(prefix="lemon-venv-", dir="/tmp"))
    venv.chmod(0o755)  # as `python -m venv /tmp/x` leaves it (mkdtemp's 0700 would shut the dropped uid out)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        shutil.copy(sandbox.__file__, venv / "sandbox_copy.py")  # standalone: this venv has no lemon
        script = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sbx", {str(venv / "sandbox_copy.py")!r})
sbx = importlib.util.module_from_spec(spec)
sys.modules["sbx"] = sbx
spec.loader.exec_module(sbx)
print("prefix", sys.prefix)
print("mode", sbx.sandbox_mode())
ran = sbx.run_python("import sys\\nprint('inside', sys.prefix)")
print("ran", ran.passed, ran.stdout_tail.strip(), ran.stderr_tail.strip()[-300:])
solved = sbx.run_tests("def f(x):\\n    return x + 1\\n", "def check(c):\\n    assert c(1) == 2\\n", "f")
print("verdict", solved.passed)
"""
        run = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True,
                             timeout=120, cwd=venv)
        assert f"prefix {venv}" in run.stdout, run.stdout + run.stderr  # really an interpreter under /tmp
        assert f"mode {MODES[0]}" in run.stdout, run.stdout + run.stderr
        assert f"ran True inside {venv}" in run.stdout, run.stdout + run.stderr
        assert "verdict True" in run.stdout, run.stdout + run.stderr
    finally:
        shutil.rmtree(venv, ignore_errors=True)
