"""GRPO loss with localized counterfactual credit (LEMON, arXiv 2605.14483), written as the formula.

For one task the policy samples a group of G specs o_1..o_G with rewards r_1..r_G. Every token t of
completion i gets the advantage

    A_{i,t} = Â_i + clip(S_{i,t}, −C_i, C_i)
    S_{i,t} = Σ_k  m_{i,k,t} · β · Δ̃_{i,k}                the span (counterfactual) term
              (β · |Δ̃_{i,k}| · Δ̃_{i,k} with cf_weight_by_abs_delta)

    Â_i       = (r_i − mean(r)) / (max(σ, σ_min) + ε),  σ = std(r)   group-relative advantage (GRPO)
    Δ_{i,k}   = r_i − r(edit_k(o_i))                     reward contrast of counterfactual edit k
    Δ̃_{i,k}   = clip(Δ_{i,k} / s_i, −c, c)               the contrast on the advantage's scale
    m_{i,k,t} = 1 if token t overlaps the edited field value's characters, else 0
    C_i       = ρ · max(|Â_i|, a_min)                    span term at most ρ times the group term

Calibration (``credit_advantages``, issue #10): σ_min (std_floor) keeps a group whose rewards differ
only by price (σ ≈ 0.01) from getting full-size ±1 advantages - its Â stay ≈ price difference / σ_min;
s_i uses the same floor; C_i (cf_max_ratio ρ, cf_ratio_floor a_min) stops a contrast from outweighing
the group term; optionally (drop_uniform_success_groups, DAPO) a group whose samples all have the same
success gets Â = 0.

so the group advantage is shared by every token, while the counterfactual contrast lands only on the
tokens of the field that was edited (a role, a duty, a capacity level, one dependency). Δ > 0 means
the original value beat the edit, so its tokens are reinforced; Δ < 0 means the edit was better, so
they are pushed down. The paper writes the term on raw Δ (s_i = 1, no clip); but Â is in units of
the group's reward std, so a raw Δ (reward units, often ~0.1) is lost next to Â (~±1). With
cf_delta_scale='group_std', s_i = σ + ε of i's group, so Δ̃ = Â_i − Â(edit) is how many group
advantage units the edit moves the completion, and the clip c (cf_clip) bounds the rare contrast
that is huge relative to a near-constant group (see contrast_divisors).

cf_span_credit='replace' (an option; 'add' above is the default) writes the edited span's tokens with the
contrast alone, in the spirit of COMA's counterfactual baseline (Foerster et al., AAAI 2018: one agent's
advantage is the joint reward minus the reward with that agent's action swapped, the others held fixed):

    A_{i,t} = clip(Σ_k m_{i,k,t} · Δ̃_{i,k}, −c, c)   where some edit covers t,   Â_i elsewhere

Why: under 'add' the span token of a checker's `medium` still carries Â_i, the credit of whatever the rest
of the spec earned; the contrast only corrects it by at most ρ times that. 'replace' gives the field the
measured effect of its own value (Δ̃ = Â_i − Â(edit) is on the advantage's scale, so no β and no cap:
|A| <= c, the size of the largest group advantage). The baseline is one edit, not the expectation over
the field's values that COMA takes. With the paper's one-level downgrades it depends on the sampled value
(`large` is measured against `medium`, `medium` against `small`), which biased the policy toward `medium` on
bench/credit.py; the edit family ``capacity_reset`` (counterfactual.py, the default) measures every level
against the pool's cheapest, a reference that does not depend on the value; with ``rollout.null_resets`` a level
already at the cheapest gets a zero contrast in place of its group term. Figures: GRPOConfig.cf_span_credit.

The loss is the PPO/GRPO clipped surrogate on those token advantages plus a KL penalty to a frozen
reference (k3 estimator), aggregated over tokens:

    ρ_t   = exp(log π(o_t) − log π_old(o_t))
    L_t   = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t) + β_KL · (exp(q_t) − q_t − 1),
    q_t   = log π_ref(o_t) − log π(o_t)

The pieces mirror TRL's GRPOTrainer (per-token advantage tensor, k3 KL, DAPO-style token
aggregation, metric names), so the counterfactual term is just a different advantage tensor.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor


class GRPOConfig(BaseModel):
    """Coefficients of the loss. Defaults follow TRL/DeepSeekMath GRPO where the paper is silent."""

    model_config = ConfigDict(extra="forbid")

    clip_eps: float = Field(
        default=0.2, gt=0, lt=1,
        description="PPO trust region: the ratio π/π_old is clipped to [1-clip_eps, 1+clip_eps_high]. "
        "Keeps one update from moving a token's probability too far from the sampling policy.",
    )
    clip_eps_high: float | None = Field(
        default=None, gt=0, lt=10,
        description="Upper clip bound if different from clip_eps (DAPO 'clip-higher', e.g. 0.28): a "
        "looser upper bound lets rare good tokens grow faster. None = symmetric (clip_eps).",
    )
    kl_coef: float = Field(
        default=0.04, ge=0,
        description="β_KL, weight of the per-token k3 KL to the frozen reference policy. Keeps the "
        "orchestrator writing fluent, parseable YAML while rewards pull it elsewhere. 0 disables it "
        "(then no reference logprobs are needed).",
    )
    cf_coef: float = Field(
        default=4.0, ge=0,
        description="β, weight of the localized counterfactual term on edited-span tokens. 0 = plain GRPO "
        "(the ablation baseline). 4 with the linear term (cf_weight_by_abs_delta false): a price-only contrast "
        "between two capacities of one agent is ~0.1 group-advantage units, so β·Δ̃ ≈ 0.4 is the size at "
        "which it shows next to the group term's noise; decisive contrasts are held by cf_clip and "
        "cf_max_ratio (at its default 1 a span term is cut to the size of the group term, or to 0.5 where "
        "|Â| < 0.5). Measured on bench/credit.py (32 seeds, 20 steps, 2026-12-05): the share of specs at the "
        "optimal capacity pair rose by +0.118 ± 0.032 over plain GRPO (cf ahead on 22/32 seeds); β = 1 "
        "linear (−0.014 ± 0.024) and β = 4 quadratic (−0.025 ± 0.025) left it where plain GRPO has it.",
    )
    cf_weight_by_abs_delta: bool = Field(
        default=False,
        description="True: span tokens get β·|Δ̃|·Δ̃ (the contrast weighted by its own size, so small "
        "contrasts count quadratically less than decisive ones). False (default): β·Δ̃. Δ̃ is the scaled, "
        "clipped contrast (cf_delta_scale, cf_clip). The quadratic weight squashes exactly the contrasts "
        "credit assignment is for - a `medium` vs `small` checker differs by its price, Δ̃ ≈ 0.1, which "
        "β·|Δ̃|·Δ̃ turns into 0.01 - and measured no effect on bench/credit.py at β = 1 or 4 (see cf_coef).",
    )
    cf_delta_scale: Literal["none", "group_std"] = Field(
        default="group_std",
        description="Unit of the contrast Δ = r − r_edit before weighting. 'group_std': Δ̃ = Δ / (σ + "
        "std_eps) with σ the reward std of the completion's group - the divisor of its group advantage "
        "- so Δ̃ = Â − Â(edit) is on the advantage's scale. A constant group (σ = 0) and scale_rewards: "
        "false use Δ unscaled. 'none': raw reward units, the paper's formula as written; there "
        "|Δ|·Δ is ~0.003-0.1 against Â ~ ±1. Default 'group_std' because it is the setting where the "
        "term acts: on the MultiArith bench/credit.py of commit b243c8d (16 seeds, 10 steps) 'none' left "
        "10 of 14 seeds identical to "
        "plain GRPO, while 'group_std' raised the share of the optimal `small` capacity (+0.04 ± 0.03) and "
        "the valid specs' reward (+0.005 ± 0.003); the final reward there is dominated by spec "
        "validity, which the span term does not target, and did not change (ratio 0.96 ± ~0.06).",
    )
    cf_clip: float | None = Field(
        default=2.0, gt=0,
        description="c: Δ̃ is clipped to [-c, c] before weighting, so one edit adds at most β·c (β·c² "
        "with the |Δ̃| weighting) "
        "to a span token. Needed with 'group_std': in a group whose rewards barely differ σ is tiny "
        "and one decisive edit (right -> wrong, Δ ≈ 1) would otherwise dwarf every group advantage. "
        "2.0 ≈ the largest |Â| of a group of 6 (√5). None = no clip.",
    )
    std_floor: float = Field(
        default=0.1, ge=0,
        description="σ_min: the group std used to normalise is max(σ, std_floor), and the counterfactual Δ "
        "divisor (cf_delta_scale 'group_std') is the same max(σ, std_floor), constant groups included. "
        "Why: when every spec of a group is wrong, rewards differ only by agent/edge/price cost (σ ≈ 0.01) "
        "and plain normalisation turns that noise into ±1 advantages, as large as right-vs-wrong. 0.1 is "
        "below the std of any group that differs in success (one success among G has std √(G−1)/G: 0.33 "
        "at G=8, 0.12 at G=64), so it never changes those, while a price-only group's advantages shrink "
        "to (r − mean)/0.1 (≈ ±0.12 for σ = 0.012). 0 = no floor (then a constant group keeps raw Δ).",
    )
    drop_uniform_success_groups: bool = Field(
        default=False,
        description="DAPO-style: a group in which every sample has the same success (all right, all wrong "
        "or all invalid) contributes no group term (Â = 0). Its span terms are kept - a counterfactual is "
        "a paired comparison of one field, so its contrast is real even where the group's is not - and "
        "capped at cf_max_ratio × cf_ratio_floor. Off by default: price is part of the reward, and in a "
        "group where every spec is right price is the only thing to learn (the MultiArith optimum, one "
        "`small` agent, is learnt from such groups); std_floor already keeps price noise small.",
    )
    cf_max_ratio: float | None = Field(
        default=1.0, gt=0,
        description="ρ: on every token the span term (summed over edits) is clipped to ±ρ · max(|Â_i|, "
        "cf_ratio_floor), so it moves a token's advantage by at most ρ times the completion's group term (and, "
        "where Â_i is near 0, by at most ρ · cf_ratio_floor). 1 since 2026-12-07, with the capacity_reset edits "
        "(bench/credit.py, 32 seeds, 80 steps, against plain GRPO): 39.31 steps to 90% of r* against 60.78, "
        "ratio 0.647 [0.55, 0.75], expected reward +0.071 ± 0.015, valid 0.99; at ρ = 0.5 46.78 steps (0.770), "
        "ρ = 1 sooner by 7.5 ± 2.6 paired, same reward and validity. With one-level downgrades ρ = 1 had been "
        "worse than 0.5 (0.907 against 0.844, seeds 0-15), whose one-level contrasts favour `medium`. "
        "0.5 from 2026-12-06, from bench/credit.py (16 "
        "seeds, 40 steps, lr 2e-4, paired with plain GRPO): at ρ = 2 (the former default) the span term steered "
        "to the optimal capacity pair on the shipped family (+0.133 ± 0.050 of the sampled specs) but on the "
        "priced family broke specs (valid 0.95 vs 0.99: the small policy's role/duty text near the capacity "
        "spans turned to garbage until max_new_tokens; likely the big span advantages, as capacity edits alone "
        "did it too), costing reward (−0.074 ± 0.027); at ρ = 0.5 validity equals plain "
        "GRPO's on both families and the shipped family's share at the optimum rose by +0.271 ± 0.045 (cf "
        "ahead on 16/16 seeds; expected reward +0.030 ± 0.012); ρ = 0.25 gave +0.157 ± 0.031; ρ = 1 "
        "+0.294 ± 0.059 but valid 0.986 and 0.970 (docs/training.md). None = no cap (the paper's unscaled "
        "formula).",
    )
    cf_span_credit: Literal["add", "replace"] = Field(
        default="add",
        description="How the contrast meets the group term on an edited span's tokens. 'add' (default): "
        "Â + the capped span term (cf_coef, cf_weight_by_abs_delta, cf_max_ratio, cf_ratio_floor). 'replace': "
        "the span's tokens get Σ Δ̃ clipped to ±cf_clip and no group term (a COMA-style counterfactual "
        "advantage; module docstring): the field is credited with its own measured effect, not with the rest "
        "of the spec's. cf_coef = 0 still turns the span term off in both. 'replace' sets aside the cap on those "
        "tokens, so it is not the default. Measured on bench/credit.py (2026-12-07, K = 2, 80 steps): with the "
        "paper's one-level downgrades it is worse than plain GRPO (the baseline depends on the sampled level: the "
        "policy settled on a `medium` solver); with capacity_reset and rollout.null_resets, steps-to-target "
        "ratio 0.784 [0.69, 0.88] over 32 seeds against 0.864 for 'add' with downgrades, but no more expected reward "
        "(+0.001 ± 0.018) and valid 0.98 against 0.99 (garbled roles and duties on 3 of 32 seeds); 'add' with "
        "capacity_reset (the defaults since) 0.770.",
    )
    cf_ratio_floor: float = Field(
        default=0.5, gt=0,
        description="a_min in the cap ρ · max(|Â|, a_min): what a group term near 0 counts as. Without it a "
        "constant group (a collapsed policy: every sample the same spec, Â = 0) would get no span signal "
        "at all, and the collapse would be a fixed point. 0.5: with ρ = 1 a constant group's span term is "
        "at most 0.5, half a typical advantage in a group that differs.",
    )
    std_eps: float = Field(
        default=1e-6, gt=0,
        description="Added to the group reward std before dividing, so near-constant groups do not "
        "explode. Exactly constant groups get advantage 0 regardless (no signal to learn from).",
    )
    scale_rewards: bool = Field(
        default=True,
        description="Divide group-centred rewards by the group std (GRPO). False = only centre them "
        "(Dr. GRPO), which avoids over-weighting tasks whose G rewards barely differ. With price in the reward, "
        "std scaling counts who wins rather than by how much: it prefers a cheap spec right 59% of the time to a "
        "dearer one right 95% whose expected reward is higher (tests/test_grpo.py). Kept on: switching it off "
        "measured no difference on bench/credit.py (32 seeds, 20 steps, 2026-12-05).",
    )
    loss_aggregation: Literal["token", "sequence"] = Field(
        default="token",
        description="'token': sum of per-token losses over all completion tokens of the batch divided by "
        "their count (DAPO), so every token weighs the same and long specs are not diluted. "
        "'sequence': mean over each completion's tokens, then mean over completions (original GRPO).",
    )

    @property
    def eps_low(self) -> float:
        return self.clip_eps

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


# ---------------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------------


def _as_reward_tensor(rewards: Tensor | Sequence[float], name: str = "rewards") -> Tensor:
    r = torch.as_tensor(rewards, dtype=torch.float64) if not isinstance(rewards, Tensor) else rewards.double()
    if r.ndim != 1 or r.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D list/tensor of floats, got shape {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError(f"{name} contains NaN/inf ({r.tolist()}); score invalid specs with a finite penalty")
    return r


def group_advantages(
    rewards: Tensor | Sequence[float], std_eps: float = 1e-6, scale: bool = True, std_floor: float = 0.0,
) -> Tensor:
    """Â_i = (r_i − mean(r)) / (max(std(r), std_floor) + std_eps) over one group of G completions of a task.

    std is the *population* std (divide by G, not G−1), so rewards [1, 0, 0, 1] give exactly
    [+1, −1, −1, +1] (up to std_eps). A group whose rewards are all equal carries no preference
    between its samples, so it gets exactly zeros (checked explicitly, not left to 0/ε rounding).
    `scale=False` returns only the centred rewards (Dr. GRPO). std_floor (GRPOConfig.std_floor) keeps
    a group whose rewards barely differ (price noise) from getting full-size advantages: rewards
    [0.50, 0.52] with floor 0.1 give [−0.1, +0.1], not [−1, +1]. Returns float32 of shape [G].
    """
    r = _as_reward_tensor(rewards)
    if bool(r.max() == r.min()):
        return torch.zeros_like(r, dtype=torch.float32)
    centred = r - r.mean()
    if not scale:
        return centred.float()
    return (centred / (r.std(unbiased=False).clamp(min=std_floor) + std_eps)).float()


def _group_stats(
    rewards: Tensor | Sequence[float], group_ids: Tensor | Sequence[Hashable],
) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of a flat batch of groups: (r − group mean, group population std, group is constant).

    The std of a constant group is exactly 0 (set explicitly, not left to float rounding).
    """
    r = _as_reward_tensor(rewards)
    ids = list(group_ids.tolist()) if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != r.numel():
        raise ValueError(f"group_ids has {len(ids)} entries, rewards {r.numel()}; give one id per reward")
    index_of: dict[Hashable, int] = {}
    g = torch.tensor([index_of.setdefault(i, len(index_of)) for i in ids], dtype=torch.long)
    n_groups = len(index_of)

    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, torch.ones_like(r))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, r) / count
    centred = r - mean[g]
    var = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, centred**2) / count
    hi = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amin")
    constant = (hi == lo)[g]
    std = torch.where(constant, torch.zeros_like(centred), var.sqrt()[g])
    return centred, std, constant


