"""The six benchmarks of the LEMON paper, by name: ``get("gsm8k").load("test", limit=20)``."""

from __future__ import annotations

import os
from pathlib import Path

from lemon_core.benchmarks import base
from lemon_core.benchmarks.aqua import AQuA
from lemon_core.benchmarks.base import (
    DATA_ENV,
    Benchmark,
    DataNotFoundError,
    Example,
    is_pulled,
    pulled_datasets_dir,
)
from lemon_core.benchmarks.gsm8k import GSM8K
from lemon_core.benchmarks.humaneval import HumanEval
from lemon_core.benchmarks.mmlu import MMLU
from lemon_core.benchmarks.multiarith import MultiArith
from lemon_core.benchmarks.svamp import SVAMP

REGISTRY: dict[str, type[Benchmark]] = {
    cls.name: cls for cls in (MMLU, GSM8K, AQuA, MultiArith, SVAMP, HumanEval)
}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def find_data_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the benchmark folders: ``data_dir``, else ``$LEMON_DATA_DIR``, else the shared
    folder, else the pull cache once every benchmark is pulled. For tools and tests that want the whole tree;
    loading a benchmark goes through ``benchmark_folder``, which also falls through per benchmark."""
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        if not root.is_dir():
            raise DataNotFoundError(f"data_dir {str(root)!r} is not a folder; pass --data-dir / {DATA_ENV} "
                                    "pointing at the benchmark datasets folder")
        return root
    if os.environ.get(DATA_ENV):
        root = Path(os.environ[DATA_ENV]).expanduser()
        if not root.is_dir():
            raise DataNotFoundError(f"${DATA_ENV}={str(root)!r} is not a folder; fix it or unset it")
        return root
    shared = base.find_shared_datasets()  # through the module, so tests can stand in for it
    if shared is not None:
        return shared
    if all(is_pulled(name) for name in NAMES):  # a partial cache is no "folder holding the benchmarks"
        return pulled_datasets_dir()
    raise DataNotFoundError(
        f"benchmark data not found: ${DATA_ENV} is not set, no shared/datasets folder above {Path.cwd()} and "
        f"not every benchmark pulled into {pulled_datasets_dir()}; run `lemon data pull`, pass --data-dir "
        f"(data_dir=...) or set ${DATA_ENV} to the folder holding gsm8k/, mmlu/, ... (data_dir='hf' loads from "
        "the hub)"
    )


def get(name: str) -> Benchmark:
    """A fresh benchmark instance by name (case-insensitive); unknown names list the known ones."""
    key = name.strip().lower()
    if key not in REGISTRY:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(NAMES)}")
    return REGISTRY[key]()


__all__ = ["NAMES", "REGISTRY", "Benchmark", "DataNotFoundError", "Example", "find_data_root", "get"]
