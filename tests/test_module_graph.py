"""The module graph of lemon_core has no cycle, and the config is a leaf: reading a config or compiling a pipeline
loads no torch and no trainer.

Every import counts, also those inside functions and under ``if TYPE_CHECKING`` (a lazy import hides a cycle
from the interpreter, not from a reader following the code)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lemon_core"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The lemon_core modules one file imports, anywhere in it (``from a import b`` counts a.b when it is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & known


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported_modules(path, set(files)) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (each is at least one import cycle)."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        stack = list(graph[start])
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(graph[node])
        reach[start] = seen
    groups = {frozenset({v} | {w for w in reach[v] if v in reach[w]}) for v in graph if v in reach[v]}
    return [set(g) for g in groups]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_lemon_core_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "lemon_core.config.training" in graph and "lemon_core.credit" in graph  # the walk saw the package
    assert "lemon_core.config" in graph["lemon_core.update"]
    assert cycles(graph) == [], "import cycles (modules in one cycle): " + "; ".join(
        ", ".join(sorted(c)) for c in cycles(graph))


def test_config_modules_import_only_config_and_errors() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("lemon_core.config"):
            outside = {d for d in deps if not d.startswith("lemon_core.config") and d != "lemon_core.errors"}
            assert not outside, f"{name} imports {outside}: config models are leaves of the module graph"


def test_training_does_not_import_the_report() -> None:
    graph = import_graph()
    for name in ("lemon_core.train", "lemon_core.sft", "lemon_core.update", "lemon_core.rollout"):
        assert "lemon_core.report" not in graph[name], f"{name} imports the HTML report"


def test_reading_a_config_and_compiling_a_pipeline_load_no_torch(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from lemon_core.config import PipelineConfig, load_settings\n"
        "from pipelines.run import compile_pipeline\n"
        "cfg = load_settings(PipelineConfig, 'local-cpu')\n"
        f"compile_pipeline(cfg, 'train', __import__('pathlib').Path({str(tmp_path / 'train.yaml')!r}))\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m in ('lemon_core.train', 'lemon_core.update',"
        " 'lemon_core.policy', 'lemon_core.grpo'))\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY []" in out.stdout, out.stdout
    assert list(tmp_path.glob("*.yaml")), "compile_pipeline wrote no pipeline YAML"
