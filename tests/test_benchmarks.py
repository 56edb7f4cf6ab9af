"""Benchmark loaders against the raw files in ../shared/datasets, plus scoring of gold and wrong answers."""

from __future__ import annotations

import ast
import importlib.util
import operator
import random
import re
from pathlib import Path

import pytest

from lemon_core.benchmarks import NAMES, DataNotFoundError, Example, find_data_root, get
from lemon_core.benchmarks.base import parse_hf_split
from lemon_core.benchmarks.extract import parse_number
from lemon_core.benchmarks.humaneval import SPLIT_SEED, build_program, extract_code, split_task_numbers

try:
    DATA = find_data_root()
except DataNotFoundError:  # pragma: no cover - the repo is checked out next to shared/datasets
    DATA = None
pytestmark = pytest.mark.skipif(DATA is None, reason="shared/datasets not found")

COUNTS = [
    ("mmlu", "val", 1531), ("mmlu", "dev", 285), ("mmlu", "test", 14042),
    ("gsm8k", "test", 1319), ("gsm8k", "train", 7473),
    ("aqua", "test", 254), ("aqua", "dev", 254),
    ("multiarith", "test", 600), ("svamp", "test", 1000),
    ("humaneval", "test", 124), ("humaneval", "train", 40), ("humaneval", "all", 164),
]


@pytest.mark.parametrize(("name", "split", "count"), COUNTS)
def test_counts_and_unique_ids(name: str, split: str, count: int) -> None:
    examples = get(name).load(split)
    assert len(examples) == count
    assert len({e.id for e in examples}) == count
    assert all(e.id.startswith(f"{name}/{split}/") and e.benchmark == name for e in examples)
    assert all(e.question.strip() and e.answer_format for e in examples)


@pytest.mark.parametrize("name", NAMES)
def test_the_team_answer_format_has_no_placeholder_to_copy(name: str) -> None:
    """An output agent that reads other agents' outputs copies a placeholder ("The answer is N.") instead of
    answering (bench/answer_format.py), so each benchmark's team format names what to write, not a stand-in."""
    (example,) = get(name).load(limit=1)
    team = example.team_answer_format or example.answer_format
    assert team == (get(name).team_answer_format or get(name).answer_format)
    assert not re.search(r"\banswer is \(?[NX]\)?(?![a-z])", team), team
    if name != "humaneval":  # its format ("the complete function in a python block") has no placeholder
        assert team != example.answer_format and "The answer is" in team


def test_default_splits_follow_the_paper() -> None:
    sizes = {name: len(get(name).load()) for name in NAMES}
    paper = {"mmlu": 1531, "gsm8k": 1319, "aqua": 254, "multiarith": 600, "svamp": 1000, "humaneval": 124}
    assert sizes == paper


def test_registry_and_errors() -> None:
    assert set(NAMES) == {"mmlu", "gsm8k", "aqua", "multiarith", "svamp", "humaneval"}
    assert get("GSM8K").name == "gsm8k"
    with pytest.raises(ValueError, match="choose one of mmlu, gsm8k"):
        get("mnist")
    with pytest.raises(ValueError, match="unknown split 'validation'.*'val'"):
        get("mmlu").load("validation")
    with pytest.raises(ValueError, match="limit"):
        get("gsm8k").load(limit=-1)


def test_limit_and_seed() -> None:
    gsm = get("gsm8k")
    first = gsm.load(limit=5)
    assert [e.id for e in first] == [f"gsm8k/test/{i}" for i in range(5)]  # file order
    shuffled = gsm.load(limit=5, seed=7)
    assert [e.id for e in shuffled] == [e.id for e in gsm.load(limit=5, seed=7)]  # reproducible
    assert [e.id for e in shuffled] != [e.id for e in first]
    assert gsm.load(limit=0) == []


