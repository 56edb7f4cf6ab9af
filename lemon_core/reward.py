"""Reward of one executed spec: task success + token-efficiency bonus - graph-structure cost - price.

    r = w_success * score
      + w_efficiency * score * max(0, 1 - tokens / token_budget)     (only a correct answer earns it)
      - w_agent * n_agents - w_edge * n_edges                        (graph-structure cost)
      - lambda_cost * cost_usd                                        (pool prices)

An invalid spec (it did not parse or validate) gets ``invalid_penalty`` and nothing else. Every term
is kept separately so training logs ``reward/success``, ``reward/efficiency``, ... per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from lemon_core.config import RewardConfig
from lemon_core.executor import Trace


class RewardTerms(BaseModel):
    """Each term of one reward, and their sum."""

    success: float = 0.0
    efficiency: float = 0.0
    structure: float = 0.0
    cost: float = 0.0
    invalid: float = 0.0
    total: float = 0.0


def trace_score(trace: Trace, example: Any, scorer: Callable[[str, Any], float]) -> float:
    """The score of a run's final answer; a run that failed (an agent call errored) scores 0, whatever its text."""
    return float(scorer(trace.answer, example)) if trace.ok else 0.0


def compute_reward(score: float, trace: Trace | None, cfg: RewardConfig) -> RewardTerms:
    """Reward for a spec whose execution ``trace`` scored ``score``; ``trace=None`` means invalid spec."""
    if trace is None:
        return RewardTerms(invalid=cfg.invalid_penalty, total=cfg.invalid_penalty)
    n_agents = len(trace.spec.agents)
    n_edges = sum(len(a.depends_on) for a in trace.spec.agents)
    terms = RewardTerms(
        success=cfg.success_weight * score,
        efficiency=cfg.efficiency_weight * score * max(0.0, 1.0 - trace.tokens / cfg.token_budget),
        structure=-(cfg.agent_cost * n_agents + cfg.edge_cost * n_edges),
        cost=-cfg.lambda_cost * trace.cost,
    )
    terms.total = terms.success + terms.efficiency + terms.structure + terms.cost
    return terms
