"""The simulated pool (a named test/research environment) really has the optimum its docs claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from lemon_core.backends.base import GenerationRequest
from lemon_core.backends.simulated import SimulatedBackend, register_examples
from lemon_core.baselines import chain, cot
from lemon_core.benchmarks import Example, get
from lemon_core.config import RewardConfig
from lemon_core.executor import execute_specs
from lemon_core.pool import load_pool
from lemon_core.reward import compute_reward
from lemon_core.roles import BASE_ROLES

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


def _call(backend: SimulatedBackend, duty: str, seed: int, question: str) -> bool:
    """One agent call as the executor makes it (role and duty in the system message, the task in the user one)."""
    system, user = f"You are the Solver.\nYour duty: {duty}", f"Task:\n{question}\n\nNow do your duty"
    request = GenerationRequest.chat(system, user, seed=seed)
    (completion,) = backend.generate([request])
    return completion.text.endswith(" 7.")


@pytest.mark.parametrize("coupled", [False, True])
def test_coupled_draws_keep_an_agents_luck_across_levels_and_duties(coupled: bool) -> None:
    question = "Coupled draws: what is 3 + 4?"
    register_examples([Example(id="cd", benchmark="gsm8k", question=question, answer="7",
                               answer_format="Answer with a number.")])
    small, large = (SimulatedBackend(level, {"gsm8k": acc}, duty_bonus=0.05, coupled_draws=coupled)
                    for level, acc in (("small", 0.2), ("large", 0.85)))
    seeds = range(400)
    right_small = [_call(small, "Solve it.", s, question) for s in seeds]
    right_large = [_call(large, "Solve it.", s, question) for s in seeds]
    default_duty = [_call(large, BASE_ROLES["solver"], s, question) for s in seeds]
    # either way each level keeps its chance of being right (0.2 + 0.05 and 0.85 + 0.05 with a customised duty)
    assert sum(right_small) / 400 == pytest.approx(0.25, abs=0.06)
    assert sum(right_large) / 400 == pytest.approx(0.90, abs=0.05)
    small_only = sum(s and not lg for s, lg in zip(right_small, right_large, strict=True))
    duty_flips = sum(a != b for a, b in zip(right_large, default_duty, strict=True))
    if coupled:  # one number per agent id: a larger level is right wherever a smaller one is
        assert small_only == 0
        # a duty edit flips only the calls whose number falls in the 0.05 bonus band, and only right -> wrong
        assert 0 < duty_flips <= 40 and all(a or not b for a, b in zip(right_large, default_duty, strict=True))
        # a request without a seed (not one the executor makes) draws as by default, not one number for all agents
        questions = [f"Unseeded: what is {i} + 4?" for i in range(100)]
        register_examples([Example(id=f"u{i}", benchmark="gsm8k", question=q, answer=str(i + 4),
                                   answer_format="Answer with a number.") for i, q in enumerate(questions)])
        unseeded = [GenerationRequest.chat("You are the Solver.\nYour duty: Solve it.",
                                           f"Task:\n{q}\n\nNow do your duty") for q in questions]
        coupled_half, plain_half = (SimulatedBackend("medium", {"gsm8k": 0.5}, coupled_draws=c) for c in (True, False))
        answers = coupled_half.generate(unseeded)
        right = [a.text.endswith(f" {i + 4}.") for i, a in enumerate(answers)]
        assert not any(a.error for a in answers) and 20 < sum(right) < 80  # a mix, so a different draw would show
        assert answers == plain_half.generate(unseeded)
    else:  # every request draws anew: an edit re-rolls the outcome
        assert small_only > 0 and duty_flips > 50  # expected 10 and 88 of 400 (independent draws)
