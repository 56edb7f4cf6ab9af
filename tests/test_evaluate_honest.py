"""Honest evaluation: an orchestrator output that is not a valid spec scores 0 and is counted, never
replaced by a baseline; every summary carries n, a 95% Wilson interval, valid_rate and truncation counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from lemon_core.backends.simulated import register_examples
from lemon_core.baselines import cot
from lemon_core.benchmarks import Example, get
from lemon_core.evaluate import InvalidSpec, evaluate, evaluate_orchestrator, truncated_agents
from lemon_core.executor import execute_specs
from lemon_core.pool import load_pool
from lemon_core.prompts import spec_completion
from lemon_core.stats import mean_interval, standard_error, wilson_interval


def _examples(n: int) -> list[Example]:
    exs = [Example(id=f"multiarith/test/{i}", benchmark="multiarith", question=f"What is {i} plus {i}?",
                   answer=str(2 * i), answer_format="End with: The answer is N.") for i in range(n)]
    register_examples(exs)
    return exs


@dataclass
class _Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    old_logprobs: list[float]
    offsets: list[tuple[int, int]]
    finished: bool


class _ScriptedPolicy:
    """Writes the given texts in turn (a stand-in for the LM: what matters here is what evaluation does
    with each text)."""

    def __init__(self, outputs: list[tuple[str, bool]]) -> None:
        self.outputs = list(outputs)

    def prompt_ids(self, question: str, pool: Any) -> list[int]:
        return [1, 2, 3]

    def sample(self, prompts: list[list[int]], n: int, **kw: Any) -> list[list[_Sample]]:
        out = []
        for p in prompts:
            text, finished = self.outputs.pop(0)
            out.append([_Sample(p, [5], text, [0.0], [(0, len(text))], finished)])
        return out


def test_standard_error_and_mean_interval_by_hand() -> None:
    # [1, 0, 0, 0]: mean 0.25, sample sd sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5, s.e. 0.5 / 2 = 0.25
    assert standard_error([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert standard_error([0.7]) == 0.0 and standard_error([]) == 0.0
    assert mean_interval([1.0, 0.0, 0.0, 0.0]) == pytest.approx((0.25 - 1.96 * 0.25, 0.25 + 1.96 * 0.25))
    assert mean_interval([0.7]) == (0.7, 0.7)


def test_wilson_interval_by_hand() -> None:
    low, high = wilson_interval(75, 100)  # Wilson (1927): 0.6570 .. 0.8245
    assert (round(low, 4), round(high, 4)) == (0.657, 0.8245)
    assert wilson_interval(0, 10)[0] == 0.0 and round(wilson_interval(0, 10)[1], 4) == 0.2775
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_invalid_orchestrator_output_scores_zero_and_is_counted_not_replaced() -> None:
    pool = load_pool("simulated")
    exs = _examples(4)
    good = spec_completion(cot("small"))  # the simulated small level is ~95% right on MultiArith
    cut = "```yaml\nagents:\n  - id: a"
    outputs = [(good, True), ("I think one agent would do.", True), (good, True), (cut, False)]
    summary, records = evaluate_orchestrator(_ScriptedPolicy(outputs), pool, exs, benchmark=get("multiarith"),
                                             max_new_tokens=64, seed=0, progress=False)
    invalid = [r for r in records if not r["valid"]]
    assert [r["id"] for r in invalid] == [exs[1].id, exs[3].id]
    assert all(r["score"] == 0.0 and r["spec"] is None and r["agent_calls"] == 0 for r in invalid)
    assert invalid[0]["error"].startswith("invalid_spec") and invalid[0]["orchestrator_output"].startswith("I think")
    assert [r["truncated_spec"] for r in invalid] == [False, True]
    # nothing was substituted: the invalid examples ran no agent at all
    assert summary.n == 4 and summary.invalid == 2 and summary.valid_rate == 0.5 and summary.truncated_specs == 1
    valid_scores = [r["score"] for r in records if r["valid"]]
    assert summary.accuracy == pytest.approx(sum(valid_scores) / 4)
    assert (summary.accuracy_ci_low, summary.accuracy_ci_high) == pytest.approx(wilson_interval(sum(valid_scores), 4))


def test_a_list_of_attempts_is_scored_in_order() -> None:
    pool = load_pool("simulated")
    exs = _examples(3)
    attempts = [cot("large"), InvalidSpec("no agents", "", False), cot("large")]
    summary, records = evaluate(get("multiarith"), exs, attempts, pool, method="lemon", progress=False)
    assert [r["valid"] for r in records] == [True, False, True]
    assert summary.valid_rate == pytest.approx(2 / 3) and summary.failures == 0


def test_baseline_summary_has_interval_valid_rate_one_and_counts_truncated_answers() -> None:
    pool = load_pool("simulated")
    exs = _examples(5)
    summary, records = evaluate(get("multiarith"), exs, cot("small"), pool, method="cot", progress=False)
    assert summary.valid_rate == 1.0 and summary.invalid == 0
    assert summary.accuracy_ci_low <= summary.accuracy <= summary.accuracy_ci_high
    assert summary.truncated_answers == 0  # the simulated small level answers in 40 of its tokens
    capped = pool.model_copy(deep=True)
    capped.levels = [lv.model_copy(update={"max_tokens": 40}) for lv in capped.levels]
    trace = execute_specs([cot("small")], exs[:1], capped)[0]
    assert truncated_agents(trace, capped) == 1  # used the whole cap: counted as cut off


def test_the_orchestrators_own_call_is_counted_and_priced_at_the_level_serving_its_model() -> None:
    """Writing the spec is paid too: every record carries the orchestrator call's tokens, invalid outputs
    included, and the summary prices them at the pool level whose model is the orchestrator's base model."""
    pool = load_pool("simulated")
    small = pool.levels[0]
    exs = _examples(5)
    good = spec_completion(cot("small"))
    outputs = [(good, True), ("not a spec", True), (good, True), (good, True), (good, True)]
    summary, records = evaluate_orchestrator(_ScriptedPolicy(outputs), pool, exs, benchmark=get("multiarith"),
                                             max_new_tokens=64, seed=0, progress=False, batch_size=2,
                                             orchestrator_model=small.model)
    per_call = small.cost(3, 1)  # the scripted policy's prompt is 3 tokens, each completion 1
    assert [r["orchestrator_prompt_tokens"] for r in records] == [3] * 5
    assert [r["orchestrator_cost"] for r in records] == pytest.approx([per_call] * 5)
    assert summary.orchestrator_tokens == 4 and summary.orchestrator_cost_usd == pytest.approx(per_call)
    # the agents' cost is kept apart: the invalid example ran no agent and cost only the orchestrator's call
    assert records[1]["cost"] == 0.0 and summary.mean_cost_usd == pytest.approx(sum(r["cost"] for r in records) / 5)
    # no pool level serves the orchestrator's model: its tokens are counted, no price is made up
    unpriced, _ = evaluate_orchestrator(_ScriptedPolicy(outputs), pool, exs, benchmark=get("multiarith"),
                                        max_new_tokens=64, seed=0, progress=False, orchestrator_model="elsewhere")
    assert unpriced.orchestrator_tokens == 4 and unpriced.orchestrator_cost_usd is None
    # a baseline writes no spec: no orchestrator figures
    baseline, _ = evaluate(get("multiarith"), exs, cot("small"), pool, method="cot", progress=False)
    assert baseline.orchestrator_tokens is None and baseline.orchestrator_cost_usd is None


