"""GSM8K (Cobbe et al. 2021): grade-school math, gold number after "#### " (commas removed).

Paper protocol: the 1,319-problem test split. Files: ``gsm8k/test.jsonl``, ``gsm8k/train.jsonl``
from openai/grade-school-math; hub: ``openai/gsm8k`` config ``main``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lemon_core.benchmarks.base import Example, NumericBenchmark
from lemon_core.benchmarks.extract import canonical_number


def gold_from_solution(solution: str) -> str:
    """The number after the last '#### ' of a GSM8K solution, commas removed, canonical."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer has no '#### <number>' line: {solution[-80:]!r}")
    return canonical_number(solution.rsplit("####", 1)[1].strip().replace(",", ""))


class GSM8K(NumericBenchmark):
    name = "gsm8k"
    splits = ("test", "train")
    hf_dataset, hf_config = "openai/gsm8k", "main"

    def _records(self, split: str, folder: Path) -> list[dict[str, Any]]:
        path = folder / f"{split}.jsonl"
        with path.open(encoding="utf-8") as f:
            return [{"index": i, **json.loads(line)} for i, line in enumerate(f) if line.strip()]

    def _hf_record(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        return {"index": index, "question": row["question"], "answer": row["answer"]}

    def _example(self, record: dict[str, Any], split: str) -> Example:
        return self.example(split, record["index"], record["question"], gold_from_solution(record["answer"]),
                            {"solution": record["answer"]})
