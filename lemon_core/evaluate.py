"""The one evaluation: run specs on benchmark examples, score them, summarise honestly.

A baseline is a fixed spec; the orchestrator is a function that writes one spec per example
(``orchestrator_specs``). An orchestrator output that does not parse or validate is never replaced by
a baseline: the example scores 0, its record says why (``error``, ``orchestrator_output``) and the
summary counts it (``valid_rate``, ``invalid``). Every summary carries n and a 95% Wilson interval of
the accuracy, and ``truncated_answers``: agent answers that stopped at their level's token cap, so a
score on cut-off reasoning is visible (``looped_answers`` apart: answers the backend stopped in a repetition
loop, which no cap would have finished). An orchestrator's own call is paid too: its prompt and spec tokens
are in every record and, priced at the pool level that serves the orchestrator's base model, in the
summary's ``orchestrator_cost_usd`` (``mean_cost_usd`` counts the agent calls; their sum is the method's cost).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from lemon_core.benchmarks import Benchmark
from lemon_core.benchmarks import get as get_benchmark
from lemon_core.executor import ExecutionCache, Trace, execute_specs
from lemon_core.pool import CapacityLevel, CapacityPool
from lemon_core.progress import progress as progress_of
from lemon_core.reward import RewardConfig, compute_reward, trace_score
from lemon_core.spec import OrchestrationSpec, validate_spec
from lemon_core.stats import mean_interval, wilson_interval


@dataclass
class InvalidSpec:
    """An orchestrator output that is not an executable spec; it scores 0 and is counted."""

    error: str
    text: str
    truncated: bool  # the orchestrator hit its token budget before finishing the spec


@dataclass
class OrchestratorCalls:
    """The orchestrator's own calls in one evaluation: (prompt, completion) tokens per example, in order, and the
    pool level whose price they pay (``price_level``); None where no level serves the orchestrator's model, so
    its tokens are counted but not priced."""

    level: CapacityLevel | None = None
    tokens: list[tuple[int, int]] = field(default_factory=list)

    def record(self, i: int) -> dict[str, Any]:
        """The fields of example ``i``'s record that say what writing its spec cost."""
        prompt, completion = self.tokens[i]
        cost = self.level.cost(prompt, completion) if self.level is not None else None
        return {"orchestrator_prompt_tokens": prompt, "orchestrator_completion_tokens": completion,
                "orchestrator_cost": cost}


def price_level(pool: CapacityPool, model: str | None) -> CapacityLevel | None:
    """The cheapest pool level that serves ``model`` (the orchestrator's base model): a call of the orchestrator
    costs what a call of that level costs. On the CPU pool SmolLM2-135M is `small`; on the GPU pool no level
    serves the orchestrator's model, and None says there is no price to charge."""
    return next((lv for lv in pool.levels if model is not None and lv.model == model), None)


SpecAttempt = OrchestrationSpec | InvalidSpec
SpecSource = OrchestrationSpec | Sequence[SpecAttempt] | Callable[[Sequence[Any]], list[SpecAttempt]]
Scorer = Callable[[str, Any], float]


class EvalSummary(BaseModel):
    """Aggregate figures of one (benchmark, method) run."""

    benchmark: str
    method: str
    split: str
    n: int
    accuracy: float
    accuracy_ci_low: float = 0.0
    accuracy_ci_high: float = 1.0
    valid_rate: float = 1.0
    invalid: int = 0
    truncated_specs: int = 0
    truncated_answers: int = 0
    looped_answers: int = 0  # agent answers stopped in a repetition loop (not counted in truncated_answers)
    mean_tokens: float
    mean_cost_usd: float  # agent calls, per example
    orchestrator_tokens: float | None = None  # the orchestrator's own call (prompt + spec), per example
    orchestrator_cost_usd: float | None = None  # that call at its price level; None: not priced (price_level)
    mean_latency_s: float
    agent_calls: int
    cached_calls: int = 0  # agent calls answered from the node cache: no latency, still charged their price
    mean_reward: float | None = None  # the training reward (score, efficiency, structure, cost; own call counted)
    mean_reward_ci: tuple[float, float] | None = None  # its 95% interval (normal approximation over examples)
    sampled_k: int = 0  # orchestrators: specs sampled per problem at the rollout temperature (0: not measured)
    sampled_reward: float | None = None  # mean over problems of the k sampled specs' mean reward
    sampled_reward_ci: tuple[float, float] | None = None
    failures: int
    wall_s: float
    sandbox_mode: str | None = None