def batched_group_advantages(
    rewards: Tensor | Sequence[float], group_ids: Tensor | Sequence[Hashable],
    std_eps: float = 1e-6, scale: bool = True, std_floor: float = 0.0,
) -> Tensor:
    """group_advantages for a flat batch holding many groups: row n belongs to group group_ids[n].

    Same definition as group_advantages (population std, std_floor, constant group -> 0) applied per
    group; groups may have different sizes and rows of a group need not be contiguous. group_ids may be
    ints or any hashables (e.g. task ids). Returns float32 of shape [N].
    """
    centred, std, constant = _group_stats(rewards, group_ids)
    adv = centred / (std.clamp(min=std_floor) + std_eps) if scale else centred
    return torch.where(constant, torch.zeros_like(adv), adv).float()


def contrast_divisors(
    rewards: Tensor | Sequence[float], group_ids: Tensor | Sequence[Hashable], cfg: GRPOConfig,
) -> list[float]:
    """s_n, the divisor of every counterfactual contrast Δ of row n: Δ̃ = clip(Δ / s_n, ±cf_clip).

    With cf_delta_scale='group_std' and scale_rewards, s_n = max(σ_g, std_floor) + std_eps for the std
    σ_g of row n's group - the divisor of Â_n itself, so Δ̃ = Â_n − Â(edit). A constant group (σ_g = 0)
    gets std_floor + std_eps: the floor is its unit, so a 0.005 price contrast stays 0.05 while a
    right-vs-wrong contrast is clipped to cf_clip. With std_floor = 0 a constant group has no unit of
    its own - dividing by std_eps would turn a 1e-4 cost difference into a maximal push - so its
    contrasts keep their raw size (s_n = 1). Otherwise s_n = 1 (raw reward units): with scale_rewards
    off Â is in reward units too.
    """
    _, std, constant = _group_stats(rewards, group_ids)
    if cfg.cf_delta_scale == "none" or not cfg.scale_rewards:
        return [1.0] * std.numel()
    if cfg.std_floor > 0:
        return (std.clamp(min=cfg.std_floor) + cfg.std_eps).tolist()
    return torch.where(constant, torch.ones_like(std), std + cfg.std_eps).tolist()


