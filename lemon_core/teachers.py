"""Teacher specs chosen by measured reward: the SFT warm-up teaches choices, not just the format.

For every training task a small sweep of candidate specs (the baseline topologies at each capacity
level, plus "cheap helpers, capable output" assignments) is executed on the real pool, all at once and
with the node cache on, and scored with the training reward. By default every task of a benchmark is
taught one candidate chosen from the *mean* rewards on that benchmark: a single draw per task rewards luck
(a cheap agent that happens to be right once), which a policy cannot learn.

Which candidate: the cheapest (by the sweep's measured cost per task) whose mean reward is within
``se_margin`` standard errors of the best mean reward: the one-standard-error rule of model selection
(Breiman et al., *Classification and Regression Trees*, 1984; Hastie, Tibshirani & Friedman, *The
Elements of Statistical Learning*, 2nd ed., sec. 7.10). On 8 tasks the best candidate's standard error is
~0.16, so a candidate one task ahead (0.125) is not measurably better, and teaching it taught the real
pool's `make run` a solver + verifier chain at twice CoT's price that then lost to CoT (6/8 vs 5/8 in the
sweep; 17 vs 20 of 30 on the test problems). ``se_margin: 0`` teaches the best mean reward.

``select: per_task`` teaches each task its own best candidate instead; a task no candidate solves is then
taught the benchmark's choice, a sensible default rather than "cheapest when hopeless". ``sweep_report`` says how
often each candidate was taught and what every candidate solved, with its 95% interval: the first thing
to read when SFT alone beats or loses to a baseline (on 8 tasks, 5/8 and 3/8 are not told apart).

The sweep costs one execution per (task, candidate) minus cache hits; ``sft.sweep.topologies`` and
``sft.sweep.max_tasks`` bound it.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from lemon_core import baselines
from lemon_core.config import SWEEP_TOPOLOGIES, SweepConfig
from lemon_core.executor import ExecutionCache, execute_specs
from lemon_core.pool import CapacityPool
from lemon_core.reward import RewardConfig, compute_reward, trace_score
from lemon_core.spec import AgentSpec, OrchestrationSpec, renumber_agents, validate_spec
from lemon_core.stats import standard_error, wilson_interval


class TeacherChoice(BaseModel):
    """The teacher spec of one task and what the sweep measured for it."""

    task_id: str
    spec: OrchestrationSpec
    candidate: str
    reward: float
    score: float
    fallback: bool  # no candidate solved the task: the best-on-average candidate is taught


class CandidateResult(BaseModel):
    """One candidate over the swept tasks of one benchmark: what it solved and its mean training reward."""

    benchmark: str
    candidate: str
    solved: float  # sum of scores (tasks solved, for 0/1 scores)
    n: int
    mean_reward: float
    reward_se: float  # standard error of the mean reward over the n tasks
    mean_cost: float  # USD per task at the pool's prices


class SweepResult(BaseModel):
    """The teacher choices and every candidate's measured figures (what the choices were made from)."""

    choices: list[TeacherChoice]
    candidates: list[CandidateResult]  # per benchmark, best mean reward first


def _cheap_helpers(spec: OrchestrationSpec, cheap: str, capable: str) -> OrchestrationSpec:
    agents = [AgentSpec.model_validate({**a.model_dump(), "capacity": capable if a.id == spec.output else cheap})
              for a in spec.agents]
    return OrchestrationSpec(agents=agents, output=spec.output)


def candidate_specs(pool: CapacityPool, cfg: SweepConfig) -> dict[str, OrchestrationSpec]:
    """Named candidates: ``<topology>@<level>`` for every level, and ``<topology>@cheap+<level>``."""
    levels = pool.level_names
    out: dict[str, OrchestrationSpec] = {}
    for name in cfg.topologies:
        if name not in SWEEP_TOPOLOGIES:
            raise ValueError(f"sft.sweep.topologies: unknown topology {name!r}; use some of {list(SWEEP_TOPOLOGIES)}")
        for level in levels:
            out[f"{name}@{level}"] = validate_spec(renumber_agents(baselines.small_topology(name, level)), levels)
        if cfg.helpers_cheap and name != "cot" and len(levels) > 1:
            spec = _cheap_helpers(baselines.small_topology(name, levels[-1]), levels[0], levels[-1])
            out[f"{name}@{levels[0]}+{levels[-1]}"] = validate_spec(renumber_agents(spec), levels)
    return out


