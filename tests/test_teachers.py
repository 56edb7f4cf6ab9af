"""Teacher specs by measured reward (lemon_core/teachers.py), on the simulated pool whose optimum is known:
MultiArith -> one `small` agent (cheap and ~95% right), GSM8K -> `large` (small 20%, large 85%)."""

from __future__ import annotations

from collections import Counter

from lemon_core.backends.simulated import register_examples
from lemon_core.benchmarks import Example
from lemon_core.config import RewardConfig
from lemon_core.pool import load_pool
from lemon_core.rollout import benchmark_scorer
from lemon_core.teachers import (
    CandidateResult,
    SweepConfig,
    candidate_result,
    candidate_specs,
    cheapest_within_margin,
    sweep_report,
    sweep_teachers,
)


def _tasks(benchmark: str, n: int) -> list[Example]:
    tasks = [Example(id=f"{benchmark}/train/{i}", benchmark=benchmark, question=f"{benchmark} task {i}: 3 + {i}?",
                     answer=str(3 + i), answer_format="End with: The answer is N.") for i in range(n)]
    register_examples(tasks)
    return tasks


def test_candidates_cover_every_level_and_cheap_helpers() -> None:
    pool = load_pool("simulated")
    names = set(candidate_specs(pool, SweepConfig()))
    levels = pool.level_names
    assert {f"cot@{lv}" for lv in levels} <= names and f"chain@{levels[0]}+{levels[-1]}" in names
    helpers = candidate_specs(pool, SweepConfig())[f"sc@{levels[0]}+{levels[-1]}"]
    caps = {a.id: a.capacity for a in helpers.agents}
    assert caps[helpers.output] == levels[-1] and sorted(set(caps.values())) == sorted({levels[0], levels[-1]})


def test_sweep_teaches_the_known_optimum_per_benchmark() -> None:
    pool = load_pool("simulated")
    reward = RewardConfig(lambda_cost=1.0)
    multi = sweep_teachers(_tasks("multiarith", 12), pool, SweepConfig(), reward, benchmark_scorer).choices
    best_mean = SweepConfig(se_margin=0)  # the best mean reward, however little it leads by
    gsm = sweep_teachers(_tasks("gsm8k", 12), pool, best_mean, reward, benchmark_scorer).choices
    assert Counter(c.candidate for c in multi).most_common(1)[0][0] == "cot@small"
    assert len({c.candidate for c in gsm}) == 1  # one choice per benchmark: its best mean reward
    assert all(c.spec.agents[-1].capacity == "large" for c in gsm)  # the answer comes from `large` (0.85 vs 0.20)
    assert all(c.score > 0 for c in multi if not c.fallback)
    lucky = sweep_teachers(_tasks("gsm8k", 12), pool, best_mean.model_copy(update={"select": "per_task"}), reward,
                           benchmark_scorer).choices
    assert any(c.spec.agents[-1].capacity != "large" for c in lucky)  # per task, a lucky cheap answer wins


def test_unsolvable_tasks_fall_back_to_the_best_mean_candidate() -> None:
    pool = load_pool("simulated")
    sweep = sweep_teachers(_tasks("multiarith", 4), pool, SweepConfig(topologies=["cot"]), RewardConfig(),
                           lambda answer, task: 0.0)
    assert all(c.fallback for c in sweep.choices)
    assert {c.candidate for c in sweep.choices} == {"cot@small"}  # all wrong: the fewest, cheapest tokens win
    report = sweep_report(sweep)
    assert report["fallback_tasks"] == 4 and report["taught"] == {"cot@small": 4}


def test_sweep_reports_progress_per_batched_group_not_only_at_the_end(capsys) -> None:
    """One sweep batch can run for many minutes on a CPU pool: a log line comes after every level group."""
    pool = load_pool("simulated")
    cfg = SweepConfig(topologies=["cot", "chain"], batch_size=16)
    sweep_teachers(_tasks("multiarith", 3), pool, cfg, RewardConfig(), benchmark_scorer, progress=True)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("teacher sweep call")]
    total = 3 * sum(len(s.agents) for s in candidate_specs(pool, cfg).values())
    assert len(lines) >= 3  # one batch of 3 tasks, yet one line per (level, capacity) group
    assert lines[-1].startswith(f"teacher sweep call {total}/{total} (100%)")


def test_teach_top_gives_each_task_the_best_candidates_in_order() -> None:
    """teach_top=3: every task gets the benchmark's three best-mean candidates, best first, so SFT keeps
    several good specs in the policy and a GRPO group can still compare them."""
    pool = load_pool("simulated")
    reward = RewardConfig(lambda_cost=1.0)
    tasks = _tasks("gsm8k", 8)
    one = sweep_teachers(tasks, pool, SweepConfig(), reward, benchmark_scorer).choices
    top_sweep = sweep_teachers(tasks, pool, SweepConfig(teach_top=3), reward, benchmark_scorer)
    top = top_sweep.choices
    assert len(top) == 3 * len(tasks)
    by_task: dict[str, list[str]] = {}
    for c in top:
        by_task.setdefault(c.task_id, []).append(c.candidate)
    assert all(len(set(names)) == 3 for names in by_task.values())
    assert {names[0] for names in by_task.values()} == {one[0].candidate}  # the best comes first, as with 1
    report = sweep_report(top_sweep)
    assert report["tasks"] == len(tasks) and sum(report["taught"].values()) == 3 * len(tasks)


