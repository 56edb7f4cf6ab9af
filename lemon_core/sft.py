"""SFT warm-up: teach the orchestrator the spec format before RL, so rollouts are mostly valid.

GRPO learns from contrasts between valid specs; a policy whose samples mostly fail to parse gets a
group of identical invalid penalties and therefore no gradient at all. So training starts with
supervised fine-tuning on valid specs:

- the baselines library (CoT, self-consistency, chain, tree, debate) at random capacity levels,
- templated variations of roles, customised duties and per-agent capacities, so the policy sees the
  whole space the counterfactual edits move in (custom vs default duty, every level, dependencies),
- plus any teacher-written specs the user supplies as JSONL: ``{"question": ..., "spec": <YAML text
  or mapping>}`` per line (checked with ``parse_spec``; a bad line is an error naming it).

The loss is the mean negative log-likelihood of the completion tokens only (the prompt is context,
not a target). ``valid_spec_rate`` samples specs and counts the fraction ``parse_spec`` accepts; the
trainer reports it before and after SFT.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from lemon_core import baselines
from lemon_core.config import SFTConfig
from lemon_core.errors import ConfigError
from lemon_core.policy import OrchestratorPolicy, SpecFormat, spec_completion
from lemon_core.pool import CapacityPool
from lemon_core.roles import BASE_ROLES
from lemon_core.rollout import Scorer, benchmark_scorer, parse_completion
from lemon_core.spec import AgentSpec, OrchestrationSpec, SpecError, renumber_agents, validate_spec
from lemon_core.spec_text import parse_spec
from lemon_core.stats import wilson_interval
from lemon_core.teachers import candidate_specs, sweep_candidates_text, sweep_report, sweep_teachers

VALID_CHECK_BATCH = 32  # samples per batch of the valid-spec check (it keeps no log-probs, so memory is small)

ROLE_NAMES: dict[str, list[str]] = {
    "planner": ["Planner", "Problem decomposer", "Step planner"],
    "solver": ["Solver", "Arithmetic solver", "Step-by-step solver", "Problem solver"],
    "verifier": ["Verifier", "Answer checker", "Calculation checker"],
    "critic": ["Critic", "Reviewer"],
    "coder": ["Coder", "Python programmer"],
    "tester": ["Tester", "Test writer"],
    "aggregator": ["Aggregator", "Majority voter", "Final answer writer"],
    "debater": ["Debater", "Advocate"],
    "summarizer": ["Summarizer"],
}

CUSTOM_DUTIES: dict[str, list[str]] = {
    "planner": [
        "List the quantities in the problem and the steps that combine them.",
        "Split the problem into two or three short steps.",
    ],
    "solver": [
        "Solve the problem step by step and state the final answer.",
        "Compute the answer carefully, showing each calculation, then state it.",
        "Follow the plan, compute each step, and give the final number.",
    ],
    "verifier": [
        "Recompute the solution and correct any arithmetic mistake.",
        "Check each step of the solution and state the correct final answer.",
    ],
    "critic": ["Find the most likely mistake in the solution and explain it."],
    "coder": ["Write a Python function that computes the answer."],
    "tester": ["Check the code against small examples and report failures."],
    "aggregator": [
        "Report the answer most of the solutions agree on.",
        "Compare the answers and give the best supported final answer.",
    ],
    "debater": ["Defend your answer or correct it after reading the others."],
    "summarizer": ["Summarise the work in two sentences with the final result."],
}


def templated_spec(pool: CapacityPool, rng: random.Random, cfg: SFTConfig) -> OrchestrationSpec:
    """A valid spec: a baseline topology with varied roles, duties and capacities."""
    levels = pool.level_names
    spec = baselines.small_topology(rng.choice(cfg.topologies), rng.choice(levels))
    agents = []
    for a in spec.agents:
        update: dict[str, Any] = {}
        if cfg.mixed_capacity:
            update["capacity"] = rng.choice(levels)
        if cfg.vary_text:
            update["role"] = rng.choice(ROLE_NAMES[a.base_role])
            update["duty"] = rng.choice(CUSTOM_DUTIES[a.base_role] + [BASE_ROLES[a.base_role]])
        agents.append(AgentSpec.model_validate({**a.model_dump(), **update}))
    return validate_spec(renumber_agents(OrchestrationSpec(agents=agents, output=spec.output)), levels)


def load_teacher(path: str | Path, pool: CapacityPool, spec_format: SpecFormat = "yaml") -> list[tuple[str, str]]:
    """(question, completion) pairs from a teacher JSONL; every spec must parse against ``pool``.

    Specs are re-rendered in ``spec_format``, so the policy learns one written form whatever the
    teacher wrote (YAML text, JSON text or a JSON object)."""
    pairs = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question, spec = row["question"], row["spec"]
            text = spec if isinstance(spec, str) else json.dumps(spec)
            parsed = parse_spec(text, pool)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(
                f'{path} line {n}: expected JSON {{"question": ..., "spec": ...}} ({e})'
            ) from None
        except SpecError as e:
            raise ValueError(f"{path} line {n}: teacher spec is invalid: {e}") from None
        pairs.append((question, spec_completion(parsed.spec, spec_format)))
    return pairs


def sft_pairs(
    questions: Sequence[str], pool: CapacityPool, cfg: SFTConfig, seed: int, spec_format: SpecFormat = "yaml"
) -> list[tuple[str, str]]:
    """One templated (question, spec completion) pair per question, plus the teacher pairs; completions
    are written in ``spec_format`` (the policy's)."""
    rng = random.Random(seed)
    pairs = [
        (q, spec_completion(templated_spec(pool, rng, cfg), spec_format))
        for q in questions
        for _ in range(cfg.pairs_per_task)
    ]
    if cfg.teacher_jsonl:
        pairs += load_teacher(cfg.teacher_jsonl, pool, spec_format)
    return pairs


def sft_loss(
    policy: OrchestratorPolicy, batch: Sequence[tuple[str, str]], pool: CapacityPool
) -> torch.Tensor:
    """Mean NLL of the completion tokens (prompt tokens are context only)."""
    prompts = [policy.prompt_ids(q, pool) for q, _ in batch]
    completions = [policy.completion_ids(c) for _, c in batch]
    lp, mask = policy.logprob_tensor(prompts, completions)
    mask = mask.to(lp.dtype)
    return -(lp * mask).sum() / mask.sum()


def sft_train(
    policy: OrchestratorPolicy,
    pairs: Sequence[tuple[str, str]],
    pool: CapacityPool,
    cfg: SFTConfig,
    seed: int = 0,
    progress: bool = False,
) -> list[float]:
    """Fine-tune ``policy.model`` in place on ``pairs``; returns the loss of each step."""
    from lemon_core.progress import progress as progress_of

    if not pairs:
        raise ValueError("SFT needs at least one (question, spec) pair; give tasks or sft.teacher_jsonl")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=cfg.lr)
    policy.model.train()
    losses = []
    order: list[int] = []
    bar = progress_of(cfg.steps, "sft", mode=None if progress else "off")
    for _ in range(cfg.steps):
        if len(order) < cfg.batch_size:
            order += rng.sample(range(len(pairs)), len(pairs))
        batch = [pairs[order.pop()] for _ in range(min(cfg.batch_size, len(pairs)))]
        loss = sft_loss(policy, batch, pool)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        bar.update(loss=losses[-1])
    bar.close()
    policy.model.eval()
    return losses


