"""The six benchmarks of the LEMON paper, by name: ``get("gsm8k").load("test", limit=20)``."""

from __future__ import annotations

from lemon_core.benchmarks.aqua import AQuA
from lemon_core.benchmarks.base import Benchmark, DataNotFoundError, Example, find_data_root
from lemon_core.benchmarks.gsm8k import GSM8K
from lemon_core.benchmarks.humaneval import HumanEval
from lemon_core.benchmarks.mmlu import MMLU
from lemon_core.benchmarks.multiarith import MultiArith
from lemon_core.benchmarks.svamp import SVAMP

REGISTRY: dict[str, type[Benchmark]] = {
    cls.name: cls for cls in (MMLU, GSM8K, AQuA, MultiArith, SVAMP, HumanEval)
}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def get(name: str) -> Benchmark:
    """A fresh benchmark instance by name (case-insensitive); unknown names list the known ones."""
    key = name.strip().lower()
    if key not in REGISTRY:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(NAMES)}")
    return REGISTRY[key]()


__all__ = ["NAMES", "REGISTRY", "Benchmark", "DataNotFoundError", "Example", "find_data_root", "get"]
