"""The GRPO update: per-token advantages of a batch of rollout records, then one clipped-surrogate
+ KL optimizer step per PPO epoch with gradient accumulation over micro-batches.

The advantages live in ``credit.py`` and the loss in ``grpo.py``; this file only feeds them: it packs
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
from lemon_core.credit import Credit, credit_advantages, span_token_mask
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
    credit = record_credit(records, cfg.grpo) if records else None
    advantages = credit.advantages if credit else []
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
        strategy.reduce_gradients(model)
        sums["grad_norm"] += fsdp.clip_grad_norm(model, cfg.optim.max_grad_norm)
        optimizer.step()
        scheduler.step()
    bar.close()
    model.eval()
    grad_norm = sums.pop("grad_norm")  # identical on every rank after the all-reduce
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
    return metrics


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
