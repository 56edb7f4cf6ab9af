"""Rollouts: sample G specs per task, execute and score them, and measure K counterfactual edits each.

For one batch of tasks (``collect_rollouts``):

1. The policy samples G completions per task (one prompt template, ``policy.orchestrator_messages``).
2. Each completion is parsed with ``parse_spec(text, pool)``; field spans are kept. A completion that
   does not parse/validate is *invalid* and gets ``RewardConfig.invalid_penalty``, nothing else.
3. Per valid spec, K edits are chosen by the adaptive ``EditFamilySampler`` (an edit needs only the spec).
4. All valid specs of all tasks and all their edits are executed together (``execute_specs`` batches
   every DAG level of every spec per capacity, and sends a call shared by several specs once) and scored
   with each task's benchmark; ``compute_reward`` gives the terms. An edit shares every call upstream of
   its edited agent with its original - only the edited agent and its descendants really run, which is
   what makes r_edit a counterfactual.
   Delta = r - r_edit feeds the sampler and, later, the loss (on the edited span's tokens only).

Record format (one JSON object per line of a shard, the fields of ``RolloutRecord``)::

    step, task_id, benchmark, sample          which optimizer step / task / j-th of the G samples
    prompt_ids, completion_ids: [int]          exact token ids (completion ends with eos if finished)
    old_logprobs: [float]                      log pi_old per completion token, at ``temperature``
    offsets: [[start, end]]                    char offsets of each completion token in ``text``
    temperature: float                         the temperature the loss must use for its logprobs
    text                                       decoded completion (without the final eos)
    valid, error                               parse/validation outcome (error message if invalid)
    spec                                       the parsed spec (dict) or null
    spans: {"<agent_id>/<field>": [s, e]}      char spans of every field value in ``text``
    score, reward{success,efficiency,...}      benchmark score in [0, 1] and every reward term
    tokens, cost, agent_calls, answer          execution totals of the original spec
    edits: [{family, agent_id, span, description, reward, delta, value}]   value: what the edit wrote in the span

Token masks for the counterfactual term are built at train time from ``offsets`` and each edit's
``span`` (``credit.span_token_mask``), so records do not depend on the trainer's tokenizer being loaded.
Shards are written with one function, ``write_records``, atomically (storage: tmp name, then rename).
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, Field

from lemon_core.baselines import team_shape
from lemon_core.config import RolloutConfig
from lemon_core.counterfactual import (
    CounterfactualEdit,
    EditFamily,
    EditFamilySampler,
    counterfactual_edits,
    written_value,
)
from lemon_core.executor import ExecutionCache, Trace, execute_specs
from lemon_core.policy import OrchestratorPolicy
from lemon_core.pool import CapacityPool
from lemon_core.reward import RewardConfig, RewardTerms, compute_reward, trace_score
from lemon_core.spec import OrchestrationSpec, SpecError, spec_json_schema
from lemon_core.spec_text import ParsedSpec, parse_spec
from lemon_core.stats import mean_interval
from lemon_core.vllm_sampler import VLLMSampler

Scorer = Callable[[str, Any], float]


def attach_sampler(policy: OrchestratorPolicy, model_dir: str, cfg: RolloutConfig, pool: CapacityPool,
                   seed: int = 0, max_lora_rank: int | None = None) -> None:
    """Give ``policy`` the sampler ``cfg`` asks for; ``model_dir`` holds the policy's current weights
    (with ``max_lora_rank``: the frozen base, and the caller hands over the adapter with
    ``policy.sync_sampler``).

    Guided decoding constrains samples to the spec's JSON schema, so it only makes sense for a policy
    that writes JSON; asking for it with YAML specs is a configuration error, caught here before any
    GPU memory is taken.
    """
    if cfg.sampler == "transformers":
        policy.sampler = None
        return
    if cfg.vllm.guided_json and policy.spec_format != "json":
        raise ValueError(
            "rollout.vllm.guided_json needs spec_format: json (the schema constrains JSON output; the "
            f"policy writes {policy.spec_format}); set spec_format: json or rollout.vllm.guided_json: false"
        )
    schema = spec_json_schema(pool.level_names) if cfg.vllm.guided_json else None
    policy.sampler = VLLMSampler(model_dir, cfg.vllm, json_schema=schema, seed=seed, max_lora_rank=max_lora_rank)


class EditResult(BaseModel):
    family: str
    agent_id: str
    span: tuple[int, int]
    description: str
    reward: float
    delta: float
    # what the edit wrote in the span (e.g. "small"), if the completion with it written there reads as the edited
    # spec (counterfactual.written_value); the pairwise credit term needs it, a dropped dependency has none
    value: str | None = None


class RolloutRecord(BaseModel):
    """One sampled completion with everything the trainer needs (see the module docstring)."""

    step: int
    task_id: str
    benchmark: str
    sample: int
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    offsets: list[tuple[int, int]]
    temperature: float
    text: str
    valid: bool
    truncated: bool = False  # hit max_new_tokens before a complete, valid spec (see RolloutConfig.mask_truncated)
    error: str | None = None
    spec: dict[str, Any] | None = None
    spans: dict[str, tuple[int, int]] = Field(default_factory=dict)
    score: float = 0.0
    reward: RewardTerms
    tokens: int = 0
    cost: float = 0.0
    agent_calls: int = 0
    answer: str = ""
    edits: list[EditResult] = Field(default_factory=list)


class RolloutStats(BaseModel):
    """Execution counters of one rollout batch (for metrics and bench/counterfactual.py)."""

    agent_calls: int = 0
    edit_agent_calls: int = 0
    edit_full_calls: int = 0  # what the edits would cost re-executed from scratch (no cache)
    cache_hits: int = 0  # calls served without running: from the cache, or shared with another spec of the batch


def benchmark_scorer(answer: str, example: Any) -> float:
    """Score an executed answer with the example's own benchmark (extract, then score)."""
    from lemon_core.benchmarks import get

    bench = get(example.benchmark)
    prediction = bench.extract(answer, example)
    return float(bench.score(prediction, example)) if prediction is not None else 0.0