def orchestrator_specs(
    policy: Any, pool: CapacityPool, *, max_new_tokens: int, seed: int, calls: OrchestratorCalls | None = None,
) -> Callable[[Sequence[Any]], list[SpecAttempt]]:
    """The orchestrator as a spec source: one greedy spec per example, or the ``InvalidSpec`` it wrote;
    each call's tokens are appended to ``calls``."""

    def specs(batch: Sequence[Any]) -> list[SpecAttempt]:
        return write_specs(policy, batch, pool, max_new_tokens=max_new_tokens, seed=seed, calls=calls)

    return specs


def write_specs(
    policy: Any, examples: Sequence[Any], pool: CapacityPool, *, max_new_tokens: int, seed: int,
    calls: OrchestratorCalls | None = None,
) -> list[SpecAttempt]:
    """Greedy orchestrator output per example, parsed; every rank of a sharded policy must call it. The
    (prompt, completion) tokens of each call are appended to ``calls``."""

    prompts = [policy.prompt_ids(ex.question, pool) for ex in examples]
    groups = policy.sample(prompts, 1, max_new_tokens=max_new_tokens, temperature=0.0, seed=seed, with_logprobs=False)
    samples = [g[0] for g in groups]
    if calls is not None:
        calls.tokens += [(len(s.prompt_ids), len(s.completion_ids)) for s in samples]
    return [spec_attempt(s, pool) for s in samples]


def spec_attempt(sample: Any, pool: CapacityPool) -> SpecAttempt:
    """What the orchestrator wrote in one sample: its spec, or the ``InvalidSpec`` (scored 0, counted)."""
    from lemon_core.rollout import parse_completion  # the rollouts' parser; rollout.py loads the sampler

    parsed, error = parse_completion(sample.text, pool)
    if parsed is not None:
        return parsed.spec
    return InvalidSpec(error=error or "invalid spec", text=sample.text, truncated=not sample.finished)


def evaluate(
    benchmark: Benchmark | None,
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
    scorer: Scorer | None = None,
    reward_cfg: RewardConfig | None = None,
    sandbox_mode: str | None = None,
    cache: ExecutionCache | None = None,
    orchestrator_calls: OrchestratorCalls | None = None,
) -> tuple[EvalSummary, list[dict[str, Any]]]:
    """Run ``specs`` on ``examples`` and score them.

    ``specs`` is one spec for all examples, a list of one spec (or ``InvalidSpec``) per example, or a
    function mapping a batch of examples to those (the orchestrator). ``benchmark`` None scores each
    example with its own benchmark; ``scorer`` replaces benchmark scoring (tests, custom tasks);
    ``reward_cfg`` adds each example's training reward to its record. ``cache`` shares the node cache
    between evaluations (same requests, same greedy answers; a cached call is still charged its price).
    ``orchestrator_calls``: filled by the orchestrator source as it writes (``evaluate_orchestrator``), so each
    record and the summary carry what writing the spec cost.
    """
    if isinstance(specs, OrchestrationSpec):
        validate_spec(specs, pool.level_names)
    if sandbox_mode is None and any(getattr(e, "benchmark", None) == "humaneval" for e in examples):
        from lemon_core.benchmarks.sandbox import sandbox_mode as current_mode

        sandbox_mode = current_mode()  # refuses (SandboxUnavailableError) before any agent call is spent
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    cache = cache if cache is not None else ExecutionCache.for_pool(pool)
    bar = progress_of(len(examples), f"evaluate {benchmark.name if benchmark else 'tasks'}/{method}",
                      unit="example", mode=None if progress else "off")
    for lo in range(0, len(examples), batch_size):
        batch = list(examples[lo : lo + batch_size])
        batch_specs = _specs_for(specs, batch, lo)
        runnable = [i for i, s in enumerate(batch_specs) if isinstance(s, OrchestrationSpec)]
        traces = execute_specs([batch_specs[i] for i in runnable], [batch[i] for i in runnable], pool,
                               cache=cache, seed=seed)
        by_index = dict(zip(runnable, traces, strict=True))
        for i, (example, spec) in enumerate(zip(batch, batch_specs, strict=True)):
            if isinstance(spec, InvalidSpec):
                records.append(_invalid_record(example, spec, reward_cfg))
            else:
                records.append(_score_record(benchmark, example, by_index[i], pool, scorer, reward_cfg))
            if orchestrator_calls is not None:
                records[-1].update(orchestrator_calls.record(lo + i))
                charge_own_call(records[-1], reward_cfg)
        bar.update(len(batch), accuracy=sum(r["score"] for r in records) / len(records),
                   valid=sum(r["valid"] for r in records) / len(records))
    bar.close()
    summary = summarize(records, benchmark=benchmark.name if benchmark else "mixed", method=method, split=split,
                        wall_s=time.perf_counter() - start, sandbox_mode=sandbox_mode)
    if out_dir is not None:
        write_results(out_dir, records, summary)
    return summary, records


