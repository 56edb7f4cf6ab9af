"""MultiArith (Roy & Roth 2015): 600 multi-step arithmetic word problems, all evaluated.

File: ``multiarith/MultiArith.json`` (the copy in kojima-takeshi188/zero_shot_cot); the single
"test" split is the whole file. Gold: ``lSolutions[0]`` (always a whole number) as "39", not "39.0".
Hub: ``ChilleD/MultiArith`` - note it splits the 600 into train/test; ``split="hf:ChilleD/MultiArith@train"``
reaches the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lemon_core.benchmarks.base import Example, NumericBenchmark
from lemon_core.benchmarks.extract import canonical_number


class MultiArith(NumericBenchmark):
    name = "multiarith"
    splits = ("test",)
    hf_dataset = "ChilleD/MultiArith"

    def _records(self, split: str, folder: Path) -> list[dict[str, Any]]:
        return json.loads((folder / "MultiArith.json").read_text(encoding="utf-8"))

    def _hf_record(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        return {"iIndex": index, "sQuestion": row["question"], "lSolutions": [float(row["final_ans"])],
                "lEquations": []}

    def _example(self, record: dict[str, Any], split: str) -> Example:
        return self.example(split, record["iIndex"], record["sQuestion"].strip(),
                            canonical_number(record["lSolutions"][0]), {"equations": record.get("lEquations", [])})
