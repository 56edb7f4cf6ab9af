"""The scripts under bench/ as modules, for tests that call their functions (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:  # scripts import their shared helpers (serve_common) as a script run would
    sys.path.append(str(BENCH))


def load_bench(script: str, name: str) -> ModuleType:
    """``bench/<script>`` imported once as module ``name`` (later calls return the same module)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / script)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[name]
