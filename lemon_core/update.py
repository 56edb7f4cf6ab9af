"""The GRPO update: per-token advantages of a batch of rollout records, then one clipped-surrogate
+ KL optimizer step per PPO epoch with gradient accumulation over micro-batches.

The advantages live in ``credit.py`` and the loss in ``grpo.py``; so does the pairwise term (``credit.pair_loss``,
with ``grpo.cf_pair_coef`` > 0), whose rows this file builds: each capacity edit's two levels written at the same
prefix, scored under the policy and the reference and added to the same gradient. This file only feeds them: it packs
records into micro-batches, computes the reference log-probs, scales each micro-batch's loss to the
whole batch (over all ranks) and lets the distributed strategy (``dist.py``) reduce the gradients.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lemon_core import fsdp
from lemon_core.config import GRPOConfig, TrainConfig
from lemon_core.credit import (
    Credit,
    SpanPair,
    contrast_weight,
    credit_advantages,
    pair_loss,
    span_pair_tokens,
    span_token_mask,
)
from lemon_core.dist import FSDP, Replicate, Strategy, all_reduce_sum, sum_over_ranks
from lemon_core.grpo import grpo_loss
from lemon_core.policy import OrchestratorPolicy
from lemon_core.progress import progress as progress_of
from lemon_core.rollout import RolloutRecord


def record_credit(records: Sequence[RolloutRecord], cfg: GRPOConfig) -> Credit:
    """Per-token advantages of each record (``credit.credit_advantages``): the group advantage per (step, task)
    with the std floor, plus the counterfactual span term on each edited span, scaled, clipped and capped
    relative to the group term; with the counts the step's ``credit/*`` metrics report."""
    return credit_advantages(
        [r.reward.total for r in records],
        [(r.step, r.task_id) for r in records],
        [len(r.completion_ids) for r in records],
        [[(span_token_mask(r.offsets, e.span), e.delta, e.family) for e in r.edits if e.span[1] > e.span[0]]
         for r in records],
        cfg,
    )


def record_pairs(records: Sequence[RolloutRecord], credit: Credit, cfg: GRPOConfig, tokenizer: Any) -> list[SpanPair]:
    """The pairwise term's pairs (``credit.pair_loss``): one per edit that wrote another value in the span
    (``EditResult.value``: capacity edits only, ``CounterfactualEdit.value``) and measured a contrast of at least
    ``cf_pair_min_contrast`` in advantage units; Δ = 0 says neither value is better and makes no pair."""
    pairs = []
    for row, r in enumerate(records):
        for e in r.edits:
            if e.value is None or e.delta == 0 or e.span[1] <= e.span[0]:
                continue
            if abs(e.delta) / credit.divisors[row] < cfg.cf_pair_min_contrast:
                continue
            made = span_pair_tokens(tokenizer, r.text, r.offsets, r.completion_ids, e.span, e.value)
            if made is not None:
                prefix, original, edited = made
                weight = contrast_weight(e.delta, credit.divisors[row], cfg.cf_clip)
                pairs.append(SpanPair(row, prefix, original, edited, weight, e.delta > 0))
    return pairs


def pair_rows(records: Sequence[RolloutRecord], pairs: Sequence[SpanPair]) -> tuple[list, list, list[tuple[int, int]]]:
    """(prompts, completions, (start, end) of the value's tokens) of the rows the pairwise term scores: per pair,
    the better value's row then the worse one's, each the completion up to the end of that value's tokens."""
    prompts, completions, spans = [], [], []
    for p in pairs:
        rec = records[p.row]
        prefix = list(rec.completion_ids[: p.prefix])
        ordered = (p.original, p.edited) if p.original_better else (p.edited, p.original)
        for value in ordered:
            prompts.append(rec.prompt_ids)
            completions.append(prefix + list(value))
            spans.append((p.prefix, p.prefix + len(value)))
    return prompts, completions, spans


def span_logprobs(policy: OrchestratorPolicy, prompts: Sequence, completions: Sequence,
                  spans: Sequence[tuple[int, int]], temperature: float, model: Any = None) -> torch.Tensor:
    """log π(value | prompt, prefix) per row: the sum of the log-probs of the tokens in [start, end)."""
    lp, _ = policy.logprob_tensor(prompts, completions, temperature, model=model)
    picked = torch.zeros_like(lp)
    for j, (a, b) in enumerate(spans):
        picked[j, a:b] = 1.0
    return (lp * picked).sum(dim=1)