def parse_completion(text: str, pool: CapacityPool) -> tuple[ParsedSpec | None, str | None]:
    """(parsed spec, None) or (None, why it is invalid). Never raises on model gibberish."""
    try:
        return parse_spec(text, pool), None
    except SpecError as e:
        return None, str(e)
    except yaml.YAMLError as e:  # e.g. control characters rejected before parse_spec's own checks
        return None, f"spec is not valid YAML: {e}"


def sample_records(
    policy: OrchestratorPolicy, examples: Sequence[Any], pool: CapacityPool, cfg: RolloutConfig,
    reward_cfg: RewardConfig, *, step: int, seed: int,
) -> tuple[list[RolloutRecord], list[ParsedSpec | None], list[Any]]:
    """G sampled completions per example as records (invalid until executed), their parsed specs (None:
    invalid, with the reason in ``record.error``) and the example each belongs to."""
    prompts = [policy.prompt_ids(ex.question, pool) for ex in examples]
    groups = policy.sample(
        prompts,
        cfg.group_size,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        seed=seed,
        batch_size=cfg.sample_batch_size,
    )
    records: list[RolloutRecord] = []
    parsed: list[ParsedSpec | None] = []
    owners: list[Any] = []
    for ex, group in zip(examples, groups, strict=True):
        for j, s in enumerate(group):
            rec = RolloutRecord(
                step=step,
                task_id=str(ex.id),
                benchmark=str(getattr(ex, "benchmark", "")),
                sample=j,
                prompt_ids=s.prompt_ids,
                completion_ids=s.completion_ids,
                old_logprobs=s.old_logprobs,
                offsets=s.offsets,
                temperature=cfg.temperature,
                text=s.text,
                valid=False,
                reward=compute_reward(0.0, None, reward_cfg),
            )
            p, rec.error = parse_completion(s.text, pool)
            rec.truncated = p is None and not s.finished
            if p is not None:
                rec.valid, rec.spec = True, p.spec.model_dump()
                rec.spans = {f"{a}/{f}": span for (a, f), span in p.spans.items()}
            records.append(rec)
            parsed.append(p)
            owners.append(ex)

    return records, parsed, owners


