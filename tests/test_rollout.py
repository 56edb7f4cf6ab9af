"""Rollouts on the simulated pool with a scripted policy: parsing, penalties, counterfactual deltas."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from lemon_core.backends.simulated import register_examples
from lemon_core.baselines import chain, cot
from lemon_core.benchmarks import Example
from lemon_core.config import RewardConfig
from lemon_core.counterfactual import EditFamilySampler
from lemon_core.policy import Sample, spec_completion
from lemon_core.pool import load_pool
from lemon_core.rollout import (
    RolloutConfig,
    collect_rollouts,
    parse_completion,
    read_records,
    write_records,
)

POOL = load_pool("simulated")
TASKS = [
    Example(
        id=f"t/{i}",
        benchmark="multiarith",
        question=f"Ann has {i} cats and gets 2 more. How many?",
        answer=str(i + 2),
        answer_format="Answer with a number.",
    )
    for i in range(2)
]


class ScriptedPolicy:
    """Duck-typed policy: 'samples' the given texts in order, one character = one token, each of log-prob
    ``logprobs(text)`` (-0.5 per token unless given)."""

    def __init__(self, texts: Sequence[str], logprobs: Callable[[str], list[float]] | None = None) -> None:
        self.texts = list(texts)
        self.logprobs = logprobs or (lambda text: [-0.5] * len(text))

    def prompt_ids(self, question: str, pool: object) -> list[int]:
        return [ord(c) % 200 for c in question[:10]]

    def sample(self, prompts: Sequence[Sequence[int]], n: int, **_: object) -> list[list[Sample]]:
        out, k = [], 0
        for p in prompts:
            group = []
            for _ in range(n):
                text = self.texts[k % len(self.texts)]
                k += 1
                ids = [ord(c) % 200 for c in text]
                group.append(
                    Sample(
                        list(p),
                        ids,
                        text,
                        self.logprobs(text),
                        [(i, i + 1) for i in range(len(text))],
                        finished=False,
                    )
                )
            out.append(group)
        return out


def _score(answer: str, example: Example) -> float:
    return float(answer.strip() == f"The answer is {example.answer}.")


@pytest.fixture(autouse=True)
def _answers() -> None:
    register_examples(TASKS)


def test_invalid_specs_get_the_penalty_and_valid_ones_are_executed_and_scored() -> None:
    texts = [
        "no spec here",
        spec_completion(cot("small")),
        "```yaml\nagents: [\n```",
        spec_completion(cot("large")),
    ]
    cfg = RolloutConfig(group_size=4, edits_per_spec=0)
    reward_cfg = RewardConfig(invalid_penalty=-0.7, lambda_cost=1.0)
    records, stats = collect_rollouts(
        ScriptedPolicy(texts),
        TASKS,
        POOL,
        cfg,
        reward_cfg,
        EditFamilySampler(),
        step=3,
        seed=0,
        scorer=_score,
    )
    assert len(records) == 8 and [r.sample for r in records[:4]] == [0, 1, 2, 3]
    assert [r.valid for r in records] == [False, True, False, True] * 2
    for r in records:
        assert r.step == 3 and r.task_id in {"t/0", "t/1"} and r.benchmark == "multiarith"
        if not r.valid:
            assert r.reward.total == -0.7 and r.error and r.spec is None and r.agent_calls == 0
        else:
            assert r.agent_calls == 1 and r.tokens > 0 and r.cost > 0
            assert r.reward.total == pytest.approx(
                r.reward.success + r.reward.efficiency + r.reward.structure + r.reward.cost
            )
            assert r.text[slice(*r.spans["a1/capacity"])] in {"small", "large"}
    small, large = records[1], records[3]
    assert small.cost < large.cost and small.reward.cost > large.reward.cost  # lambda_cost makes large dearer
    assert stats.agent_calls == 4


def test_counterfactual_edits_fill_delta_and_reuse_the_cache() -> None:
    spec = chain("large", length=3)  # a1 -> a2 -> a3, all large
    cfg = RolloutConfig(group_size=2, edits_per_spec=2)
    sampler = EditFamilySampler()
    records, stats = collect_rollouts(
        ScriptedPolicy([spec_completion(spec)]),
        TASKS,
        POOL,
        cfg,
        RewardConfig(lambda_cost=1.0),
        sampler,
        step=1,
        seed=0,
        scorer=_score,
    )
    assert all(r.valid and len(r.edits) == 2 for r in records)
    for r in records:
        for e in r.edits:
            assert e.delta == pytest.approx(r.reward.total - e.reward)
            assert 0 <= e.span[0] < e.span[1] <= len(r.text)
            if e.family == "capacity_downgrade":
                assert r.text[e.span[0] : e.span[1]] == "large"
    assert stats.edit_agent_calls < stats.edit_full_calls  # only edited agents + descendants ran
    assert stats.cache_hits > 0
    assert any(v != 1.0 for v in sampler.mean_abs_delta.values())  # the sampler saw the deltas


def test_shards_round_trip_atomically(tmp_path: Path) -> None:
    records, _ = collect_rollouts(
        ScriptedPolicy([spec_completion(cot("small")), "junk"]),
        TASKS[:1],
        POOL,
        RolloutConfig(group_size=2, edits_per_spec=1),
        RewardConfig(),
        EditFamilySampler(),
        step=2,
        seed=0,
        scorer=_score,
    )
    uri = str(tmp_path / "rollouts" / "step-000002.jsonl")
    assert write_records(records, uri) == 2
    assert read_records(uri) == records
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step-000002.jsonl"]  # no tmp left


def test_parse_completion_never_raises_on_gibberish() -> None:
    for text in ["\x11\x12 agents:", "", "```yaml\n- - -\n```", "agents: 3\noutput: a1"]:
        parsed, error = parse_completion(text, POOL)
        assert parsed is None and error


class CountingBackend:
    """Wraps a simulated level and counts the batches it is sent."""

    def __init__(self, inner: object) -> None:
        self.inner, self.batches = inner, []
        self.greedy_uses_seed = True

    def generate(self, requests: Sequence[object]) -> list[object]:
        self.batches.append(len(requests))
        return self.inner.generate(requests)  # type: ignore[attr-defined]

    def close(self) -> None:
        pass


def test_sampled_specs_and_their_edits_run_as_one_batch_per_dag_level() -> None:
    """An edit needs only its spec, so originals and edits execute together: the `large` level gets one
    batch per DAG level of the chain (3), not one per level for the originals and again for the edits."""
    pool = load_pool("simulated")
    counting = {n: CountingBackend(pool.backend(n)) for n in pool.level_names}
    for n, b in counting.items():
        pool.set_backend(n, b)
    records, stats = collect_rollouts(
        ScriptedPolicy([spec_completion(chain("large", length=3))]), TASKS, pool,
        RolloutConfig(group_size=2, edits_per_spec=2), RewardConfig(lambda_cost=1.0), EditFamilySampler(),
        step=1, seed=0, scorer=_score,
    )
    assert all(len(r.edits) == 2 for r in records)
    assert len(counting["large"].batches) == 3
    assert stats.agent_calls == 2 * 3  # one chain per task really ran; the group's copies were shared
    assert stats.cache_hits >= 2 * 3  # the second sample of each group: every call shared, so counted as reused


class ConstantBackend:
    """Every call answers the same: an edit's early call is then the very call its original makes later."""

    greedy_uses_seed = False

    def generate(self, requests: Sequence[object]) -> list[object]:
        from lemon_core.backends.base import Completion

        return [Completion("The answer is 42.", 10, 5, 0.5) for _ in requests]

    def close(self) -> None:
        pass


