"""AQuA-RAT (Ling et al. 2017): algebra word problems with five options A-E.

Paper protocol: the 254-problem test split. Files ``aqua/test.json`` and ``aqua/dev.json`` are JSON
Lines despite the name; each option is a string like "A)21". Hub: ``deepmind/aqua_rat`` config ``raw``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lemon_core.benchmarks.base import ChoiceBenchmark, Example, choice_format, choice_team_format, format_options

LETTERS = "ABCDE"
_OPTION = re.compile(r"^\s*\(?([A-E])\s*\)\s*(.*)$", re.DOTALL)


def parse_options(raw: list[str]) -> dict[str, str]:
    """["A)21", "B)24", ...] -> {"A": "21", "B": "24", ...}."""
    options = {}
    for item in raw:
        m = _OPTION.match(item)
        if not m:
            raise ValueError(f"AQuA option {item!r} does not start with a letter and ')'")
        options[m.group(1)] = m.group(2).strip()
    return options


class AQuA(ChoiceBenchmark):
    name = "aqua"
    splits = ("test", "dev")
    letters = LETTERS
    answer_format = choice_format(LETTERS)
    team_answer_format = choice_team_format(LETTERS)
    hf_dataset, hf_config = "deepmind/aqua_rat", "raw"
    hf_splits = {"dev": "validation"}

    def _records(self, split: str, folder: Path) -> list[dict[str, Any]]:
        with (folder / f"{split}.json").open(encoding="utf-8") as f:
            return [{"index": i, **json.loads(line)} for i, line in enumerate(f) if line.strip()]

    def _hf_record(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        return {"index": index, **{k: row[k] for k in ("question", "options", "rationale", "correct")}}

    def _example(self, record: dict[str, Any], split: str) -> Example:
        options = parse_options(record["options"])
        return self.example(
            split, record["index"], f"{record['question'].strip()}\n\n{format_options(options)}",
            record["correct"].strip().upper(), {"options": options, "rationale": record.get("rationale", "")},
        )
