"""SVAMP (Patel et al. 2021): 1,000 one-unknown arithmetic word problems with varied structure.

File: ``svamp/SVAMP.json`` (arkilpatel/SVAMP); the single "test" split is all 1,000.
Question = ``Body + " " + Question``; gold ``Answer`` (a float) canonical ("5", not "5.0").
Hub: ``ChilleD/SVAMP`` (split into train 700 / test 300).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lemon_core.benchmarks.base import Example, NumericBenchmark
from lemon_core.benchmarks.extract import canonical_number


class SVAMP(NumericBenchmark):
    name = "svamp"
    splits = ("test",)
    hf_dataset = "ChilleD/SVAMP"

    def _records(self, split: str, folder: Path) -> list[dict[str, Any]]:
        return json.loads((folder / "SVAMP.json").read_text(encoding="utf-8"))

    def _hf_record(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        return {"ID": row.get("ID", str(index)), "Body": row["Body"], "Question": row["Question"],
                "Answer": float(row["Answer"]), "Equation": row.get("Equation", ""),
                "Type": row.get("Type", "")}

    def _example(self, record: dict[str, Any], split: str) -> Example:
        return self.example(
            split, record["ID"], f"{record['Body'].strip()} {record['Question'].strip()}",
            canonical_number(record["Answer"]),
            {"equation": record.get("Equation", ""), "type": record.get("Type", "")},
        )