# ---------------------------------------------------------------------------------------------------
# Edited-span token masks
# ---------------------------------------------------------------------------------------------------


def span_token_mask(offsets: Sequence[tuple[int, int]] | Tensor, span: tuple[int, int]) -> Tensor:
    """Bool mask over completion tokens: True where the token's characters overlap span [start, end).

    offsets are the tokenizer's offset_mapping for the completion tokens (char offsets into the
    completion text). Overlap rule: token [a, b) counts iff a < end and b > start, i.e. it shares at
    least one character with the span - a token that is only partly inside (BPE merging " large" with
    its leading space, or "large\\n") still counts, because its probability decided that value.
    Zero-width tokens (a == b, e.g. (0, 0) for special tokens) never count.
    """
    start, end = _check_span(span)
    off = torch.as_tensor(offsets, dtype=torch.long)
    if off.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    if off.ndim != 2 or off.shape[1] != 2:
        raise ValueError(f"offsets must be a list of (start, end) pairs, got shape {tuple(off.shape)}")
    a, b = off[:, 0], off[:, 1]
    return (b > a) & (a < end) & (b > start)


def _check_span(span: tuple[int, int]) -> tuple[int, int]:
    if len(span) != 2:
        raise ValueError(f"span must be (start, end) char offsets, got {span!r}")
    start, end = int(span[0]), int(span[1])
    if start < 0 or end <= start:
        raise ValueError(f"span {span!r} is empty or negative; need 0 <= start < end (end exclusive)")
    return start, end


