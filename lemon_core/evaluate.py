"""Evaluate a method (a baseline spec, a fixed spec file, or per-task specs) on a benchmark.

Writes one JSON line per example (task, spec, every agent's prompt/output/tokens/cost, prediction,
score) to ``traces.jsonl`` and the aggregate to ``summary.json``: accuracy, mean tokens, mean cost,
mean critical-path latency, failure count. Examples run in batches so the executor can batch each
DAG level across examples.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from tqdm.auto import tqdm

from lemon_core.benchmarks import Benchmark
from lemon_core.executor import ExecutionCache, Trace, execute_specs
from lemon_core.pool import CapacityPool
from lemon_core.spec import OrchestrationSpec, validate_spec

SpecSource = OrchestrationSpec | Callable[[Sequence[Any]], list[OrchestrationSpec]]


class EvalSummary(BaseModel):
    """Aggregate figures of one (benchmark, method) run."""

    benchmark: str
    method: str
    split: str
    n: int
    accuracy: float
    mean_tokens: float
    mean_cost_usd: float
    mean_latency_s: float
    agent_calls: int
    failures: int
    wall_s: float


def evaluate(
    benchmark: Benchmark,
    examples: Sequence[Any],
    specs: SpecSource,
    pool: CapacityPool,
    *,
    method: str,
    split: str = "test",
    out_dir: Path | None = None,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
) -> tuple[EvalSummary, list[dict[str, Any]]]:
    """Run ``specs`` on ``examples`` and score them. ``specs`` is one spec for all examples, or a
    function mapping a batch of examples to one spec each (the orchestrator)."""
    if isinstance(specs, OrchestrationSpec):
        validate_spec(specs, pool.level_names)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    cache = ExecutionCache()
    bar = tqdm(total=len(examples), desc=f"{benchmark.name}/{method}", unit="ex", disable=not progress)
    for lo in range(0, len(examples), batch_size):
        batch = list(examples[lo : lo + batch_size])
        batch_specs = [specs] * len(batch) if isinstance(specs, OrchestrationSpec) else specs(batch)
        traces = execute_specs(batch_specs, batch, pool, cache=cache, seed=seed)
        for example, trace in zip(batch, traces, strict=True):
            records.append(_score_record(benchmark, example, trace))
        bar.update(len(batch))
        bar.set_postfix(acc=f"{sum(r['score'] for r in records) / len(records):.2f}")
    bar.close()
    summary = summarize(records, benchmark=benchmark.name, method=method, split=split,
                        wall_s=time.perf_counter() - start)
    if out_dir is not None:
        write_results(out_dir, records, summary)
    return summary, records


def _score_record(benchmark: Benchmark, example: Any, trace: Trace) -> dict[str, Any]:
    prediction = benchmark.extract(trace.answer, example) if trace.ok else None
    score = benchmark.score(prediction, example) if prediction is not None else 0.0
    return {"id": example.id, "gold": example.answer, "prediction": prediction, "score": score,
            "agent_calls": trace.agent_calls, "tokens": trace.tokens, **trace.to_dict()}


def summarize(records: list[dict[str, Any]], *, benchmark: str, method: str, split: str,
              wall_s: float) -> EvalSummary:
    n = max(len(records), 1)
    return EvalSummary(
        benchmark=benchmark, method=method, split=split, n=len(records),
        accuracy=sum(r["score"] for r in records) / n,
        mean_tokens=sum(r["tokens"] for r in records) / n,
        mean_cost_usd=sum(r["cost"] for r in records) / n,
        mean_latency_s=sum(r["latency_s"] for r in records) / n,
        agent_calls=sum(r["agent_calls"] for r in records),
        failures=sum(1 for r in records if r["error"]),
        wall_s=wall_s,
    )


def write_results(out_dir: Path, records: list[dict[str, Any]], summary: EvalSummary) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "traces.jsonl.tmp"
    with tmp.open("w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
    tmp.replace(out_dir / "traces.jsonl")
    (out_dir / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n")