def evaluate_orchestrator(
    policy: Any, pool: CapacityPool, examples: Sequence[Any], *, max_new_tokens: int, seed: int,
    benchmark: Benchmark | None = None, method: str = "lemon", orchestrator_model: str | None = None, **kwargs: Any,
) -> tuple[EvalSummary, list[dict[str, Any]]]:
    """Evaluate a trained orchestrator: greedy spec per example, executed and scored; invalid = 0. Its own calls
    are priced at the pool level serving ``orchestrator_model`` (its base model; ``price_level``)."""
    calls = OrchestratorCalls(level=price_level(pool, orchestrator_model))
    source = orchestrator_specs(policy, pool, max_new_tokens=max_new_tokens, seed=seed, calls=calls)
    return evaluate(benchmark, examples, source, pool, method=method, seed=seed, orchestrator_calls=calls, **kwargs)


def sampled_spec_rewards(
    policy: Any, pool: CapacityPool, examples: Sequence[Any], *, k: int, temperature: float, max_new_tokens: int,
    seed: int, reward_cfg: RewardConfig, benchmark: Benchmark | None = None, orchestrator_model: str | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """Per problem, the mean training reward of ``k`` specs the orchestrator samples at ``temperature`` (the
    rollouts' own), each executed and scored like an evaluation (invalid = the invalid penalty; own call counted).

    A greedy pick shows one spec per problem; this shows the distribution the policy actually holds, which is
    what GRPO moves (an uninformed warm-up can land its greedy pick on either level by chance)."""
    calls = OrchestratorCalls(level=price_level(pool, orchestrator_model))
    prompts = [policy.prompt_ids(ex.question, pool) for ex in examples]
    groups = policy.sample(prompts, k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                           with_logprobs=False)
    attempts: list[SpecAttempt] = []
    repeated: list[Any] = []
    for example, group in zip(examples, groups, strict=True):
        for sample in group:
            calls.tokens.append((len(sample.prompt_ids), len(sample.completion_ids)))
            attempts.append(spec_attempt(sample, pool))
            repeated.append(example)
    _, records = evaluate(benchmark, repeated, attempts, pool, method=f"samples-{k}", seed=seed,
                          reward_cfg=reward_cfg, orchestrator_calls=calls, **kwargs)
    by_problem: dict[str, list[float]] = {}
    for record in records:
        by_problem.setdefault(str(record["id"]), []).append(float(record["reward"]))
    return {problem: sum(rs) / len(rs) for problem, rs in by_problem.items()}


def with_sampled_rewards(summary: EvalSummary, records: list[dict[str, Any]], per_problem: dict[str, float], k: int,
                         out_dir: Path | None = None) -> EvalSummary:
    """``summary`` with the sampled specs' mean reward (and its interval over problems); each greedy record gets
    its problem's ``sampled_reward``, rewritten to ``out_dir`` when given."""
    for record in records:
        record["sampled_reward"] = per_problem.get(str(record["id"]))
    values = [v for v in (r["sampled_reward"] for r in records) if v is not None]
    update: dict[str, Any] = {"sampled_k": k}
    if values:
        update |= {"sampled_reward": sum(values) / len(values), "sampled_reward_ci": mean_interval(values)}
    summary = summary.model_copy(update=update)
    if out_dir is not None:
        write_results(out_dir, records, summary)
    return summary


def charge_own_call(record: dict[str, Any], reward_cfg: RewardConfig | None) -> None:
    """An orchestrator's record pays for writing its spec in the training reward too: λ · its own call's cost."""
    own = record.get("orchestrator_cost")
    if reward_cfg is not None and "reward" in record and own is not None:
        record["reward"] -= reward_cfg.lambda_cost * own


def _specs_for(specs: SpecSource, batch: list[Any], lo: int) -> list[SpecAttempt]:
    if isinstance(specs, OrchestrationSpec):
        return [specs] * len(batch)
    if callable(specs):
        return list(specs(batch))
    return list(specs[lo : lo + len(batch)])


def truncated_agents(trace: Trace, pool: CapacityPool) -> int:
    """Agent answers of ``trace`` that used their level's whole token budget (cut off mid-answer)."""
    caps = {lv.name: lv.max_tokens for lv in pool.levels}
    return sum(1 for a in trace.agents
               if not a.error and not a.looped and a.completion_tokens >= caps.get(a.capacity, 1 << 30))


def looped_agents(trace: Trace) -> int:
    """Agent answers of ``trace`` that their backend stopped in an exact repetition loop (``Completion.looped``):
    stuck, not cut off, so a larger token cap would not have finished them."""
    return sum(1 for a in trace.agents if not a.error and a.looped)


def _score_record(benchmark: Benchmark | None, example: Any, trace: Trace, pool: CapacityPool,
                  scorer: Scorer | None, reward_cfg: RewardConfig | None) -> dict[str, Any]:
    if scorer is not None:
        prediction, score = None, trace_score(trace, example, scorer)
    else:
        bench = benchmark or get_benchmark(example.benchmark)
        prediction = bench.extract(trace.answer, example) if trace.ok else None
        score = float(bench.score(prediction, example)) if prediction is not None else 0.0
    record = {"id": example.id, "gold": example.answer, "prediction": prediction, "score": score, "valid": True,
              "agent_calls": trace.agent_calls, "cached_calls": sum(a.cached for a in trace.agents),
              "tokens": trace.tokens, "truncated_answers": truncated_agents(trace, pool),
              "looped_answers": looped_agents(trace), **trace.to_dict()}
    if reward_cfg is not None:
        record["reward"] = compute_reward(score, trace, reward_cfg).total
    return record


def _invalid_record(example: Any, spec: InvalidSpec, reward_cfg: RewardConfig | None) -> dict[str, Any]:
    record = {"id": example.id, "gold": example.answer, "prediction": None, "score": 0.0, "valid": False,
              "agent_calls": 0, "tokens": 0, "truncated_answers": 0, "looped_answers": 0,
              "task": example.question, "spec": None, "answer": "", "error": f"invalid_spec: {spec.error}",
              "orchestrator_output": spec.text, "truncated_spec": spec.truncated, "prompt_tokens": 0,
              "completion_tokens": 0, "cost": 0.0, "latency_s": 0.0, "agents": []}
    if reward_cfg is not None:
        record["reward"] = compute_reward(0.0, None, reward_cfg).total
    return record


def summarize(records: list[dict[str, Any]], *, benchmark: str, method: str, split: str,
              wall_s: float, sandbox_mode: str | None = None) -> EvalSummary:
    n = len(records)
    d = max(n, 1)
    correct = sum(r["score"] for r in records)
    low, high = wilson_interval(correct, n)
    invalid = sum(1 for r in records if not r.get("valid", True))
    written = [r for r in records if "orchestrator_prompt_tokens" in r]
    priced = [r["orchestrator_cost"] for r in written if r["orchestrator_cost"] is not None]
    rewards = [float(r["reward"]) for r in records if "reward" in r]
    reward_fields: dict[str, Any] = {}
    if rewards and len(rewards) == n:
        reward_fields = {"mean_reward": sum(rewards) / n, "mean_reward_ci": mean_interval(rewards)}
    return EvalSummary(
        benchmark=benchmark, method=method, split=split, n=n,
        accuracy=correct / d, accuracy_ci_low=low, accuracy_ci_high=high,
        valid_rate=(n - invalid) / d, invalid=invalid,
        truncated_specs=sum(1 for r in records if r.get("truncated_spec")),
        truncated_answers=sum(r.get("truncated_answers", 0) for r in records),
        looped_answers=sum(r.get("looped_answers", 0) for r in records),
        mean_tokens=sum(r["tokens"] for r in records) / d,
        mean_cost_usd=sum(r["cost"] for r in records) / d,
        orchestrator_tokens=(sum(r["orchestrator_prompt_tokens"] + r["orchestrator_completion_tokens"]
                                 for r in written) / d) if written else None,
        orchestrator_cost_usd=sum(priced) / d if written and len(priced) == len(written) else None,
        mean_latency_s=sum(r["latency_s"] for r in records) / d,
        agent_calls=sum(r["agent_calls"] for r in records),
        cached_calls=sum(r.get("cached_calls", 0) for r in records),
        failures=sum(1 for r in records if r["error"] and r.get("valid", True)),
        wall_s=wall_s, sandbox_mode=sandbox_mode, **reward_fields,
    )


def write_results(out_dir: Path, records: list[dict[str, Any]], summary: EvalSummary) -> None:
    from lemon_core.storage import write_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "traces.jsonl", "".join(json.dumps(r, default=str) + "\n" for r in records))
    write_atomic(out_dir / "summary.json", summary.model_dump_json(indent=2) + "\n")
