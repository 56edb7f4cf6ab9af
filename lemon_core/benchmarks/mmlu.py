"""MMLU (Hendrycks et al. 2021): 57-subject multiple choice, four options A-D.

Paper protocol: the validation split, all 57 subjects (1,531 questions). Files
``mmlu/data/<split>/<subject>_<split>.csv`` with no header, columns question,A,B,C,D,answer; read
with the csv module because fields hold commas, quotes and newlines. Subjects are loaded in sorted
file-name order, rows in file order. Splits: "val", "test", "dev". Hub: ``cais/mmlu`` config ``all``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from lemon_core.benchmarks.base import ChoiceBenchmark, Example, choice_format, choice_team_format, format_options

LETTERS = "ABCD"


class MMLU(ChoiceBenchmark):
    name = "mmlu"
    splits = ("val", "test", "dev")
    default_split = "val"
    letters = LETTERS
    answer_format = choice_format(LETTERS)
    team_answer_format = choice_team_format(LETTERS)
    hf_dataset, hf_config = "cais/mmlu", "all"
    hf_splits = {"val": "validation", "test": "test", "dev": "dev"}

    def _records(self, split: str, folder: Path) -> list[dict[str, Any]]:
        files = sorted((folder / "data" / split).glob(f"*_{split}.csv"))
        if not files:
            pattern = folder / "data" / split / f"*_{split}.csv"
            raise FileNotFoundError(f"no MMLU files {pattern}; is the archive unpacked?")
        records = []
        for path in files:
            subject = path.name.removesuffix(f"_{split}.csv")
            with path.open(encoding="utf-8", newline="") as f:
                for i, row in enumerate(csv.reader(f)):
                    if len(row) != 6:
                        raise ValueError(f"{path}:{i + 1}: expected 6 CSV fields, got {len(row)}")
                    records.append({"subject": subject, "index": i, "row": row})
        return records

    def _hf_record(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        return {"subject": row["subject"], "index": index,
                "row": [row["question"], *row["choices"], LETTERS[int(row["answer"])]]}

    def _example(self, record: dict[str, Any], split: str) -> Example:
        question, *choices, answer = record["row"]
        options = dict(zip(LETTERS, (c.strip() for c in choices), strict=True))
        subject = record["subject"]
        text = (f"The following is a multiple choice question about {subject.replace('_', ' ')}.\n\n"
                f"{question.strip()}\n\n{format_options(options)}")
        return self.example(split, f"{subject}/{record['index']}", text, answer.strip().upper(),
                            {"options": options, "subject": subject})