def _require_fast(tokenizer: Any) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{type(tokenizer).__name__} is not a fast tokenizer, so it has no offset mapping; "
            "load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )


def span_mask_from_tokenizer(tokenizer: Any, text: str, span: tuple[int, int]) -> Tensor:
    """span_token_mask for `text` tokenized by a HF fast tokenizer (no special tokens added).

    Use it when the completion tokens are exactly tokenizer(text) - e.g. SFT targets. For sampled
    completions, whose ids need not equal a re-tokenization of their text, use offsets_from_token_ids.
    """
    _require_fast(tokenizer)
    if span[1] > len(text):
        raise ValueError(f"span {span!r} ends past the text (length {len(text)})")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return span_token_mask(enc["offset_mapping"], span)


# ---------------------------------------------------------------------------------------------------
# Token advantages
# ---------------------------------------------------------------------------------------------------


def counterfactual_token_advantages(
    seq_len: int, edits: Sequence[tuple[Tensor, float]], cf_coef: float, weight_by_abs_delta: bool = True,
    delta_divisor: float = 1.0, delta_clip: float | None = None,
) -> Tensor:
    """The localized counterfactual advantage of one completion: Σ_k mask_k · β · |Δ̃_k| · Δ̃_k.

    Each edit is (mask over the completion's tokens, Δ = r_original − r_edited), and
    Δ̃_k = clip(Δ_k / delta_divisor, −delta_clip, delta_clip) (divisor from contrast_divisors; the
    defaults 1 and None keep Δ as is). Only tokens inside an edited span get a value; every other
    token gets exactly 0, so the contrast of changing one field is credited to that field alone.
    Where spans of several edits overlap a token (e.g. a duty and the role it was rolled back from
    share a token), their terms add: each edit is separate evidence about that token.
    weight_by_abs_delta=False gives β · Δ̃_k instead. Returns float32 [seq_len].
    """
    if not delta_divisor > 0:
        raise ValueError(f"delta_divisor must be > 0 (a std + std_eps, or 1), got {delta_divisor}")
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")
    adv = torch.zeros(seq_len, dtype=torch.float32)
    for k, (mask, delta) in enumerate(edits):
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool or mask.shape != (seq_len,):
            raise ValueError(
                f"edit {k}: mask must be a bool tensor of shape ({seq_len},), got {mask.dtype} "
                f"{tuple(mask.shape)}; build it with span_token_mask over the completion tokens"
            )
        delta = float(delta)
        if delta != delta or abs(delta) == float("inf"):
            raise ValueError(f"edit {k}: delta={delta} is not finite; r and r_edit must both be finite")
        delta = delta / delta_divisor
        if delta_clip is not None:
            delta = max(-delta_clip, min(delta_clip, delta))
        weight = abs(delta) if weight_by_abs_delta else 1.0
        adv = adv + mask.float() * (cf_coef * weight * delta)
    return adv