def test_a_call_an_edit_runs_early_is_counted_for_its_original() -> None:
    """Dropping a2's dependency moves a3 from DAG level 2 to level 1, so in one batch the edit runs the a3
    call the original needs a level later. The call counts for the original (what the rollout executes)."""
    from lemon_core.executor import ExecutionCache, execute_specs
    from lemon_core.rollout import credit_shared_calls_to_originals
    from lemon_core.spec import OrchestrationSpec

    pool = load_pool("simulated")
    for name in pool.level_names:
        pool.set_backend(name, ConstantBackend())
    original = chain("large", length=3)
    edit = OrchestrationSpec(agents=[a.model_copy(update={"depends_on": []}) if a.id == "a2" else a
                                     for a in original.agents], output=original.output)
    traces = execute_specs([original, edit], [TASKS[0], TASKS[0]], pool, cache=ExecutionCache())
    assert [a.cached for a in traces[0].agents] == [False, False, True]  # a3 ran in the edit, one level early
    credit_shared_calls_to_originals(traces, 1)
    assert traces[0].agent_calls == 3 and traces[1].agent_calls == 1  # the edit really ran only its own a2
    assert [a.agent_id for a in traces[1].agents if not a.cached] == ["a2"]
    assert traces[0].agents[2].latency_s == 0.5 and traces[1].agents[-1].latency_s == 0.0