def valid_spec_rate(
    policy: OrchestratorPolicy,
    questions: Sequence[str],
    pool: CapacityPool,
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    progress: bool = False,
    desc: str = "valid-spec check",
) -> float:
    """Fraction of sampled completions that ``parse_spec`` accepts (spec found, valid, known levels).

    One progress line per sampled batch: an untrained CPU policy that never stops writes the whole budget,
    and 32 such samples take minutes."""
    from lemon_core.progress import progress as progress_of

    if not questions:
        return float("nan")
    prompts = [policy.prompt_ids(q, pool) for q in questions]
    ok = total = 0
    with progress_of(len(prompts) * samples, desc, unit="sample", mode=None if progress else "off") as bar:

        def count(batch: list[Any]) -> None:
            nonlocal ok, total
            total += len(batch)
            ok += sum(parse_completion(s.text, pool)[0] is not None for s in batch)
            bar.update(len(batch), valid=ok / total)

        # 32 rows a batch: on a CPU a decoding step of SmolLM2-135M costs 332 ms at 16 rows, 414 ms at 32
        policy.sample(prompts, samples, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                      batch_size=VALID_CHECK_BATCH, with_logprobs=False, on_batch=count)
    return ok / total


def check_token_budget(policy: OrchestratorPolicy, completions: Sequence[str], max_new_tokens: int,
                       field: str = "rollout.max_new_tokens") -> dict[str, int]:
    """Refuse a sampling budget below the 95th percentile of the SFT targets' token lengths.

    A spec cut off at the budget loses its ``output:`` line and scores the invalid penalty, so with a budget
    that half the targets exceed, GRPO learns "short is valid" instead of "good is valid". The lengths are
    measured with the orchestrator's own tokenizer (end-of-turn included). Returns the figures.
    """
    if not completions:
        return {}
    lengths = sorted(len(policy.completion_ids(c)) for c in completions)
    p95 = lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))]
    figures = {"min": lengths[0], "p95": p95, "max": lengths[-1], "n": len(lengths)}
    if max_new_tokens < p95:
        raise ConfigError(
            f"{field}={max_new_tokens} is below the 95th percentile ({p95} tokens) of the SFT target specs' "
            f"lengths with this orchestrator's tokenizer (min {lengths[0]}, max {lengths[-1]}, n={len(lengths)}): "
            f"raise {field} to at least {p95}, or teach shorter specs (sft.topologies, spec_format: json)"
        )
    return figures


