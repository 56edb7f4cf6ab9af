"""Reward terms on hand-computed examples (lemon_core/reward.py)."""

from __future__ import annotations

import pytest

from lemon_core.baselines import self_consistency
from lemon_core.config import RewardConfig
from lemon_core.executor import AgentTrace, Trace
from lemon_core.reward import compute_reward


def _trace(tokens_per_agent: int, cost_per_agent: float) -> Trace:
    spec = self_consistency("small", n=2)  # 3 agents, 2 edges
    agents = [
        AgentTrace(a.id, "small", "", "", "x", tokens_per_agent, 0, cost_per_agent) for a in spec.agents
    ]
    return Trace(spec=spec, task="t", agents=agents, answer="x")


def test_correct_answer_earns_success_efficiency_minus_structure_and_cost() -> None:
    cfg = RewardConfig(
        success_weight=1.0,
        efficiency_weight=0.2,
        token_budget=1000,
        agent_cost=0.01,
        edge_cost=0.005,
        lambda_cost=2.0,
    )
    terms = compute_reward(1.0, _trace(100, 0.01), cfg)  # 300 tokens, $0.03
    assert terms.success == 1.0
    assert terms.efficiency == pytest.approx(0.2 * (1 - 300 / 1000))
    assert terms.structure == pytest.approx(-(3 * 0.01 + 2 * 0.005))
    assert terms.cost == pytest.approx(-2.0 * 0.03)
    assert terms.total == pytest.approx(1.0 + 0.14 - 0.04 - 0.06)
    assert terms.invalid == 0.0


def test_wrong_answer_gets_no_efficiency_bonus_and_budget_floor_is_zero() -> None:
    cfg = RewardConfig(token_budget=100)
    assert compute_reward(0.0, _trace(10, 0.0), cfg).efficiency == 0.0
    assert compute_reward(1.0, _trace(1000, 0.0), cfg).efficiency == 0.0  # over budget: 0, never negative


def test_invalid_spec_gets_only_the_penalty() -> None:
    terms = compute_reward(1.0, None, RewardConfig(invalid_penalty=-0.5))
    assert terms.total == terms.invalid == -0.5
    assert terms.success == terms.structure == terms.cost == 0.0


def test_coefficients_are_validated() -> None:
    with pytest.raises(ValueError, match="invalid_penalty"):
        RewardConfig(invalid_penalty=0.5)
    with pytest.raises(ValueError, match="token_budget"):
        RewardConfig(token_budget=0)
