"""HumanEval verdict integrity: completions that do not solve the problem but fake a pass must score 0.

Each case is first shown to game the old verdict (the official one-program harness, exit status 0 =
pass, run here with ``run_python``), so the suite would fail against that verdict; then it must score
0 through ``HumanEval.score``, where a pass needs the checker's proof that ``check`` returned.
"""

from __future__ import annotations

import math

import pytest

from lemon_core.benchmarks import DataNotFoundError, Example, find_data_root, get
from lemon_core.benchmarks.humaneval import HumanEval, build_program
from lemon_core.benchmarks.sandbox import (
    SandboxLimits,
    SandboxUnavailableError,
    decode_value,
    encode_value,
    run_python,
    run_tests,
    sandbox_mode,
)

try:
    ANSWER_KEY = str(find_data_root() / "humaneval" / "HumanEval.jsonl.gz")  # canonical solutions inside
    HAVE_DATA = True
except DataNotFoundError:  # pragma: no cover - the repo is checked out next to shared/datasets
    ANSWER_KEY, HAVE_DATA = "", False
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="shared/datasets not found")
try:
    MODE, REFUSAL = sandbox_mode(), ""
except SandboxUnavailableError as refusal:  # it names what to enable (docs/sandbox.md)
    MODE, REFUSAL = "refused", str(refusal)
needs_sandbox = pytest.mark.skipif(bool(REFUSAL), reason=REFUSAL or "a safe sandbox mode works here")

LIMITS = SandboxLimits(timeout_s=4)
WRONG = "def truncate_number(number: float) -> float:\n    return 0.25\n"  # HumanEval/2, wrong on purpose

# name -> (task number, completion, games the exit-code verdict)
HOSTILE: dict[str, tuple[int, str, bool]] = {
    "sys.exit(0)": (2, "    import sys\n    sys.exit(0)\n", True),
    "raise SystemExit": (2, "    raise SystemExit\n", True),
    "os._exit(0)": (2, "    import os\n    os._exit(0)\n", True),
    "atexit hook": (2, WRONG + "import atexit, os\natexit.register(os._exit, 0)\n", True),
    "timer signal exits 0": (2, "    import os, signal, time\n"
                                "    signal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
                                "    signal.setitimer(signal.ITIMER_REAL, 0.05)\n    time.sleep(2)\n", True),
    "thread exits 0": (2, "    import os, threading, time\n"
                          "    threading.Thread(target=os._exit, args=(0,)).start()\n    time.sleep(2)\n", True),
    "settrace hollows out check": (2, WRONG + (
        "import sys\n"
        "def _hook(frame, event, arg):\n"
        "    check = frame.f_globals.get('check')\n"
        "    if check is not None and check.__code__.co_name == 'check':\n"
        "        check.__code__ = (lambda candidate: None).__code__\n"
        "    return _hook\n"
        "sys._getframe().f_trace = _hook\n"
        "sys.settrace(_hook)\n"), True),
    "setprofile exits on check": (2, WRONG + (
        "import os, sys\n"
        "sys.setprofile(lambda frame, event, arg: os._exit(0) if event == 'call' "
        "and frame.f_code.co_name == 'check' else None)\n"), True),
    "ctypes exit(0)": (2, "    import ctypes\n    ctypes.CDLL(None).exit(0)\n", True),
    "forged replies on every fd": (2, (
        "    import ctypes\n    libc = ctypes.CDLL(None)\n"
        "    for fd in range(3, 64):\n"
        "        for text in (b'{\"value\": {\"eval\": \"1\"}}\\n', b'passed\\n', b'0' * 64):\n"
        "            libc.write(fd, text, len(text))\n"
        "    libc._exit(0)\n"), True),
    "always-equal result": (0, (
        "    class Anything:\n        def __eq__(self, other):\n            return True\n"
        "    return Anything()\n"), True),
    "redefined test helper": (32, (
        "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 12345.0\n"), True),
    "kill everything it can": (2, "    import ctypes, os, signal\n    libc = ctypes.CDLL(None)\n"
                                   "    libc.kill(os.getppid(), signal.SIGKILL)\n"
                                   "    libc.kill(-1, signal.SIGKILL)\n    return 0.25\n", False),
    "BaseException escapes": (2, "    raise KeyboardInterrupt\n", False),
    # passes any verdict where the host's copy of the data is readable; the sandbox's root does not hold it
    "reads the answer key": (2, (
        "    import gzip, json\n"
        f"    rows = [json.loads(line) for line in gzip.open({ANSWER_KEY!r}, 'rt')]\n"
        "    row = next(r for r in rows if r['task_id'] == 'HumanEval/2')\n"
        "    scope = {}\n    exec(row['prompt'] + row['canonical_solution'], scope)\n"
        "    return scope['truncate_number'](number)\n"), False),
}