def collect_rollouts(
    policy: OrchestratorPolicy,
    examples: Sequence[Any],
    pool: CapacityPool,
    cfg: RolloutConfig,
    reward_cfg: RewardConfig,
    sampler: EditFamilySampler,
    *,
    step: int,
    seed: int,
    scorer: Scorer = benchmark_scorer,
    progress: bool = False,
) -> tuple[list[RolloutRecord], RolloutStats]:
    """Sample, execute, score and counterfactually probe G specs for each example (module docstring)."""
    from lemon_core.progress import progress as progress_of

    bar = progress_of(2, f"rollout step {step}", unit="phase", mode=None if progress else "off")
    records, parsed, owners = sample_records(policy, examples, pool, cfg, reward_cfg, step=step, seed=seed)
    bar.update(sampled=len(records), valid=sum(r.valid for r in records) / max(len(records), 1))
    stats = RolloutStats()
    cache = ExecutionCache.for_pool(pool)
    valid = [i for i, p in enumerate(parsed) if p is not None]
    edits = choose_edits(parsed, valid, pool, cfg, sampler, seed) if cfg.edits_per_spec > 0 else []
    # The sampled specs and their edits run as one batch (an edit needs only its spec, not its trace); a
    # call an edit shares with its original runs once and is counted for the original.
    traces = execute_specs(
        [parsed[i].spec for i in valid] + [e.spec for _, e in edits],  # type: ignore[union-attr]
        [owners[i] for i in valid] + [owners[i] for i, _ in edits],
        pool,
        cache=cache,
        seed=seed,
    )
    credit_shared_calls_to_originals(traces, len(valid))
    for i, trace in zip(valid, traces[: len(valid)], strict=True):
        rec = records[i]
        rec.score = trace_score(trace, owners[i], scorer)
        rec.reward = compute_reward(rec.score, trace, reward_cfg)
        rec.tokens, rec.cost, rec.agent_calls, rec.answer = (
            trace.tokens,
            trace.cost,
            trace.agent_calls,
            trace.answer,
        )
        stats.agent_calls += trace.agent_calls
    for (i, edit), trace in zip(edits, traces[len(valid) :], strict=True):
        r_edit = compute_reward(trace_score(trace, owners[i], scorer), trace, reward_cfg).total
        delta = records[i].reward.total - r_edit
        sampler.update(edit.family, delta)
        records[i].edits.append(
            EditResult(
                family=edit.family.value,
                agent_id=edit.agent_id,
                span=edit.span,
                description=edit.description,
                reward=r_edit,
                delta=delta,
                value=written_value(parsed[i], edit, pool),  # type: ignore[arg-type]
            )
        )
        stats.edit_agent_calls += trace.agent_calls
        stats.edit_full_calls += len(edit.spec.agents)
    bar.update(executed=len(valid), agent_calls=stats.agent_calls, edits=len(edits),
               edit_agent_calls=stats.edit_agent_calls)
    bar.close()
    stats.cache_hits = sum(a.cached for t in traces for a in t.agents)
    return records, stats


def credit_shared_calls_to_originals(traces: list[Trace], n_originals: int) -> None:
    """Count each call shared by an original spec and an edit as the original's (``agent_calls``).

    In one batch the first spec to need a call runs it and the others get it ``cached``. Originals come
    first, but an edit that drops a dependency moves its agent's descendants to an earlier DAG level, so
    the edit can run a call its original needs later. Such a call is moved to the original here: the
    original is what the rollout really executes, an edit is only its counterfactual. Costs and rewards
    do not change (a cached call is charged its price); ``agent_calls``, ``edit_agent_calls`` and latency do.
    Calls are matched by ``AgentTrace.call``, the node cache's own key.
    """
    ran_by_edit = {a.call: a for t in traces[n_originals:] for a in t.agents
                   if a.call and not a.cached and a.error is None}
    for trace in traces[:n_originals]:
        for a in trace.agents:
            runner = ran_by_edit.pop(a.call, None) if a.cached and a.call else None
            if runner is not None:
                a.cached, a.latency_s, runner.cached, runner.latency_s = False, runner.latency_s, True, 0.0