def token_advantages(group_adv: float, seq_len: int, cf_adv: Tensor | None = None) -> Tensor:
    """A_t = Â (the completion's group advantage, same for every token) + counterfactual term."""
    base = torch.full((seq_len,), float(group_adv), dtype=torch.float32)
    if cf_adv is None:
        return base
    if cf_adv.shape != (seq_len,):
        raise ValueError(f"cf_adv has shape {tuple(cf_adv.shape)}, expected ({seq_len},)")
    return base + cf_adv.float()


def cap_span_term(span_adv: Tensor, group_adv: float, max_ratio: float | None, ratio_floor: float) -> Tensor:
    """clip(S_t, −C, C) with C = max_ratio · max(|Â|, ratio_floor): the span term of one completion,
    bounded so it never outweighs the group term Â by more than max_ratio (see GRPOConfig.cf_max_ratio).
    max_ratio None returns span_adv unchanged."""
    if max_ratio is None:
        return span_adv
    bound = max_ratio * max(abs(float(group_adv)), ratio_floor)
    return span_adv.clamp(min=-bound, max=bound)


def replaced_span_advantages(
    group_adv: float, seq_len: int, edits: Sequence[tuple[Tensor, float]], delta_divisor: float,
    delta_clip: float | None,
) -> Tensor:
    """cf_span_credit='replace': A_t = clip(Σ_k m_k,t · Δ̃_k, ±c) on tokens some edit covers, Â elsewhere.

    The contrast stands in for the group term on its field's tokens (module docstring); an edit whose
    contrast is 0 (the field did not change the reward) leaves its tokens with advantage 0.
    """
    contrast = counterfactual_token_advantages(
        seq_len, edits, 1.0, weight_by_abs_delta=False, delta_divisor=delta_divisor, delta_clip=delta_clip)
    if delta_clip is not None:
        contrast = contrast.clamp(min=-delta_clip, max=delta_clip)
    covered = torch.zeros(seq_len, dtype=torch.bool)
    for mask, _ in edits:
        covered |= torch.as_tensor(mask)
    return torch.where(covered, contrast, torch.full((seq_len,), float(group_adv), dtype=torch.float32))