def _example(task: int) -> Example:
    return next(e for e in get("humaneval").load("all") if e.answer == f"HumanEval/{task}")


@needs_data
@needs_sandbox
@pytest.mark.parametrize("name", [n for n, (_, _, games) in HOSTILE.items() if games])
def test_case_games_the_exit_code_verdict(name: str) -> None:
    task, completion, _ = HOSTILE[name]
    assert run_python(build_program(completion, _example(task)), LIMITS).passed, name


@needs_data
@needs_sandbox
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completion_scores_zero(name: str) -> None:
    assert MODE in ("namespaces", "userns")  # kill(-1) must stay inside a namespace
    task, completion, _ = HOSTILE[name]
    he, example = HumanEval(LIMITS), _example(task)
    result = he.run(completion, example)
    assert result is not None and not result.passed and result.reason != "passed", name
    assert he.score(completion, example) == 0.0
    assert he.score(example.meta["canonical_solution"], example) == 1.0  # the problem itself is passable


@needs_sandbox
def test_pass_needs_check_to_return() -> None:
    solution = "def double(x):\n    return 2 * x\n"
    good = "def check(candidate):\n    assert candidate(3) == 6\n    assert candidate((1,)) == (1, 1)\n"
    bad = "def check(candidate):\n    assert candidate(3) == 7\n"
    assert run_tests(solution, good, "double", LIMITS).passed
    result = run_tests(solution, bad, "double", LIMITS)
    assert not result.passed and result.reason == "failed" and "AssertionError" in result.stderr_tail
    exits = "def check(candidate):\n    import os\n    os._exit(0)\n"  # a checker that exits 0 proves nothing
    assert run_tests(solution, exits, "double", LIMITS).reason == "error"


@needs_sandbox
def test_candidate_exception_and_timeout_are_not_passes() -> None:
    tests = "def check(candidate):\n    assert candidate(1) == 1\n"
    raised = run_tests("def f(x):\n    raise ValueError('boom')\n", tests, "f", LIMITS)
    assert raised.reason == "error" and "ValueError: boom" in raised.stderr_tail
    slow = run_tests("def f(x):\n    while True:\n        pass\n", tests, "f", SandboxLimits(timeout_s=1.5))
    assert slow.reason == "timeout" and not slow.passed and slow.duration_s < 4


@needs_sandbox
def test_tested_program_output_is_kept_apart_from_the_channel() -> None:
    solution = "print('hello from the program')\ndef f(x):\n    print('debug', x)\n    return x\n"
    result = run_tests(solution, "def check(candidate):\n    assert candidate(5) == 5\n", "f", LIMITS)
    assert result.passed and "debug 5" in result.stdout_tail


@needs_sandbox
def test_huge_ints_cross_whole() -> None:
    # beyond Python's default 4300-digit str limit, which both sandboxes lift for the channel
    tests = "def check(candidate):\n    assert candidate(6000) == 7 ** 6000\n"
    assert run_tests("def f(n):\n    return 7 ** n\n", tests, "f", LIMITS).passed


@needs_sandbox
def test_tests_calling_the_function_by_name_reach_the_candidate() -> None:
    # HumanEval/33's tests call sort_third by name, as the official harness allows
    stub = "def f(x):\n    return None\n"
    tests = stub + "def check(candidate):\n    assert f(2) == 4\n"
    assert run_tests("def f(x):\n    return x * 2\n", tests, "f", LIMITS).passed


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 10 ** 300, 1.5, -0.0, math.inf, "text\nwith newline", [1, [2, "x"]],
    (1, (2.5, None)), {1, 2}, frozenset({"a"}), {"k": [1], (1, 2): {3: 4}}, b"\x00\xff", 3 - 2j, [], (), {},
])
def test_plain_values_cross_unchanged(value: object) -> None:
    import json

    back = decode_value(json.loads(json.dumps(encode_value(value))))
    assert back == value and type(back) is type(value)


def test_nan_crosses_and_subclasses_lose_their_methods() -> None:
    import json

    assert math.isnan(decode_value(json.loads(json.dumps(encode_value(math.nan)))))

    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    crossed = decode_value(json.loads(json.dumps(encode_value(Liar(3)))))
    assert type(crossed) is int and crossed == 3 and crossed != 4
    with pytest.raises(TypeError, match="plain data"):
        encode_value(object())


@pytest.mark.parametrize("data", [{"eval": "1"}, {"tuple": "abc"}, {"dict": [[1]]}, {"complex": [1, 2]},
                                  {"tuple": [1], "set": [2]}])
def test_decoder_refuses_anything_but_plain_values(data: object) -> None:
    with pytest.raises(ValueError, match="not a plain value"):
        decode_value(data)