def pair_reference(policy: OrchestratorPolicy, ref_model: Any, prompts: Sequence, completions: Sequence,
                   spans: Sequence[tuple[int, int]], temperature: float) -> torch.Tensor:
    """log π_ref of each pair row, no grad: the frozen reference where the trainer keeps one (a model, or the
    LoRA base), else the policy before this update (π_old), so the term still compares against a fixed point."""
    with torch.no_grad():
        if ref_model is not None:
            return span_logprobs(policy, prompts, completions, spans, temperature, model=ref_model)
        if hasattr(policy.model, "disable_adapter"):
            with policy.model.disable_adapter():
                return span_logprobs(policy, prompts, completions, spans, temperature)
        return span_logprobs(policy, prompts, completions, spans, temperature)


def constant_groups_figure(row: Any) -> str:
    """``constant_groups=a/b`` from an update's metrics row: of its b groups, the a whose samples all got one reward
    (the group term learns nothing from them); "" for a row without credit figures. The pipeline's update line and
    bench/learning.py's step line both print it."""
    if "credit/groups" not in row:
        return ""
    return f"constant_groups={row['credit/constant_groups']:.0f}/{row['credit/groups']:.0f}"


def record_advantages(records: Sequence[RolloutRecord], cfg: GRPOConfig) -> list[torch.Tensor]:
    """The per-token advantages of ``record_credit``."""
    return record_credit(records, cfg).advantages