class _KPolicy:
    """Writes, for every prompt, the same ``k`` texts in turn (what matters is what evaluation does with them)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def prompt_ids(self, question: str, pool: Any) -> list[int]:
        return [1, 2, 3]

    def sample(self, prompts: list[list[int]], n: int, **kw: Any) -> list[list[_Sample]]:
        assert n == len(self.texts) and kw["temperature"] == 0.7 and kw["with_logprobs"] is False
        return [[_Sample(p, [5] * 7, t, [], [(0, len(t))], True) for t in self.texts] for p in prompts]


def test_sampled_spec_rewards_average_k_specs_per_problem_invalid_ones_at_the_penalty() -> None:
    from lemon_core.config import RewardConfig
    from lemon_core.evaluate import sampled_spec_rewards, with_sampled_rewards

    pool = load_pool("simulated")
    examples = _examples(3)
    good = spec_completion(cot("large"))
    reward_cfg = RewardConfig(invalid_penalty=-1.0)
    # each problem: one valid spec and one that is not a spec (-1): the mean is (r_valid - 1) / 2
    rewards = sampled_spec_rewards(_KPolicy([good, "no spec here"]), pool, examples, k=2, temperature=0.7,
                                   max_new_tokens=50, seed=0, reward_cfg=reward_cfg, progress=False)
    _, greedy = evaluate(get("multiarith"), examples, cot("large"), pool, method="cot", reward_cfg=reward_cfg,
                         progress=False)
    assert set(rewards) == {e.id for e in examples}
    for record in greedy:
        assert rewards[record["id"]] == pytest.approx((record["reward"] - 1.0) / 2)
    summary, records = evaluate(get("multiarith"), examples, cot("large"), pool, method="cot",
                                reward_cfg=reward_cfg, progress=False)
    summary = with_sampled_rewards(summary, records, rewards, 2)
    assert summary.sampled_k == 2 and summary.sampled_reward == pytest.approx(sum(rewards.values()) / 3)
    assert summary.sampled_reward_ci[0] <= summary.sampled_reward <= summary.sampled_reward_ci[1]
    assert all(r["sampled_reward"] == rewards[r["id"]] for r in records)


def test_an_orchestrators_reward_pays_for_its_own_call() -> None:
    from lemon_core.config import RewardConfig
    from lemon_core.evaluate import OrchestratorCalls, charge_own_call

    pool = load_pool("cpu")  # SmolLM2 serves `small`, so the orchestrator's call has a price
    reward_cfg = RewardConfig(lambda_cost=1000.0)

    calls = OrchestratorCalls(level=pool.level("small"), tokens=[(200, 50), (200, 50)])
    record = {"reward": 1.0, **calls.record(0)}
    charge_own_call(record, reward_cfg)
    assert record["reward"] == pytest.approx(1.0 - 1000.0 * pool.level("small").cost(200, 50))
    unpriced = {"reward": 1.0, **OrchestratorCalls(level=None, tokens=[(200, 50)]).record(0)}
    charge_own_call(unpriced, reward_cfg)
    assert unpriced["reward"] == 1.0  # no level serves the orchestrator's model: nothing to charge