def sweep_teachers(
    tasks: Sequence[Any], pool: CapacityPool, cfg: SweepConfig, reward_cfg: RewardConfig, scorer: Any,
    seed: int = 0, progress: bool = False,
) -> SweepResult:
    """Execute every candidate on every task; return each task's teacher choice (``cfg.select``) and
    every candidate's solved count and mean reward per benchmark."""
    from lemon_core.progress import progress as progress_of

    candidates = candidate_specs(pool, cfg)
    names = list(candidates)
    tasks = list(tasks[: cfg.max_tasks] if cfg.max_tasks else tasks)
    rewards: dict[str, list[tuple[float, float, float]]] = {}  # task id -> [(reward, score, cost)] per candidate
    cache = ExecutionCache.for_pool(pool)
    # counted in agent calls, not tasks: the whole sweep is often one batch that runs for many minutes
    calls = len(tasks) * sum(len(spec.agents) for spec in candidates.values())
    bar = progress_of(calls, "teacher sweep", unit="call", mode=None if progress else "off")
    for lo in range(0, len(tasks), cfg.batch_size):
        batch = tasks[lo : lo + cfg.batch_size]
        jobs = [(t, n) for t in batch for n in names]
        traces = execute_specs([candidates[n] for _, n in jobs], [t for t, _ in jobs], pool, cache=cache, seed=seed,
                               on_calls=lambda n: bar.update(n, cache_hits=cache.hits))
        for (task, _), trace in zip(jobs, traces, strict=True):
            score = trace_score(trace, task, scorer)
            reward = compute_reward(score, trace, reward_cfg).total
            rewards.setdefault(str(task.id), []).append((reward, score, trace.cost))
    bar.close()
    top_of_benchmark, measured = {}, []
    for bench in sorted({t.benchmark for t in tasks}):
        mine = [t for t in tasks if t.benchmark == bench]
        results = [candidate_result(bench, name, [rewards[str(t.id)][i] for t in mine])
                   for i, name in enumerate(names)]
        order = _best_first([r.mean_reward for r in results])
        chosen = cheapest_within_margin(results, cfg.se_margin)
        top_of_benchmark[bench] = ([chosen] + [i for i in order if i != chosen])[: cfg.teach_top]
        measured += [results[i] for i in order]
    choices = []
    for t in tasks:
        row = rewards[str(t.id)]
        default = top_of_benchmark[t.benchmark]
        own = _best_first([r for r, _, _ in row])[: cfg.teach_top]
        # per_task: a task none of whose own top candidates solved it falls back to the benchmark's choice
        fallback = row[own[0]][1] <= 0.0
        picks = default if cfg.select == "per_benchmark" or fallback else own
        choices += [TeacherChoice(task_id=str(t.id), spec=candidates[names[i]], candidate=names[i],
                                  reward=row[i][0], score=row[i][1], fallback=fallback) for i in picks]
    return SweepResult(choices=choices, candidates=measured)


def candidate_result(benchmark: str, candidate: str, runs: Sequence[tuple[float, float, float]]) -> CandidateResult:
    """One candidate's (reward, score, cost) over a benchmark's swept tasks, summarised."""
    rewards = [r for r, _, _ in runs]
    return CandidateResult(benchmark=benchmark, candidate=candidate, n=len(runs), reward_se=standard_error(rewards),
                           mean_reward=statistics.fmean(rewards), solved=sum(score for _, score, _ in runs),
                           mean_cost=statistics.fmean(cost for _, _, cost in runs))


def cheapest_within_margin(results: Sequence[CandidateResult], se_margin: float) -> int:
    """The one-standard-error rule: among the candidates whose mean reward is at least the best mean reward minus
    ``se_margin`` of the best's standard errors, the cheapest (ties: the higher mean reward, then the earlier)."""
    best = results[_best_first([r.mean_reward for r in results])[0]]
    floor = best.mean_reward - se_margin * best.reward_se
    near = [i for i, r in enumerate(results) if r.mean_reward >= floor]
    return min(near, key=lambda i: (results[i].mean_cost, -results[i].mean_reward, i))


def _best_first(rewards: Sequence[float]) -> list[int]:
    """Candidate indices, highest reward first (ties: the earlier, i.e. cheaper-listed, candidate)."""
    return sorted(range(len(rewards)), key=lambda i: -rewards[i])


def sweep_report(sweep: SweepResult) -> dict[str, Any]:
    """How often each candidate was taught, how many tasks fell back, the teachers' mean score, and every
    candidate's solved count with its 95% interval: on a few tasks two candidates' intervals overlap, and
    the report should say that the choice between them was a coin the sweep could not see."""
    choices = sweep.choices
    return {
        "tasks": len({c.task_id for c in choices}),
        "taught": dict(Counter(c.candidate for c in choices).most_common()),
        "fallback_tasks": len({c.task_id for c in choices if c.fallback}),
        "teacher_score": statistics.fmean(c.score for c in choices) if choices else 0.0,
        "candidates": [{**c.model_dump(), "accuracy": c.solved / c.n, "ci": list(wilson_interval(c.solved, c.n))}
                       for c in sweep.candidates],
    }


SWEEP_ROWS_SHOWN = 4  # the sweep's best candidates named in the report (all are in sft.json)


def sweep_candidates_text(sweep: Mapping[str, Any], most: int = SWEEP_ROWS_SHOWN) -> str:
    """The sweep's best candidates as ``name solved/n [95% CI] reward r ± se, $cost/task``, best first
    (``teachers.sweep_report``; the standard error and cost are what the one-standard-error choice used)."""
    def text(c: Mapping[str, Any]) -> str:
        se = f" ± {c['reward_se']:.3f}" if "reward_se" in c else ""
        cost = f", ${c['mean_cost']:.2e}/task" if "mean_cost" in c else ""
        interval = f"[{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]"
        return f"{c['candidate']} {c['solved']:g}/{c['n']} {interval} reward {c['mean_reward']:.3f}{se}{cost}"

    return "; ".join(text(c) for c in sweep.get("candidates", [])[:most])