SpanEdit = tuple[Tensor, float, str]  # (token mask over the completion, Δ = r − r_edit, edit family)


@dataclass
class Credit:
    """What ``credit_advantages`` returns: the token advantages and counts for the step's metrics."""

    advantages: list[Tensor]  # per record, float32 [completion length]
    groups: int  # GRPO groups in the batch
    constant_groups: int  # groups whose samples all got one reward: Â = 0, only span terms can move them
    dropped_groups: int  # uniform-success groups whose group term was zeroed (drop_uniform_success_groups)
    floored_groups: int  # non-constant groups whose std was below std_floor (their Â were shrunk)
    capped_tokens: int  # span tokens whose term hit the cf_max_ratio cap
    scaled_delta_abs: dict[str, float]  # per edit family: mean |Δ̃| (contrast in advantage units, clipped)


def uniform_success_rows(
    successes: Sequence[float | bool | None], group_ids: Sequence[Hashable],
) -> list[bool]:
    """Per row: does every sample of its group have the same success? None (an invalid spec) is its
    own outcome, so a group of invalid and valid-but-wrong specs is not uniform: validity is learnt."""
    outcomes: dict[Hashable, set[float | None]] = {}
    for key, ok in zip(group_ids, successes, strict=True):
        outcomes.setdefault(key, set()).add(None if ok is None else float(ok))
    return [len(outcomes[key]) == 1 for key in group_ids]


