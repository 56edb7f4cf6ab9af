"""HumanEval (Chen et al. 2021): 164 Python functions to complete, judged by their hidden tests.

Paper protocol: 124 held-out problems for evaluation; the other 40 are free for training. The split
is fixed and seeded: take the task numbers 0..163 in order, ``random.Random(2605).shuffle`` them, the
first 40 are "train", the remaining 124 are "test" ("all" = every problem). Within a split problems
keep file (task number) order. File: ``humaneval/HumanEval.jsonl.gz``; hub: ``openai/openai_humaneval``.

The official harness runs ``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"`` as one
program and calls exit status 0 a pass, which a completion can fake (``sys.exit(0)``, exit hooks, trace
hooks, ...). Here the completion's program (``prompt + completion``) and the tests (``prompt + test``)
run in two sandboxes and a pass needs the checker's proof that ``check`` returned (``run_tests`` in
sandbox.py, docs/sandbox.md). Calls and results cross as plain data. Two deliberate differences from
the official harness follow: a result object's own ``__eq__`` never runs in the checker (the always-equal
trick fails here), and helpers the tests use (``poly``, ``encode_cyclic``, ...) are the prompt's, not a
completion's redefinition. A completion may be just the body, or the whole function (it then
redefines the prompt's stub, so the prompt's imports and helper functions stay available).
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path
from typing import Any

from lemon_core.benchmarks.base import Benchmark, Example
from lemon_core.benchmarks.sandbox import SandboxLimits, SandboxResult, run_tests

SPLIT_SEED = 2605
N_TRAIN = 40
N_TASKS = 164
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def split_task_numbers(split: str, n_tasks: int = N_TASKS) -> list[int]:
    """Task numbers of a split, ascending (see module docstring for the permutation)."""
    numbers = list(range(n_tasks))
    random.Random(SPLIT_SEED).shuffle(numbers)
    chosen = {"train": numbers[:N_TRAIN], "test": numbers[N_TRAIN:], "all": numbers}[split]
    return sorted(chosen)


def task_number(task_id: str) -> int:
    return int(task_id.rsplit("/", 1)[1])


def extract_code(text: str | None, entry_point: str | None = None) -> str | None:
    """Code from a reply: the fenced block that defines ``entry_point`` (else the last block), else
    the raw text. An unterminated final fence (a truncated reply) still counts."""
    if not text or not text.strip():
        return None
    blocks = [b for b in _FENCE.findall(text) if b.strip()]
    if not blocks:
        return text.strip("\n")
    if entry_point:
        defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.M)]
        if defining:
            return defining[-1]
    return blocks[-1]


def build_solution(completion: str, example: Example) -> str:
    """The untrusted half: the prompt with the completion filled in (a body, or a whole function)."""
    prompt, entry_point = example.meta["prompt"], example.meta["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", completion, re.M):
        body = "\n" + completion  # a whole function: it replaces the docstring-only stub of the prompt
    else:
        lines = completion.split("\n")
        first = next((line for line in lines if line.strip()), "")
        if first and not first[0].isspace():  # a body written flush left: indent it into the function
            lines = ["    " + line if line.strip() else line for line in lines]
        body = "\n".join(lines)
    return f"{prompt}{body}\n"


def build_tests(example: Example) -> str:
    """The trusted half: the prompt (for the helpers the tests call) and the tests defining check()."""
    return f"{example.meta['prompt']}\n\n{example.meta['test']}\n"


def build_program(completion: str, example: Example) -> str:
    """The one program the official harness runs: prompt, completion, tests, then check(entry_point).
    Kept for reference and comparison; scoring uses ``build_solution`` and ``build_tests`` instead."""
    return f"{build_solution(completion, example)}\n{example.meta['test']}\n\ncheck({example.meta['entry_point']})\n"


class HumanEval(Benchmark):
    name = "humaneval"
    splits = ("test", "train", "all")
    answer_format = "Reply with the complete Python function in a ```python block."
    hf_dataset = "openai/openai_humaneval"
    hf_splits = {"train": "test", "all": "test"}  # the hub has one split; ours are cut from it

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()

    def _records(self, split: str, folder: Path) -> list[dict[str, Any]]:
        with gzip.open(folder / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return self._cut(rows, split)

    def _hf_records(self, rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
        return self._cut(rows, split)

    @staticmethod
    def _cut(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
        if len(rows) != N_TASKS:
            raise ValueError(f"HumanEval has {N_TASKS} problems; got {len(rows)} rows")
        wanted = set(split_task_numbers(split))
        chosen = [r for r in rows if task_number(r["task_id"]) in wanted]
        return sorted(chosen, key=lambda r: task_number(r["task_id"]))

    def _example(self, record: dict[str, Any], split: str) -> Example:
        question = ("Complete the following Python function so that it passes its hidden tests.\n\n"
                    f"```python\n{record['prompt']}```")
        meta = {k: record[k] for k in ("prompt", "test", "entry_point", "canonical_solution")}
        return self.example(split, task_number(record["task_id"]), question, record["task_id"], meta)

    def extract(self, text: str | None, example: Example | None = None) -> str | None:
        return extract_code(text, example.meta["entry_point"] if example is not None else None)

    def run(self, prediction: str | None, example: Example) -> SandboxResult | None:
        """Run the completion against the problem's tests; None when there is no code at all."""
        if not prediction or not prediction.strip():
            return None
        return run_tests(build_solution(prediction, example), build_tests(example), example.meta["entry_point"],
                         self.limits)

    def score(self, prediction: str | None, example: Example) -> float:
        result = self.run(prediction, example)
        return 1.0 if result is not None and result.passed else 0.0