def choose_edits(
    parsed: list[ParsedSpec | None],
    valid: list[int],
    pool: CapacityPool,
    cfg: RolloutConfig,
    sampler: EditFamilySampler,
    seed: int,
) -> list[tuple[int, CounterfactualEdit]]:
    """K counterfactual edits per valid spec, as (index of its record, edit): one field changed each,
    picked by the adaptive family sampler."""
    rng = random.Random(seed)
    jobs: list[tuple[int, CounterfactualEdit]] = []
    for i in valid:
        p = parsed[i]
        assert p is not None
        candidates = counterfactual_edits(p, pool, sampler.families)
        jobs.extend((i, edit) for edit in sampler.sample(candidates, cfg.edits_per_spec, rng))
    return jobs


def rollout_metrics(records: Sequence[RolloutRecord], levels: Sequence[str]) -> dict[str, Any]:
    """The metrics row of one step's records: reward terms, valid rate, capacity mix, Δ per edit family."""
    valid = [r for r in records if r.valid]
    totals = [r.reward.total for r in records]
    low, high = mean_interval(totals)
    m: dict[str, Any] = {
        "reward/mean": statistics.fmean(totals),
        "reward/std": statistics.pstdev(totals),
        "reward/ci_low": low,  # 95% interval of the mean reward (normal approximation over the samples)
        "reward/ci_high": high,
        "valid_rate": len(valid) / len(records),
        "success_rate": statistics.fmean(r.score for r in records),  # invalid specs count as failures
        "truncated_rate": sum(r.truncated for r in records) / len(records),
    }
    for term in ("success", "efficiency", "structure", "cost", "invalid"):
        m[f"reward/{term}"] = statistics.fmean(getattr(r.reward, term) for r in records)
    if valid:
        m["score"] = statistics.fmean(r.score for r in valid)
        m["tokens_per_execution"] = statistics.fmean(r.tokens for r in valid)
        m["cost"] = statistics.fmean(r.cost for r in valid)
    specs = [r.spec for r in valid if r.spec]  # records read back without their spec have none
    if specs:
        m["agents/mean"] = statistics.fmean(len(spec["agents"]) for spec in specs)
        m.update(choice_shares(specs, levels))
    for benchmark in sorted({r.benchmark for r in records}):
        mine = [r for r in records if r.benchmark == benchmark]
        m[f"reward/{benchmark}"] = statistics.fmean(r.reward.total for r in mine)
        m.update(choice_shares([r.spec for r in mine if r.valid and r.spec], levels, prefix=f"{benchmark}/"))
    by_family: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for e in r.edits:
            by_family[e.family].append(e.delta)
    for family in EditFamily:
        if by_family[family.value]:
            m[f"delta/{family.value}"] = statistics.fmean(by_family[family.value])
            m[f"delta_abs/{family.value}"] = statistics.fmean(abs(d) for d in by_family[family.value])
            m[f"delta_count/{family.value}"] = len(by_family[family.value])
    m["completion_tokens"] = statistics.fmean(len(r.completion_ids) for r in records)
    return m


def choice_shares(specs: Sequence[dict[str, Any]], levels: Sequence[str], prefix: str = "") -> dict[str, float]:
    """What the sampled specs chose: the share of agents at each capacity level (``capacity/<prefix><level>``) and the
    share of specs of each team shape (``shape/<prefix><shape>``, ``baselines.team_shape``)."""
    if not specs:
        return {}
    agents = [a for spec in specs for a in spec["agents"]]
    shares = {f"capacity/{prefix}{level}": sum(a["capacity"] == level for a in agents) / len(agents)
              for level in levels}
    shapes = [team_shape(OrchestrationSpec.model_validate(spec)) for spec in specs]
    for shape in sorted(set(shapes)):
        shares[f"shape/{prefix}{shape}"] = shapes.count(shape) / len(shapes)
    return shares


# --- shards ---------------------------------------------------------------------------------------
def write_records(records: Sequence[RolloutRecord], uri: str) -> int:
    """Write a shard atomically (``s3://`` or local); the only place shards are written."""
    from lemon_core import storage

    return storage.write_jsonl(uri, records)


def read_records(uri: str) -> list[RolloutRecord]:
    from lemon_core import storage

    return [RolloutRecord.model_validate(row) for row in storage.read_jsonl(uri)]