def credit_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], successes: Sequence[float | bool | None],
    lengths: Sequence[int], edits: Sequence[Sequence[SpanEdit]], cfg: GRPOConfig,
) -> Credit:
    """Per-token advantages of a batch of completions: A_t = Â + clip(S_t, ±C) (module docstring).

    One row per completion: its total reward, its group key (e.g. (step, task_id)), its success (the
    benchmark score; None for a spec that did not parse), its number of completion tokens, and its
    counterfactual edits as (token mask, Δ, family). Δ is divided by the row's contrast divisor
    (max(σ, std_floor)), clipped to cf_clip, weighted (cf_weight_by_abs_delta), summed over edits and
    capped at cf_max_ratio · max(|Â|, cf_ratio_floor) (cf_span_credit='replace': the clipped contrast stands in
    for Â on the span's tokens, replaced_span_advantages). With drop_uniform_success_groups, Â = 0 for
    every row of a group whose successes are all equal; its span terms stay (capped by the floor).
    """
    n = len(rewards)
    for name, seq in (("group_ids", group_ids), ("successes", successes), ("lengths", lengths), ("edits", edits)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries, rewards {n}; give one per completion")
    _, std, constant = _group_stats(rewards, group_ids)
    group_adv = batched_group_advantages(rewards, group_ids, cfg.std_eps, cfg.scale_rewards, cfg.std_floor)
    dropped = uniform_success_rows(successes, group_ids) if cfg.drop_uniform_success_groups else [False] * n
    group_adv = torch.where(torch.tensor(dropped), torch.zeros_like(group_adv), group_adv)
    divisors = contrast_divisors(rewards, group_ids, cfg)
    out, capped = [], 0
    by_family: dict[str, list[float]] = {}
    for row in range(n):
        adv = float(group_adv[row])
        row_edits = [(mask, delta) for mask, delta, _ in edits[row]]
        for _, delta, family in edits[row]:
            scaled = abs(float(delta)) / divisors[row]
            by_family.setdefault(str(family), []).append(min(scaled, cfg.cf_clip or scaled))
        if not row_edits or cfg.cf_coef == 0:
            out.append(token_advantages(adv, lengths[row]))
            continue
        if cfg.cf_span_credit == "replace":
            out.append(replaced_span_advantages(adv, lengths[row], row_edits, divisors[row], cfg.cf_clip))
            continue
        span = counterfactual_token_advantages(
            lengths[row], row_edits, cfg.cf_coef, cfg.cf_weight_by_abs_delta, divisors[row], cfg.cf_clip
        )
        bounded = cap_span_term(span, adv, cfg.cf_max_ratio, cfg.cf_ratio_floor)
        capped += int((bounded != span).sum())
        out.append(token_advantages(adv, lengths[row], bounded))
    keys = list(group_ids)
    first = {k: i for i, k in reversed(list(enumerate(keys)))}
    low = (std < cfg.std_floor) & ~constant
    return Credit(
        advantages=out,
        groups=len(first),
        constant_groups=sum(bool(constant[i]) for i in first.values()),
        dropped_groups=sum(dropped[i] for i in first.values()),
        floored_groups=sum(bool(low[i]) for i in first.values()) if cfg.scale_rewards else 0,
        capped_tokens=capped,
        scaled_delta_abs={f: sum(v) / len(v) for f, v in sorted(by_family.items())},
    )


# ---------------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------------


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