def test_data_dir_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert DATA is not None
    assert len(get("svamp").load(data_dir=DATA)) == 1000  # the datasets root
    assert len(get("svamp").load(data_dir=DATA / "svamp")) == 1000  # the benchmark folder itself
    monkeypatch.setenv("LEMON_DATA_DIR", str(DATA))
    monkeypatch.chdir(tmp_path)
    assert len(get("multiarith").load()) == 600
    with pytest.raises(DataNotFoundError, match="--data-dir"):
        get("gsm8k").load(data_dir=tmp_path / "missing")
    with pytest.raises(DataNotFoundError, match="no gsm8k/ folder"):
        get("gsm8k").load(data_dir=tmp_path)
    monkeypatch.setenv("LEMON_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(DataNotFoundError, match="LEMON_DATA_DIR"):
        get("gsm8k").load()


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_hub_path_without_datasets_says_what_to_do() -> None:
    with pytest.raises(ImportError, match="pip install datasets.*--data-dir"):
        get("gsm8k").load(data_dir="hf")
    with pytest.raises(ImportError, match="openai/gsm8k"):
        get("gsm8k").load("hf:openai/gsm8k")


def test_parse_hf_split() -> None:
    assert parse_hf_split("hf:openai/gsm8k:main@test", "x", None, "train") == ("openai/gsm8k", "main", "test")
    assert parse_hf_split("hf:", "cais/mmlu", "all", "validation") == ("cais/mmlu", "all", "validation")
    assert parse_hf_split("hf:me/mine@dev", "x", "c", "test") == ("me/mine", "c", "dev")


# ---- golds are well formed and score 1.0; wrong answers score 0 ------------------------------------

def test_mmlu_golds_options_and_csv_quoting() -> None:
    examples = get("mmlu").load("val")
    assert {e.answer for e in examples} == set("ABCD")
    assert all(list(e.meta["options"]) == list("ABCD") for e in examples)
    assert len({e.meta["subject"] for e in examples}) == 57
    # fields with commas and newlines survive: the csv module, not str.split, read them
    assert any("\n" in e.question.split("\n\n", 1)[1].rsplit("\n\nA) ", 1)[0] for e in examples)
    assert any("," in option for e in examples for option in e.meta["options"].values())
    first = examples[0]
    assert first.question.endswith("\n".join(f"{k}) {v}" for k, v in first.meta["options"].items()))


@pytest.mark.parametrize("name", ["mmlu", "aqua"])
def test_choice_scoring(name: str) -> None:
    bench = get(name)
    examples = bench.load()
    for e in examples:
        assert bench.grade(f"Reasoning...\nThe answer is ({e.answer}).", e) == 1.0
        wrong = next(letter for letter in e.meta["options"] if letter != e.answer)
        assert bench.grade(f"The answer is ({wrong}).", e) == 0.0
    assert bench.grade("I cannot tell.", examples[0]) == 0.0
    assert bench.score(None, examples[0]) == 0.0
    # stating the option's text instead of its letter counts (duplicate options are truly ambiguous)
    unambiguous = [e for e in examples if len(set(e.meta["options"].values())) == len(e.meta["options"])]
    hits = sum(bench.grade(f"The answer is {e.meta['options'][e.answer]}.", e) for e in unambiguous)
    assert hits == len(unambiguous)


def test_aqua_rationales_extract_to_gold() -> None:
    aqua = get("aqua")
    examples = aqua.load("test")
    assert {e.answer for e in examples} <= set("ABCDE") and all(len(e.meta["options"]) == 5 for e in examples)
    missed = [e.id for e in examples if aqua.grade(e.meta["rationale"], e) != 1.0]
    # these two rationales never state a letter (one ends "ANSWER: 3", one has no conclusion)
    assert missed == ["aqua/test/103", "aqua/test/196"]


@pytest.mark.parametrize("split", ["test", "train"])
def test_gsm8k_every_solution_extracts_to_gold(split: str) -> None:
    gsm = get("gsm8k")
    examples = gsm.load(split)
    assert all(parse_number(e.answer) is not None and "," not in e.answer for e in examples)
    assert all(gsm.grade(e.meta["solution"], e) == 1.0 for e in examples)
    with_commas = [e for e in examples if "," in e.meta["solution"].rsplit("####", 1)[1]]
    assert with_commas and all(float(e.answer) >= 1000 for e in with_commas)


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(expression: str) -> float:
    """Evaluate + - * / over numbers (the datasets' equations) without eval."""
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        raise ValueError(f"unexpected node {ast.dump(node)}")
    return walk(ast.parse(expression, mode="eval").body)


def test_multiarith_golds_match_equations_and_score() -> None:
    bench = get("multiarith")
    examples = bench.load()
    for e in examples:
        assert e.answer.lstrip("-").isdigit()  # whole numbers written without ".0"
        assert abs(_arith(e.meta["equations"][0].split("=", 1)[1]) - float(e.answer)) < 1e-6
        assert e.question == e.question.strip()
    assert examples[0].answer == "39"
    rng = random.Random(0)
    for e in rng.sample(examples, 100):
        assert bench.grade(f"So they have {e.answer} left. The answer is {e.answer}.", e) == 1.0
        assert bench.grade(f"The answer is {int(e.answer) + 1}.", e) == 0.0


def test_svamp_question_gold_and_score() -> None:
    bench = get("svamp")
    examples = bench.load()
    first = examples[0]
    assert first.question == ("Each pack of dvds costs 76 dollars. If there is a discount of 25 dollars on "
                              "each pack How much do you have to pay to buy each pack?")
    assert first.answer == "51" and first.id == "svamp/test/chal-1"
    assert not any(e.answer.endswith(".0") for e in examples)
    off = [e.id for e in examples if abs(_arith(e.meta["equation"]) - float(e.answer)) >= 1e-4]
    assert off == ["svamp/test/chal-680"]  # a slip in SVAMP itself: "( ( 4.0 - 2.0 ) + 3.0 )" with Answer 1.0
    for e in random.Random(1).sample(examples, 100):
        assert bench.grade(f"**{e.answer}**", e) == 1.0
        assert bench.grade(f"The answer is {float(e.answer) + 2}", e) == 0.0


# ---- HumanEval ------------------------------------------------------------------------------------

def test_humaneval_split_is_the_documented_permutation() -> None:
    numbers = list(range(164))
    random.Random(SPLIT_SEED).shuffle(numbers)
    assert split_task_numbers("train") == sorted(numbers[:40])
    assert split_task_numbers("test") == sorted(numbers[40:])
    he = get("humaneval")
    test, train = he.load("test"), he.load("train")
    assert not {e.answer for e in test} & {e.answer for e in train}
    assert {e.answer for e in test} | {e.answer for e in train} == {f"HumanEval/{i}" for i in range(164)}
    assert all(e.answer == f"HumanEval/{e.id.rsplit('/', 1)[1]}" for e in test)


def _humaneval(task: int) -> Example:
    return next(e for e in get("humaneval").load("all") if e.answer == f"HumanEval/{task}")


SAMPLE_TASKS = [0, 2, 10, 32, 38, 53, 100, 163]  # 10, 32, 38 have helper functions in the prompt


@pytest.mark.parametrize("task", SAMPLE_TASKS)
def test_humaneval_canonical_solution_passes(task: int) -> None:
    he, e = get("humaneval"), _humaneval(task)
    assert he.score(e.meta["canonical_solution"], e) == 1.0


def test_humaneval_reply_forms() -> None:
    he, e = get("humaneval"), _humaneval(2)  # truncate_number(number) -> number % 1.0
    full = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"
    assert he.grade(f"Here you go:\n```python\n{full}```\nThis works because...", e) == 1.0
    assert he.grade(f"```python\nimport math\n\n{full}", e) == 1.0  # unterminated fence
    assert he.grade("    return number % 1.0\n", e) == 1.0  # body only
    assert he.grade("return number % 1.0", e) == 1.0  # body written flush left
    several = f"```python\nprint('scratch')\n```\n```python\n{full}```\n```python\nx = 1\n```"
    assert he.grade(several, e) == 1.0  # the block that defines the entry point wins
    assert he.grade("```python\ndef truncate_number(number):\n    return int(number)\n```", e) == 0.0
    assert he.grade("", e) == 0.0 and he.score(None, e) == 0.0
    result = he.run("    return None\n", e)
    assert result is not None and result.reason == "failed"


def test_humaneval_program_shape() -> None:
    e = _humaneval(0)
    program = build_program("    return False\n", e)
    assert program.startswith(e.meta["prompt"]) and program.rstrip().endswith("check(has_close_elements)")
    assert e.meta["test"] in program
    assert extract_code("no fences here\n", "f") == "no fences here"
    assert extract_code(None) is None


def test_humaneval_hostile_completions_score_zero() -> None:
    from lemon_core.benchmarks.humaneval import HumanEval
    from lemon_core.benchmarks.sandbox import SandboxLimits

    he, e = HumanEval(SandboxLimits(timeout_s=2)), _humaneval(2)
    assert he.score("    while True:\n        pass\n", e) == 0.0
    assert he.score("    import os\n    os.fork()\n    return number % 1.0\n", e) == 0.0
    assert he.score("    x = bytearray(4 * 1024 ** 3)\n    return number % 1.0\n", e) == 0.0
    connect = "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n    return number % 1.0\n"
    assert he.score(connect, e) == 0.0


@pytest.mark.slow
def test_humaneval_all_canonical_solutions_pass() -> None:
    he = get("humaneval")
    failures = [e.answer for e in he.load("all") if he.score(e.meta["canonical_solution"], e) != 1.0]
    assert failures == []
