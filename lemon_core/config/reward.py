"""The reward's coefficients (``reward`` in a train config); the reward itself is ``lemon_core.reward``."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RewardConfig(BaseModel):
    """Coefficients of the reward terms (all in the training config)."""

    success_weight: float = Field(1.0, ge=0, description="weight of the benchmark score (0..1)")
    efficiency_weight: float = Field(0.1, ge=0, description="bonus for a correct answer in few tokens")
    token_budget: int = Field(4000, gt=0, description="tokens at which the efficiency bonus reaches 0")
    agent_cost: float = Field(0.01, ge=0, description="structure cost per agent")
    edge_cost: float = Field(0.005, ge=0, description="structure cost per dependency edge")
    lambda_cost: float = Field(0.0, ge=0, description="weight of the USD cost of the execution")
    invalid_penalty: float = Field(-1.0, le=0, description="reward of a spec that does not parse/validate")
