"""The simulated pool (a named test/research environment) really has the optimum its docs claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from lemon_core.backends.simulated import SimulatedBackend, register_examples
from lemon_core.baselines import chain, cot
from lemon_core.benchmarks import Example, get
from lemon_core.executor import execute_specs
from lemon_core.pool import load_pool
from lemon_core.reward import RewardConfig, compute_reward

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
LEVELS = ("small", "medium", "large")


def mean_reward(benchmark: str, capacity: str, cfg: RewardConfig) -> tuple[float, float]:
    bench = get(benchmark)
    examples = bench.load(limit=200, data_dir=DATA)
    register_examples(examples)
    pool = load_pool("simulated")
    traces = execute_specs([cot(capacity)] * len(examples), examples, pool)
    scores = [bench.score(bench.extract(t.answer, ex), ex) for t, ex in zip(traces, examples, strict=True)]
    rewards = [compute_reward(s, t, cfg).total for s, t in zip(scores, traces, strict=True)]
    return sum(scores) / len(scores), sum(rewards) / len(rewards)


def test_known_optimum_small_for_multiarith_large_for_gsm8k() -> None:
    cfg = RewardConfig(lambda_cost=0.5)
    acc_small, r_small = mean_reward("multiarith", "small", cfg)
    acc_large, r_large = mean_reward("multiarith", "large", cfg)
    # cot's duty is customised, so each level's accuracy gets the documented +0.05 duty bonus (capped at 1)
    assert acc_small == pytest.approx(1.0, abs=0.02) and acc_large == pytest.approx(1.0, abs=0.02)
    assert r_small > r_large  # same accuracy, a fraction of the price
    acc_small, r_small = mean_reward("gsm8k", "small", cfg)
    acc_large, r_large = mean_reward("gsm8k", "large", cfg)
    assert acc_small == pytest.approx(0.25, abs=0.08) and acc_large == pytest.approx(0.90, abs=0.06)
    assert r_large > r_small + 0.3


def test_unregistered_task_is_an_error_not_an_answer() -> None:
    pool = load_pool("simulated")
    (trace,) = execute_specs([cot("small")], ["a task nobody registered"], pool)
    assert not trace.ok and "register_examples" in (trace.error or "")


def test_simulated_draws_are_reproducible() -> None:
    examples = get("gsm8k").load(limit=20, data_dir=DATA)
    register_examples(examples)
    pool = load_pool("simulated")
    first = [t.answer for t in execute_specs([cot("medium")] * 20, examples, pool)]
    second = [t.answer for t in execute_specs([cot("medium")] * 20, examples, load_pool("simulated"))]
    assert first == second


def solve_check_reward(solver: str, checker: str, examples: list, cfg: RewardConfig) -> tuple[float, float]:
    """(accuracy, mean reward) of a solver -> checker spec with these capacities on the solve_check family."""
    spec = chain("large", 2)
    a1, a2 = spec.agents
    spec = spec.model_copy(update={"agents": [a1.model_copy(update={"capacity": solver}),
                                              a2.model_copy(update={"capacity": checker})]})
    traces = execute_specs([spec] * len(examples), examples, load_pool("simulated"))
    scores = [float(t.answer.strip().endswith(f" {ex.answer}.")) for t, ex in zip(traces, examples, strict=True)]
    rewards = [compute_reward(s, t, cfg).total for s, t in zip(scores, traces, strict=True)]
    return sum(scores) / len(scores), sum(rewards) / len(rewards)


def test_solve_check_optimum_is_a_large_solver_with_a_small_checker() -> None:
    examples = [
        Example(id=f"sc{i}", benchmark="solve_check", question=f"Add {i} and {2 * i + 1}.",
                answer=str(3 * i + 1), answer_format="Answer with a number.")
        for i in range(300)
    ]
    register_examples(examples)
    cfg = RewardConfig(lambda_cost=1.0)  # bench/credit.py's reward
    table = {(s, c): solve_check_reward(s, c, examples, cfg) for s in LEVELS for c in LEVELS}
    best = max(table, key=lambda k: table[k][1])
    assert best == ("large", "small")
    runner_up = max(v[1] for k, v in table.items() if k != best)
    assert table[best][1] > runner_up + 0.02
    # a checker keeps a right answer at any size: accuracy is set by the solver, not the checker ...
    assert table[("large", "small")][0] == pytest.approx(0.96, abs=0.04)
    assert table[("small", "large")][0] < 0.55
    # ... so the same two capacities in the other order are far worse (the capacities are per agent)
    assert table[("small", "large")][1] < table[("large", "small")][1] - 0.4


def test_repair_accuracy_must_be_a_probability() -> None:
    with pytest.raises(ValueError, match="solve_check"):
        SimulatedBackend("small", {"gsm8k": 0.2}, repair_accuracy={"solve_check": 1.5})


@pytest.mark.parametrize("is_output", [True, False])
def test_the_simulated_pool_reads_the_task_and_parents_out_of_every_agent_prompt(is_output: bool) -> None:
    """The backend finds the task and each parent's output between the prompt's sections; an answer-format
    line it did not know (the upstream one) once made every upstream solver fail with 'not in the answer key'."""
    from lemon_core.backends.simulated import _PARENT_RE, _TASK_RE
    from lemon_core.prompts import agent_messages

    _, user = agent_messages(role="Checker", base_role="verifier", duty="d", task="Ann has 2 cats. How many?",
                             parents=[("a1", "Solver", "The answer is 2."), ("a2", "Solver 2", "It is 3.")],
                             answer_format="End with 'The answer is N'.", is_output=is_output)
    assert _TASK_RE.search(user).group(1) == "Ann has 2 cats. How many?"  # type: ignore[union-attr]
    assert _PARENT_RE.findall(user) == [("a1", "The answer is 2."), ("a2", "It is 3.")]
