"""Token advantages: GRPO's group term plus LEMON's localized counterfactual term (arXiv 2605.14483).

For one task the policy samples a group of G specs o_1..o_G with rewards r_1..r_G. Every token t of
completion i gets the advantage

    A_{i,t} = Â_i + clip(S_{i,t}, −C_i, C_i)

    Â_i       = (r_i − mean(r)) / s_i,   s_i = max(σ, σ_min) + ε       group-relative advantage (GRPO)
    S_{i,t}   = β · Σ_k m_{i,k,t} · Δ̃_{i,k}                           the span (counterfactual) term
    Δ_{i,k}   = r_i − r(edit_k(o_i))                                   reward contrast of counterfactual edit k
    Δ̃_{i,k}   = clip(Δ_{i,k} / s_i, −c, c)                             the contrast in group-advantage units
    m_{i,k,t} = 1 if token t overlaps the edited field value's characters, else 0
    C_i       = ρ · max(|Â_i|, a_min)                                  span term at most ρ times the group term

σ is the population std of the group's rewards; a group whose rewards are all equal has Â = 0 exactly.
β = cf_coef, σ_min = std_floor, c = cf_clip, ρ = cf_max_ratio, a_min = cf_ratio_floor (``GRPOConfig``).

The pairwise term (``pair_loss``, off unless ``cf_pair_coef`` > 0) adds, for every capacity edit k that writes
another level v' where the policy wrote v, a bounded preference loss on the two values' log-probs at the same
prefix, against the frozen reference:

    L_pair = cf_pair_coef · mean_k w_k · −log σ(β_p · [(log π(v⁺) − log π_ref(v⁺)) − (log π(v⁻) − log π_ref(v⁻))])
    w_k    = min(|Δ̃_{i,k}|, c),   v⁺ = v if Δ_{i,k} > 0 else v',   v⁻ the other

β_p = cf_pair_beta; log π(v) sums the log-probs of the tokens that write the span (rounded out to whole tokens)
with v written there. The span term's gradient goes through log π of the sampled value only (d log p / d logit
= 1 − p, nothing when p ≈ 1); this one also raises log π(v') when the edit measured better, even at p(v') ≈ 0.

So the group advantage is shared by every token, while the contrast of one edit lands only on the tokens
of the field it changed (a role, a duty, a capacity level, one dependency). Δ > 0 means the original value
beat the edit, so its tokens are reinforced; Δ < 0 means the edit was better, so they are pushed down.

Why the scaling (the paper writes the term on raw Δ): Â is in units of the group's reward std, so a raw Δ
(reward units, often ~0.1) is lost next to Â (~±1); dividing by the group's s_i puts Δ̃ = Â_i − Â(edit) on
the same scale. σ_min keeps a group whose rewards differ only by price (σ ≈ 0.01) from getting ±1
advantages; c bounds a decisive contrast in such a group; C_i keeps one field's contrast from outweighing
the whole completion's group term, and a_min gives a group of identical specs (Â = 0) a span signal still.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lemon_core.config import GRPOConfig

STD_EPS = 1e-6  # ε: keeps a near-constant group's division finite


def _as_reward_tensor(rewards: Tensor | Sequence[float], name: str = "rewards") -> Tensor:
    r = torch.as_tensor(rewards, dtype=torch.float64) if not isinstance(rewards, Tensor) else rewards.double()
    if r.ndim != 1 or r.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D list/tensor of floats, got shape {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError(f"{name} contains NaN/inf ({r.tolist()}); score invalid specs with a finite penalty")
    return r


def group_stats(
    rewards: Tensor | Sequence[float], group_ids: Tensor | Sequence[Hashable],
) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of a flat batch of groups: (r − group mean, group population std, group is constant).

    Groups may have different sizes and their rows need not be contiguous; ``group_ids`` may be ints or any
    hashables (e.g. (step, task id)). The std of a constant group is exactly 0 (set, not left to rounding).
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


def group_advantages(
    rewards: Tensor | Sequence[float], group_ids: Tensor | Sequence[Hashable] | None = None, std_floor: float = 0.0,
) -> Tensor:
    """Â_n = (r_n − mean(r_g)) / (max(σ_g, std_floor) + ε) for row n of group g (one group if no ids).

    std is the *population* std, so rewards [1, 0, 0, 1] give [+1, −1, −1, +1] (up to ε). A constant group
    carries no preference between its samples and gets exactly zeros. std_floor keeps a group whose rewards
    barely differ from getting full-size advantages: [0.50, 0.52] with floor 0.1 give [−0.1, +0.1].
    Returns float32 of shape [N].
    """
    ids = [0] * len(rewards) if group_ids is None else group_ids
    centred, std, constant = group_stats(rewards, ids)
    adv = centred / contrast_divisor(std, constant, std_floor)
    return torch.where(constant, torch.zeros_like(adv), adv).float()


def contrast_divisor(std: Tensor, constant: Tensor, std_floor: float) -> Tensor:
    """s_n, the divisor of row n's group advantage and of every contrast of its edits: max(σ, std_floor) + ε.

    A constant group (σ = 0) with a floor uses the floor as its unit, so a 0.005 price contrast stays 0.05 while
    a right-vs-wrong contrast is clipped to cf_clip. Without a floor a constant group has no unit of its own
    (dividing by ε would turn a 1e-4 cost difference into a maximal push), so its contrasts keep their size.
    """
    if std_floor > 0:
        return std.clamp(min=std_floor) + STD_EPS
    return torch.where(constant, torch.ones_like(std), std + STD_EPS)


# --- edited-span token masks ----------------------------------------------------------------------------------
def span_token_mask(offsets: Sequence[tuple[int, int]] | Tensor, span: tuple[int, int]) -> Tensor:
    """Bool mask over completion tokens: True where the token's characters overlap span [start, end).

    offsets are the tokenizer's offset_mapping for the completion tokens (char offsets into the
    completion text). Token [a, b) counts iff a < end and b > start: a token only partly inside (BPE merging
    " large" with its leading space) still counts, because its probability decided that value. Zero-width
    tokens (special tokens) never count.
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


