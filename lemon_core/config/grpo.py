"""The GRPO loss's and the counterfactual credit's coefficients (``grpo`` in a train config).

The formulas are in ``lemon_core.credit`` (advantages) and ``lemon_core.grpo`` (the loss); docs/training.md
explains each term and why it is there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GRPOConfig(BaseModel):
    """Coefficients of the loss. Defaults follow TRL/DeepSeekMath GRPO where the paper is silent."""

    model_config = ConfigDict(extra="forbid")

    clip_eps: float = Field(
        default=0.2, gt=0, lt=1,
        description="PPO trust region: the ratio π/π_old is clipped to [1-clip_eps, 1+clip_eps_high], so one "
        "update cannot move a token's probability far from the sampling policy",
    )
    clip_eps_high: float | None = Field(
        default=None, gt=0, lt=10,
        description="upper clip bound if different from clip_eps (DAPO's 'clip-higher', e.g. 0.28: rare good "
        "tokens grow faster); None = clip_eps",
    )
    kl_coef: float = Field(
        default=0.04, ge=0,
        description="β_KL, weight of the per-token k3 KL to the frozen reference policy: keeps the orchestrator "
        "writing parseable specs while rewards pull it elsewhere; 0 disables it (no reference model is kept)",
    )
    cf_coef: float = Field(
        default=4.0, ge=0,
        description="β, weight of the localized counterfactual term on an edited span's tokens; 0 = plain GRPO. "
        "The contrast is in group-advantage units, where a price-only difference between two capacities is "
        "about 0.1, so β = 4 lets it show next to the group term; cf_clip and cf_max_ratio bound the large ones",
    )
    cf_clip: float | None = Field(
        default=2.0, gt=0,
        description="c: each scaled contrast Δ̃ is clipped to [-c, c], so a decisive edit (right -> wrong) in a "
        "group whose rewards barely differ cannot dwarf every group advantage; 2 is about the largest |Â| of a "
        "group of 6. None = no clip",
    )
    std_floor: float = Field(
        default=0.1, ge=0,
        description="σ_min: group advantages and contrasts are divided by max(σ, std_floor), so a group whose "
        "rewards differ only by price (σ ≈ 0.01) does not get ±1 advantages as large as right-vs-wrong; below "
        "the std of any group that differs in success. 0 = no floor",
    )
    cf_max_ratio: float | None = Field(
        default=1.0, gt=0,
        description="ρ: on every token the span term is clipped to ±ρ · max(|Â|, cf_ratio_floor), so the "
        "contrast of one field never outweighs the completion's group term by more than ρ. None = no cap "
        "(the paper's formula)",
    )
    cf_ratio_floor: float = Field(
        default=0.5, gt=0,
        description="a_min in the cap ρ · max(|Â|, a_min): what a group term near 0 counts as, so a group of "
        "identical specs (Â = 0) still gets a span signal and a collapsed policy is not a fixed point",
    )
    cf_pair_coef: float = Field(
        default=0.0, ge=0,
        description="weight of the pairwise term: for each capacity edit, a bounded preference loss between the "
        "level the policy wrote and the edit's level at the same prefix, pushing up the one with the higher "
        "measured reward. Unlike the span term it moves the alternative's log-prob too, so a level the policy "
        "writes with p ≈ 1 can still lose to a better one: for a warm-up that collapsed onto one spec (0.3; "
        "docs/training.md). 0 = off",
    )
    cf_pair_beta: float = Field(
        default=0.1, gt=0,
        description="β_pair: scale of the log-prob margin (policy over reference, better value over worse) inside "
        "the pairwise term's −log σ(·); smaller keeps pushing longer before the term saturates",
    )
    cf_pair_min_contrast: float = Field(
        default=0.0, ge=0,
        description="pairs whose scaled contrast |Δ̃| is below this are skipped, so an edit that changed nothing "
        "measurable does not pick a winner by noise; 0 keeps every pair with Δ ≠ 0",
    )
    loss_aggregation: Literal["token", "sequence"] = Field(
        default="token",
        description="token: per-token losses summed over the batch and divided by the token count (DAPO: long "
        "specs are not diluted); sequence: mean over each completion, then over completions (original GRPO)",
    )

    @property
    def eps_low(self) -> float:
        return self.clip_eps

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high