# --- the warm-up step of the training flow (lemon_core/train.py) ---------------------------------
class SFTReport(BaseModel):
    """What the SFT warm-up did: the valid-spec rate before and after (with n and a 95% interval), the loss,
    the sizes, and for ``teacher: sweep`` which candidates were taught."""

    valid_rate_before: float | None
    valid_rate_after: float | None
    valid_rate_after_ci: tuple[float, float] | None = None
    valid_samples: int = 0
    loss_first: float | None
    loss_last: float | None
    pairs: int
    steps: int
    rounds: int = 1
    teacher: str = "templated"
    sweep: dict[str, Any] | None = None


def sft_valid_rate(policy: OrchestratorPolicy, questions: Sequence[str], pool: CapacityPool,
                   cfg: Any, progress: bool = False, when: str = "after SFT") -> float:
    """Valid-spec rate of ``policy`` on ``questions``, sampled as rollouts sample (before/after SFT)."""
    return valid_spec_rate(
        policy, questions, pool, samples=cfg.sft.eval_samples, max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature, seed=cfg.seed, progress=progress, desc=f"valid-spec check {when}",
    )


def teacher_pairs(policy: OrchestratorPolicy, cfg: Any, pool: CapacityPool, train_tasks: Sequence[Any],
                  scorer: Scorer, progress: bool) -> tuple[list[tuple[str, str]], dict[str, Any] | None]:
    """(question, completion) SFT pairs: templated specs, plus for ``sft.teacher: sweep`` each task's
    best-reward spec measured on the pool (``teachers.py``); returns the sweep report too. The sampling
    budget is checked against every possible target first (``check_token_budget``), before the sweep runs."""
    form = policy.spec_format  # the policy's own (a saved model's record wins over cfg's default)
    pairs = sft_pairs([t.question for t in train_tasks], pool, cfg.sft, cfg.seed, form)
    targets = [c for _, c in pairs]
    if cfg.sft.teacher == "sweep":
        targets += [spec_completion(s, form) for s in candidate_specs(pool, cfg.sft.sweep).values()]
    if cfg.rollout.check_budget:
        check_token_budget(policy, targets, cfg.rollout.max_new_tokens)
    if cfg.sft.teacher != "sweep":
        return pairs, None
    sweep = sweep_teachers(train_tasks, pool, cfg.sft.sweep, cfg.reward, scorer, cfg.seed, progress)
    by_id = {str(t.id): t for t in train_tasks}
    pairs += [(by_id[c.task_id].question, spec_completion(c.spec, form)) for c in sweep.choices]
    report = sweep_report(sweep)
    if progress:  # what the choice was made from, in the stage's log (the HTML report has it too)
        print(f"teacher sweep: taught {', '.join(report['taught'])}; measured {sweep_candidates_text(report)}",
              file=sys.stderr, flush=True)
    return pairs, report


def sft_warmup(policy: OrchestratorPolicy, cfg: Any, pool: CapacityPool, train_tasks: Sequence[Any],
               held_out_questions: Sequence[str], progress: bool = True,
               scorer: Scorer = benchmark_scorer) -> SFTReport:
    """SFT warm-up of ``policy`` in place on teacher specs for ``train_tasks``; the valid-spec rate is measured
    on held-out questions before and after (after every round when ``sft.target_valid_rate`` is set)."""
    questions = list(held_out_questions[: cfg.sft.eval_tasks])
    # without SFT the rate "before" is the only one measured, so it is measured whatever check_before says
    check_before = questions and (cfg.sft.check_before or not cfg.sft.enabled)
    before = sft_valid_rate(policy, questions, pool, cfg, progress, "before SFT") if check_before else None
    pairs, sweep = teacher_pairs(policy, cfg, pool, train_tasks, scorer, progress) if cfg.sft.enabled else ([], None)
    if cfg.sft.enabled and not pairs:
        raise ConfigError("sft: no (question, spec) pairs to learn from; set sft.pairs_per_task >= 1, "
                          "sft.teacher: sweep, or sft.teacher_jsonl (or sft.enabled: false)")
    losses: list[float] = []
    after, rounds = None, 0
    while pairs and rounds < cfg.sft.max_rounds:
        rounds += 1
        losses += sft_train(policy, pairs, pool, cfg.sft, seed=cfg.seed + rounds - 1, progress=progress)
        if questions:
            after = sft_valid_rate(policy, questions, pool, cfg, progress, f"after SFT round {rounds}")
        if cfg.sft.target_valid_rate is None or after is None or after >= cfg.sft.target_valid_rate:
            break
    if not pairs and questions:
        after = before
    n = len(questions) * cfg.sft.eval_samples
    return SFTReport(valid_rate_before=before, valid_rate_after=after, loss_first=losses[0] if losses else None,
                     valid_rate_after_ci=wilson_interval(after * n, n) if after is not None and n else None,
                     valid_samples=n, loss_last=losses[-1] if losses else None, pairs=len(pairs),
                     steps=cfg.sft.steps * rounds, rounds=rounds, teacher=cfg.sft.teacher, sweep=sweep)