def span_mask_from_tokenizer(tokenizer: Any, text: str, span: tuple[int, int]) -> Tensor:
    """span_token_mask for ``text`` tokenized by a HF fast tokenizer (no special tokens added).

    For SFT targets, whose tokens are exactly tokenizer(text); sampled completions carry their own offsets.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer, so it has no offset mapping; "
                         "load it with AutoTokenizer.from_pretrained(..., use_fast=True)")
    if span[1] > len(text):
        raise ValueError(f"span {span!r} ends past the text (length {len(text)})")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return span_token_mask(enc["offset_mapping"], span)


# --- the span term --------------------------------------------------------------------------------------------
def span_term(
    seq_len: int, edits: Sequence[tuple[Tensor, float]], cf_coef: float, divisor: float = 1.0,
    clip: float | None = None,
) -> Tensor:
    """S_t = β · Σ_k m_k,t · clip(Δ_k / divisor, ±clip) for one completion; 0 on every token no edit covers.

    Each edit is (mask over the completion's tokens, Δ = r_original − r_edited). Where spans of several
    edits overlap a token their terms add: each edit is separate evidence about that token. Returns float32.
    """
    if not divisor > 0:
        raise ValueError(f"divisor must be > 0 (a group std + ε, or 1), got {divisor}")
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")
    term = torch.zeros(seq_len, dtype=torch.float32)
    for k, (mask, delta) in enumerate(edits):
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool or mask.shape != (seq_len,):
            raise ValueError(f"edit {k}: mask must be a bool tensor of shape ({seq_len},), got {mask.dtype} "
                             f"{tuple(mask.shape)}; build it with span_token_mask over the completion tokens")
        delta = float(delta)
        if delta != delta or abs(delta) == float("inf"):
            raise ValueError(f"edit {k}: delta={delta} is not finite; r and r_edit must both be finite")
        scaled = delta / divisor
        if clip is not None:
            scaled = max(-clip, min(clip, scaled))
        term = term + mask.float() * (cf_coef * scaled)
    return term


def cap_span_term(term: Tensor, group_adv: float, max_ratio: float | None, ratio_floor: float) -> Tensor:
    """clip(S_t, −C, C) with C = max_ratio · max(|Â|, ratio_floor); max_ratio None leaves S unchanged."""
    if max_ratio is None:
        return term
    bound = max_ratio * max(abs(float(group_adv)), ratio_floor)
    return term.clamp(min=-bound, max=bound)


SpanEdit = tuple[Tensor, float, str]  # (token mask over the completion, Δ = r − r_edit, edit family)


@dataclass
class Credit:
    """What ``credit_advantages`` returns: the token advantages and counts for the step's metrics."""

    advantages: list[Tensor]  # per record, float32 [completion length]
    groups: int  # GRPO groups in the batch
    constant_groups: int  # groups whose samples all got one reward: Â = 0, only span terms can move them
    floored_groups: int  # non-constant groups whose std was below std_floor (their Â were shrunk)
    capped_tokens: int  # span tokens whose term hit the cf_max_ratio cap
    scaled_delta_abs: dict[str, float]  # per edit family: mean |Δ̃| (contrast in advantage units, clipped)
    divisors: list[float] = field(default_factory=list)  # per record: s_i, the unit of its contrasts


def credit_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], lengths: Sequence[int],
    edits: Sequence[Sequence[SpanEdit]], cfg: GRPOConfig,
) -> Credit:
    """Per-token advantages of a batch of completions: A_t = Â + clip(S_t, ±C) (module docstring).

    One row per completion: its total reward, its group key (e.g. (step, task_id)), its number of completion
    tokens, and its counterfactual edits as (token mask, Δ, family).
    """
    n = len(rewards)
    for name, seq in (("group_ids", group_ids), ("lengths", lengths), ("edits", edits)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries, rewards {n}; give one per completion")
    _, std, constant = group_stats(rewards, group_ids)
    group_adv = group_advantages(rewards, group_ids, cfg.std_floor)
    divisors = contrast_divisor(std, constant, cfg.std_floor).tolist()
    out, capped = [], 0
    by_family: dict[str, list[float]] = {}
    for row in range(n):
        adv = float(group_adv[row])
        base = torch.full((lengths[row],), adv, dtype=torch.float32)
        for _, delta, family in edits[row]:
            scaled = abs(float(delta)) / divisors[row]
            by_family.setdefault(str(family), []).append(min(scaled, cfg.cf_clip or scaled))
        if not edits[row] or cfg.cf_coef == 0:
            out.append(base)
            continue
        term = span_term(lengths[row], [(m, d) for m, d, _ in edits[row]], cfg.cf_coef, divisors[row], cfg.cf_clip)
        bounded = cap_span_term(term, adv, cfg.cf_max_ratio, cfg.cf_ratio_floor)
        capped += int((bounded != term).sum())
        out.append(base + bounded)
    first = {k: i for i, k in reversed(list(enumerate(group_ids)))}
    low = (std < cfg.std_floor) & ~constant
    return Credit(
        advantages=out,
        groups=len(first),
        constant_groups=sum(bool(constant[i]) for i in first.values()),
        floored_groups=sum(bool(low[i]) for i in first.values()),
        capped_tokens=capped,
        scaled_delta_abs={f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        divisors=divisors,
    )


# --- the pairwise term: the edit's value against the sampled one -----------------------------------------------
def pair_loss(
    logp_plus: Tensor, ref_plus: Tensor, logp_minus: Tensor, ref_minus: Tensor, weights: Tensor, beta: float,
) -> Tensor:
    """w · −log σ(β · [(log π(v⁺) − log π_ref(v⁺)) − (log π(v⁻) − log π_ref(v⁻))]) per pair (module docstring).

    All inputs are [P]: each value's span log-prob (summed over its tokens) under the policy and the reference,
    and the pair's weight. Bounded below by 0 and, at π = π_ref, equal to w · log 2 with gradient −w · β / 2 on
    log π(v⁺): the better value gains whatever its probability, and the push fades once the policy prefers it by
    more than the reference did by a few 1/β nats (DPO's loss, on one field's two values).
    """
    margin = (logp_plus - ref_plus) - (logp_minus - ref_minus)
    return weights * -F.logsigmoid(beta * margin)


@dataclass
class SpanPair:
    """One edit's two values at one place of a completion, as token ids after a shared prefix.

    ``original`` are the sampled tokens that write the span (every token overlapping it), ``edited`` the same
    characters with the edit's value in place, re-tokenized; both follow ``completion_ids[:prefix]``.
    """

    row: int  # the record (completion) it belongs to
    prefix: int  # completion tokens before the span's first token
    original: list[int]
    edited: list[int]
    weight: float  # w = min(|Δ̃|, cf_clip)
    original_better: bool  # Δ > 0: the sampled value measured better than the edit's


def span_pair_tokens(
    tokenizer: Any, text: str, offsets: Sequence[tuple[int, int]], completion_ids: Sequence[int],
    span: tuple[int, int], value: str,
) -> tuple[int, list[int], list[int]] | None:
    """(prefix length, original span tokens, edited span tokens) of writing ``value`` over ``span``; None if no
    token covers the span or both values tokenize alike.

    The span is rounded out to the sampled tokens overlapping it, [a, b) in characters, so both values are scored
    from the same prefix: the original by its sampled ids, the edit by tokenizing text[a:start] + value +
    text[end:b] (with BPE merging a value with its leading space, as ``span_token_mask`` counts it).
    """
    mask = span_token_mask(offsets, span)
    where = mask.nonzero().flatten().tolist()
    if not where:
        return None
    first, last = where[0], where[-1]
    a, b = offsets[first][0], offsets[last][1]
    piece = text[a : span[0]] + value + text[span[1] : b]
    edited = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
    original = list(completion_ids[first : last + 1])
    if not edited or edited == original:
        return None
    return first, original, edited


def contrast_weight(delta: float, divisor: float, clip: float | None) -> float:
    """w = min(|Δ| / s, c): the pair's weight in the units (and under the clip) of the span term's Δ̃."""
    scaled = abs(float(delta)) / divisor
    return min(scaled, clip) if clip is not None else scaled
