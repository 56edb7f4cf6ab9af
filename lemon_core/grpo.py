"""The GRPO loss, written as the formula (token advantages come from ``lemon_core.credit``).

    ρ_t   = exp(log π(o_t) − log π_old(o_t))
    L_t   = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t) + β_KL · (exp(q_t) − q_t − 1)
    q_t   = log π_ref(o_t) − log π(o_t)

aggregated over completion tokens (``loss_aggregation``: every token of the batch weighs the same, DAPO; or
per sequence, then over sequences, the original GRPO). A_t is LEMON's token advantage: the group term plus
the counterfactual span term. The pieces mirror TRL's GRPOTrainer (per-token advantage tensor, k3 KL,
DAPO-style aggregation, metric names), so the counterfactual credit is just a different advantage tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lemon_core.config import GRPOConfig


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π || π_ref): exp(q) − q − 1 with q = log π_ref − log π.

    Unbiased for samples from π, always >= 0, and exactly 0 (with zero gradient) where π = π_ref.
    """
    q = ref_logprobs - logprobs
    return torch.exp(q) - q - 1


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def grpo_loss(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, mask: Tensor,
    cfg: GRPOConfig, total_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped-surrogate GRPO loss with KL to a reference; all tensors [B, T] over completion tokens.

    advantages is [B, T] (token advantages, see token_advantages) or [B] (one per completion,
    broadcast). mask is 1 for real completion tokens, 0 for padding. For token aggregation across
    gradient-accumulation micro-batches pass total_tokens = the number of completion tokens in the
    whole optimizer step, so every token weighs the same regardless of how the batch was split.
    Returns (loss, metrics) with TRL's metric names; metrics are detached floats.
    """
    shape = logprobs.shape
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [batch, tokens], got shape {tuple(shape)}")
    if advantages.ndim == 1:
        advantages = advantages[:, None].expand(shape)
    for name, t in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs),
                    ("advantages", advantages), ("mask", mask)):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logprobs")
    if cfg.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (from the frozen reference); or set kl_coef: 0")
    mask = mask.to(logprobs.dtype)
    if mask.sum() == 0:
        raise ValueError("mask selects no completion tokens; every completion needs at least one token")
    old_logprobs, advantages = old_logprobs.detach(), advantages.detach().to(logprobs.dtype)

    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    kl = k3_kl(logprobs, ref_logprobs.detach()) if ref_logprobs is not None else None
    if kl is not None and cfg.kl_coef > 0:
        per_token = per_token + cfg.kl_coef * kl

    if cfg.loss_aggregation == "token":
        denom = mask.sum() if total_tokens is None else torch.as_tensor(float(total_tokens))
        loss = (per_token * mask).sum() / denom
    else:
        lengths = mask.sum(dim=1)
        has_tokens = lengths > 0
        per_seq = (per_token * mask).sum(dim=1)[has_tokens] / lengths[has_tokens]
        loss = per_seq.mean()

    with torch.no_grad():
        low = (ratio < 1 - cfg.eps_low) & (advantages < 0)
        high = (ratio > 1 + cfg.eps_high) & (advantages > 0)
        metrics = {
            "loss": loss.item(),
            "kl": _masked_mean(kl, mask).item() if kl is not None else 0.0,
            "clip_ratio": _masked_mean((low | high).to(mask.dtype), mask).item(),
            "clip_ratio/low": _masked_mean(low.to(mask.dtype), mask).item(),
            "clip_ratio/high": _masked_mean(high.to(mask.dtype), mask).item(),
            "ratio/mean": _masked_mean(ratio, mask).item(),
            "advantage/mean": _masked_mean(advantages, mask).item(),
        }
    return loss, metrics