def test_the_sweep_report_gives_every_candidate_its_solved_count_interval_and_reward_best_first() -> None:
    """What the teacher choice was made from: on 8 tasks a 5/8 and a 3/8 candidate have overlapping intervals,
    and the report must show that rather than only the winner's name."""
    pool = load_pool("simulated")
    tasks = _tasks("gsm8k", 8)
    sweep = sweep_teachers(tasks, pool, SweepConfig(), RewardConfig(lambda_cost=1.0), benchmark_scorer)
    measured = sweep_report(sweep)["candidates"]
    assert {c["candidate"] for c in measured} == set(candidate_specs(pool, SweepConfig()))
    rewards = [c["mean_reward"] for c in measured]
    assert rewards == sorted(rewards, reverse=True) and measured[0]["candidate"] == sweep.choices[0].candidate
    for c in measured:
        assert c["n"] == 8 and 0 <= c["solved"] <= 8 and c["accuracy"] == c["solved"] / 8
        assert c["ci"][0] <= c["accuracy"] <= c["ci"][1]
    solved = {c["candidate"]: c["solved"] for c in measured}
    assert solved["cot@large"] > solved["cot@small"]  # the simulated pool's GSM8K levels: 0.90 vs 0.25


def _result(name: str, rewards: list[float], cost: float) -> CandidateResult:
    return candidate_result("multiarith", name, [(r, float(r > 0.5), cost) for r in rewards])


def test_the_one_standard_error_rule_teaches_the_cheaper_of_two_candidates_the_sweep_cannot_tell_apart() -> None:
    """The 2026-12-05 `make run` sweep: a solver + verifier chain solved 6 of 8 and CoT 5 of 8 at half the price.
    One task is within one standard error (~0.16 on 8 tasks), so CoT is taught; a lead of three tasks is not."""
    chain = _result("chain@large", [0.95] * 6 + [-0.03] * 2, cost=1.1e-4)
    cot = _result("cot@large", [0.98] * 5 + [-0.01] * 3, cost=5.0e-5)
    small = _result("cot@small", [0.99] * 1 + [-0.01] * 7, cost=9.0e-6)
    assert 0.15 < chain.reward_se < 0.18 and chain.mean_reward > cot.mean_reward
    results = [small, cot, chain]
    assert results[cheapest_within_margin(results, 1.0)].candidate == "cot@large"
    assert results[cheapest_within_margin(results, 0.0)].candidate == "chain@large"  # the best mean reward
    far_ahead = _result("chain@large", [0.95] * 8, cost=1.1e-4)  # 8 of 8 vs 5 of 8: measurably better
    assert [small, cot, far_ahead][cheapest_within_margin([small, cot, far_ahead], 1.0)].candidate == "chain@large"
    wide = 10.0  # a margin so wide that every candidate is "near": the cheapest of all
    assert results[cheapest_within_margin(results, wide)].candidate == "cot@small"


def test_the_sweep_teaches_the_one_standard_error_choice_first_and_reports_its_figures() -> None:
    """On the simulated GSM8K with 12 tasks, cot@large (expected reward ~0.61 at lambda_cost 1) leads the cheaper
    `medium` candidates by less than its standard error (~0.09): the rule teaches a cheaper one, first in teach_top,
    and the report carries every candidate's standard error and cost."""
    pool = load_pool("simulated")
    tasks = _tasks("gsm8k", 12)
    reward = RewardConfig(lambda_cost=1.0)
    sweep = sweep_teachers(tasks, pool, SweepConfig(teach_top=2), reward, benchmark_scorer)
    chosen = cheapest_within_margin(sweep.candidates, SweepConfig().se_margin)
    by_task: dict[str, list[str]] = {}
    for c in sweep.choices:
        by_task.setdefault(c.task_id, []).append(c.candidate)
    assert {names[0] for names in by_task.values()} == {sweep.candidates[chosen].candidate}
    assert all(names[1] == sweep.candidates[0].candidate for names in by_task.values())  # then the best mean reward
    best = sweep.candidates[0]
    assert best.candidate == "cot@large" and sweep.candidates[chosen].candidate != best.candidate
    assert sweep.candidates[chosen].mean_reward >= best.mean_reward - best.reward_se
    assert sweep.candidates[chosen].mean_cost <= best.mean_cost
    measured = sweep_report(sweep)["candidates"]
    assert all(c["reward_se"] >= 0 and c["mean_cost"] > 0 for c in measured)
    costs = {c["candidate"]: c["mean_cost"] for c in measured}
    assert costs["cot@small"] < costs["cot@large"] < costs["chain@large"]