def pad_rows(rows: Sequence[Sequence[float] | torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        t = torch.as_tensor(r, dtype=torch.float32)
        out[i, : len(t)] = t
    return out


def grpo_update(
    policy: OrchestratorPolicy,
    ref_model: Any,
    records: Sequence[RolloutRecord],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    cfg: TrainConfig,
    strategy: Strategy | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """One GRPO optimizer step (per PPO epoch) on ``records``; returns loss/kl/clip metrics.

    ``progress``: a bar (terminal) or one log line per micro-batch - on a CPU one micro-batch's forward
    and backward over the long prompt take about a minute.

    Under torchrun ``records`` is this rank's share (whole groups, see ``shard_by_group``). The
    normaliser of the loss - completion tokens for token aggregation, completions for sequence
    aggregation - is summed over ranks first and gradients are summed after backward, so the step
    equals the single-process step on the union of all ranks' records, however the batch is split
    over ranks and micro-batches. Metrics are likewise over all ranks' tokens. A rank with no records
    (fewer groups than ranks) still takes part in every collective and contributes zero gradient.

    A sharded policy (``distributed.strategy: fsdp``) sums gradients inside FSDP's backward instead
    of the replicate strategy's all-reduce; since its forward and backward are collectives, every rank runs as many
    micro-batches as the rank with the most, padding with a one-token micro-batch whose loss is
    multiplied by zero (it contributes nothing, not even to the metrics).
    """
    model = policy.model
    if strategy is None:
        d = cfg.distributed
        sharded = fsdp.is_sharded(model)
        fsdp_strategy = FSDP(cfg.device, d.fsdp_reshard_after_forward, d.fsdp_gather_for_sampling)
        strategy = fsdp_strategy if sharded else Replicate()
    if cfg.grpo.cf_pair_coef > 0 and strategy.sharded:
        # its reference and policy passes run per rank's own pairs, and a sharded forward is a collective
        raise ValueError("grpo.cf_pair_coef > 0 is not supported with distributed.strategy: fsdp (ranks would run "
                         "different numbers of forwards); use the replicate strategy or set cf_pair_coef: 0")
    credit = record_credit(records, cfg.grpo) if records else None
    advantages = credit.advantages if credit else []
    pairs = (record_pairs(records, credit, cfg.grpo, policy.tokenizer)
             if credit is not None and cfg.grpo.cf_pair_coef > 0 else [])
    pair_batches = pair_micro_batches(policy, ref_model, records, pairs, cfg.optim.micro_batch_size)
    total_pairs = all_reduce_sum(float(len(pairs))) if cfg.grpo.cf_pair_coef > 0 else 0.0
    keep = [not (cfg.rollout.mask_truncated and r.truncated) for r in records]  # truncated: no gradient
    total_tokens = all_reduce_sum(float(sum(len(r.completion_ids) for r, k in zip(records, keep, strict=True) if k)))
    total_seqs = all_reduce_sum(float(sum(1 for r, k in zip(records, keep, strict=True) if k and r.completion_ids)))
    mb = cfg.optim.micro_batch_size
    n_micro = strategy.micro_batches(-(-len(records) // mb))
    padding = MicroBatch([[policy.pad_id]], [[policy.pad_id]], [[0.0]], [torch.zeros(1)], 1.0)
    model.train()
    sums: dict[str, float] = defaultdict(float)
    t0 = time.perf_counter()
    bar = progress_of(n_micro * cfg.optim.epochs_per_batch, "grpo update", unit="micro-batch",
                      mode=None if progress else "off")
    for _ in range(cfg.optim.epochs_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for i in range(n_micro):
            batch = records[i * mb : (i + 1) * mb]
            if not batch:  # FSDP only: this rank is out of records but must join the collectives
                loss, _, _ = micro_batch_loss(policy, ref_model, padding, cfg, total_tokens, total_seqs)
                (loss * 0.0).backward()
                continue
            micro = MicroBatch(
                [r.prompt_ids for r in batch],
                [r.completion_ids for r in batch],
                [r.old_logprobs for r in batch],
                advantages[i * mb : (i + 1) * mb],
                batch[0].temperature,
                keep[i * mb : (i + 1) * mb],
            )
            loss, m, tokens = micro_batch_loss(policy, ref_model, micro, cfg, total_tokens, total_seqs)
            loss.backward()
            for k, v in m.items():
                sums[k] += v * (tokens if k != "loss" else 1.0)
            sums["_tokens"] += tokens
            bar.update(1)
        for pair_batch in pair_batches:  # the pairwise term, into the same gradient (a replicate rank's forwards are
            # its own, so ranks may score different numbers of pairs; FSDP is refused above)
            loss, stats = pair_micro_loss(policy, pair_batch, cfg.grpo, total_pairs)
            loss.backward()
            for k, v in stats.items():
                sums[k] += v
        strategy.reduce_gradients(model)
        sums["grad_norm"] += fsdp.clip_grad_norm(model, cfg.optim.max_grad_norm)
        optimizer.step()
        scheduler.step()
    bar.close()
    model.eval()
    grad_norm = sums.pop("grad_norm")  # identical on every rank after the all-reduce
    pair_sums = {k: sums.pop(k, 0.0) for k in ("_pair_loss", "_pair_right", "_pairs")}
    sums = sum_over_ranks(sums)
    n_tok, epochs = max(sums.pop("_tokens", 0.0), 1.0), cfg.optim.epochs_per_batch
    metrics = {k: (v / epochs if k == "loss" else v / n_tok) for k, v in sums.items()}
    metrics["grad_norm"] = grad_norm / epochs
    metrics["update_tokens_per_s"] = n_tok / max(time.perf_counter() - t0, 1e-9)
    metrics["lr"] = scheduler.get_last_lr()[0]
    counts = {"credit/groups": 0.0, "credit/constant_groups": 0.0,
              "credit/floored_groups": 0.0, "credit/capped_tokens": 0.0,
              "truncated_masked": float(sum(not k for k in keep))}
    if credit is not None:
        counts.update({"credit/groups": credit.groups, "credit/constant_groups": credit.constant_groups,
                       "credit/floored_groups": credit.floored_groups, "credit/capped_tokens": credit.capped_tokens})
    metrics.update(sum_over_ranks(counts))  # whole groups live on one rank (shard_by_group): sums are exact
    if cfg.grpo.cf_pair_coef > 0:
        pair_sums = sum_over_ranks(pair_sums)
        scored = max(pair_sums["_pairs"], 1.0)
        metrics["credit/pairs"] = total_pairs
        metrics["credit/pair_loss"] = pair_sums["_pair_loss"] / scored  # mean w · −log σ(β · margin), before the coef
        metrics["credit/pair_pref_acc"] = pair_sums["_pair_right"] / scored  # share whose margin is already > 0
    return metrics


@dataclass
class PairBatch:
    """One micro-batch of the pairwise term: 2 rows per pair (better value, then worse), their reference
    log-probs (fixed for the whole update) and the pairs' weights."""

    prompts: list[list[int]]
    completions: list[list[int]]
    spans: list[tuple[int, int]]
    ref: torch.Tensor  # [2P] log π_ref of each row's value
    weights: torch.Tensor  # [P]
    temperature: float


def pair_micro_batches(policy: OrchestratorPolicy, ref_model: Any, records: Sequence[RolloutRecord],
                       pairs: Sequence[SpanPair], pairs_per_batch: int) -> list[PairBatch]:
    """The pairs in micro-batches of ``pairs_per_batch`` pairs, each with its reference log-probs."""
    out = []
    for lo in range(0, len(pairs), max(pairs_per_batch, 1)):
        chunk = pairs[lo : lo + pairs_per_batch]
        prompts, completions, spans = pair_rows(records, chunk)
        temperature = records[chunk[0].row].temperature
        ref = pair_reference(policy, ref_model, prompts, completions, spans, temperature)
        out.append(PairBatch(prompts, completions, spans, ref.float().cpu(),
                             torch.tensor([p.weight for p in chunk], dtype=torch.float32), temperature))
    return out


def pair_micro_loss(policy: OrchestratorPolicy, batch: PairBatch, cfg: GRPOConfig,
                    total_pairs: float) -> tuple[torch.Tensor, dict[str, float]]:
    """cf_pair_coef · Σ_k w_k ℓ_k / (pairs in the whole step) over this micro-batch's pairs, and its sums for the
    metrics (``_pair_loss`` = Σ w ℓ, ``_pair_right`` = pairs whose margin is > 0, ``_pairs``)."""
    logp = span_logprobs(policy, batch.prompts, batch.completions, batch.spans, batch.temperature)
    ref = batch.ref.to(logp.device, logp.dtype)
    weights = batch.weights.to(logp.device, logp.dtype)
    per_pair = pair_loss(logp[0::2], ref[0::2], logp[1::2], ref[1::2], weights, cfg.cf_pair_beta)
    loss = cfg.cf_pair_coef * per_pair.sum() / max(total_pairs, 1.0)
    with torch.no_grad():
        margin = (logp[0::2] - ref[0::2]) - (logp[1::2] - ref[1::2])
        stats = {"_pair_loss": float(per_pair.sum()), "_pair_right": float((margin > 0).sum()),
                 "_pairs": float(margin.numel())}
    return loss, stats


@dataclass
class MicroBatch:
    prompts: list[list[int]]
    completions: list[list[int]]
    old_logprobs: list[list[float]]
    advantages: Sequence[torch.Tensor]
    temperature: float
    keep: Sequence[bool] | None = None  # per completion: False = masked out of the loss (truncated)


def micro_batch_loss(
    policy: OrchestratorPolicy,
    ref_model: Any,
    micro: MicroBatch,
    cfg: TrainConfig,
    total_tokens: float,
    total_seqs: float,
) -> tuple[torch.Tensor, dict[str, float], float]:
    """(loss, metrics, completion tokens) of one micro-batch; the loss is scaled to the whole batch."""
    lp, mask = policy.logprob_tensor(micro.prompts, micro.completions, micro.temperature)
    if micro.keep is not None:
        mask = mask * torch.tensor(list(micro.keep), dtype=mask.dtype, device=mask.device)[:, None]
        if mask.sum() == 0:  # every completion here is masked: no loss, but keep the graph for backward
            return lp.sum() * 0.0, {}, 0.0
    ref = None
    if cfg.grpo.kl_coef > 0:
        with torch.no_grad():
            ref = ref_logprobs(policy, ref_model, micro.prompts, micro.completions, micro.temperature)
    width = lp.shape[1]
    old = pad_rows(micro.old_logprobs, width).to(lp.device)
    adv = pad_rows(micro.advantages, width).to(lp.device)
    loss, m = grpo_loss(lp, old.to(lp.dtype), ref, adv, mask, cfg.grpo, total_tokens=max(total_tokens, 1.0))
    if cfg.grpo.loss_aggregation == "sequence":  # grpo_loss averages over this micro-batch; reweight to all
        keep = micro.keep or [True] * len(micro.completions)
        kept = sum(1 for c, k in zip(micro.completions, keep, strict=True) if c and k)
        loss = loss * (kept / max(total_seqs, 1.0))
        m["loss"] = loss.item()
    return loss, m, float(mask.sum())


def ref_logprobs(
    policy: OrchestratorPolicy, ref_model: Any, prompts: Any, completions: Any, temperature: float
) -> torch.Tensor:
    if ref_model is not None:
        return policy.logprob_tensor(prompts, completions, temperature, model=ref_model)[0]
    with policy.model.disable_adapter():  # LoRA: the reference is the base weights
        return policy.logprob_tensor(prompts, completions, temperature)[0]
