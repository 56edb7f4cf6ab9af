"""Orchestrator training: SFT warm-up, then N GRPO iterations (rollout -> counterfactuals -> update).

``train(cfg)`` is what ``lemon train --config configs/train-cpu.yaml`` runs:

1. Load tasks (benchmarks or a tasks JSONL), hold out ``eval_tasks`` of them for periodic evaluation.
2. SFT warm-up on templated valid specs (``sft.py``); the result is saved as ``<out>/sft-model`` and is
   also the frozen reference of the KL term. Valid-spec rate is measured before and after.
3. Each iteration (= one optimizer step): take the next ``tasks_per_iteration`` tasks in the seeded
   data order, collect rollouts (``rollout.py``), write them as a shard, and update the policy with
   ``grpo_update``: token advantages = group advantage + localized counterfactual term on the
   edited spans, clipped surrogate + k3 KL (``grpo.py``), gradient accumulation over micro-batches,
   grad clipping, AdamW.
4. Metrics per step go to ``<out>/metrics.jsonl``; the reward curve to ``<out>/reward_curve.png``.

Exact resume. The data order is a pure function of (seed, step) and every sampling call is seeded
with (seed, step), so a run resumed from checkpoint k replays steps k+1.. exactly as an uninterrupted
run would. A checkpoint holds the model (``save_pretrained``, safetensors), optimizer, scheduler,
RNG states, the edit-family sampler and the step. It is written to ``ckpt-N.tmp``, renamed to
``ckpt-N``, and only then is the ``latest`` pointer replaced (``os.replace``), so a kill at any moment
leaves the last good checkpoint intact.

Multi-GPU/multi-node: under ``torchrun`` every rank holds a full replica (data parallel, like DDP
without the wrapper) and takes its own slice of the step's tasks, so every GRPO group lives on one
rank. The loss normaliser (token count) is summed over ranks before backward and gradients are summed
after it, so the step equals the single-process step on the whole batch (tested with 2 gloo ranks in
tests/test_train_distributed.py). Records are then gathered so the metrics and the edit-family
sampler cover all ranks; rank 0 writes checkpoints (with every rank's RNG state) and metrics. See
docs/training.md for the launch.

``distributed.strategy: fsdp`` shards parameters, gradients and AdamW state over the ranks instead
(PyTorch FSDP2, ``fsdp.py``), for models whose full fine-tuning does not fit one GPU. The step is the
same sum over ranks (FSDP's reduce-scatter sums instead of averaging). Because forward and backward
are then collectives, ranks run equal numbers of micro-batches (padding with zero-loss ones) and
sample in lockstep, the KL reference is sharded too, evaluation is split over all ranks, and
checkpoints are gathered to rank 0 and written as the same plain HF folders (tested in
tests/test_train_fsdp.py, including equality with the single-process update and --resume).

LoRA (``lora.enabled``, peft): only adapters train; the adapter-disabled base is the KL reference;
checkpoints hold the adapter only and load for sampling as they are or via ``merge_lora_checkpoint``.

Sampling on GPU (``rollout.sampler: vllm``): each rank starts a vLLM engine (``vllm_sampler.py``) on
the current weights and, after every update, hands it the new ones (``policy.sync_sampler``: a plain
HF folder reloaded in place, or for LoRA just the new adapter on the engine's frozen base). Records
are built by the policy either way, so the loss never sees the sampler's own logprobs.
``spec_format: json`` + ``rollout.vllm.guided_json`` constrain samples to the spec's JSON schema.
See docs/training.md.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lemon_core import fsdp
from lemon_core.counterfactual import EditFamily, EditFamilySampler
from lemon_core.executor import execute_specs
from lemon_core.grpo import (
    GRPOConfig,
    batched_group_advantages,
    contrast_divisors,
    counterfactual_token_advantages,
    grpo_loss,
    span_token_mask,
    token_advantages,
)
from lemon_core.models import resolve_model
from lemon_core.policy import OrchestratorPolicy, SpecFormat
from lemon_core.pool import CapacityPool, load_pool
from lemon_core.reward import RewardConfig, compute_reward
from lemon_core.rollout import (
    RolloutConfig,
    RolloutRecord,
    RolloutStats,
    Scorer,
    attach_sampler,
    benchmark_scorer,
    collect_rollouts,
    parse_completion,
    write_records,
)
from lemon_core.sft import SFTConfig, sft_pairs, sft_train, valid_spec_rate

LATEST = "latest"
DIST_TIMEOUT_MIN = 60  # collective/barrier timeout under torchrun


# --- configuration --------------------------------------------------------------------------------
class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmarks: list[str] = Field(default_factory=lambda: ["multiarith"], description="benchmark names")
    split: str | None = Field(None, description="split to train on (default: each benchmark's default)")
    limit: int | None = Field(64, ge=1, description="tasks per benchmark")
    data_dir: str | None = Field(
        None, description="raw datasets folder (default $LEMON_DATA_DIR or ../shared/datasets)"
    )
    tasks_jsonl: str | None = Field(None, description="instead of benchmarks: JSONL of Example rows")
    eval_tasks: int = Field(4, ge=0, description="tasks held out for periodic evaluation")


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(4, ge=1, description="completions per forward/backward (grad accumulation)")
    epochs_per_batch: int = Field(1, ge=1, description="optimizer steps on each rollout batch (PPO epochs)")


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class DistributedConfig(BaseModel):
    """How the torchrun ranks share the policy (ignored by a single process); docs/training.md."""

    model_config = ConfigDict(extra="forbid")

    strategy: Literal["replicate", "fsdp"] = Field(
        "replicate",
        description="replicate: every rank holds the full model, gradients are all-reduced (DDP-like; the "
        "fastest when model + gradients + AdamW state fit one GPU). fsdp: parameters, gradients and "
        "optimizer state are sharded over the ranks with PyTorch FSDP2 (lemon_core/fsdp.py), for models "
        "whose full fine-tuning does not fit one GPU (e.g. 7B full fine-tuning); forward/backward then "
        "all-gather weights and sampling runs in lockstep over ranks",
    )
    fsdp_reshard_after_forward: bool = Field(
        True,
        description="fsdp: free each layer's gathered weights after forward and gather them again for "
        "backward (least memory, ZeRO-3); false keeps them until backward (less communication, ZeRO-2-like)",
    )
    fsdp_gather_for_sampling: bool = Field(
        True,
        description="fsdp: keep the full weights gathered while sampling rollouts and evaluating, so a "
        "decoding step needs no all-gather (one full copy of the bf16 weights per GPU meanwhile); set false "
        "when the weights alone do not fit one GPU, at the cost of an all-gather of the model per token",
    )


class TrainConfig(BaseSettings):
    """Everything ``lemon train`` needs; YAML file + ``LEMON_*`` env (nested: ``LEMON_OPTIM__LR=1e-5``)."""

    model_config = SettingsConfigDict(env_prefix="LEMON_", env_nested_delimiter="__", extra="forbid")

    model: str = Field(
        "smollm2-135m-instruct", description="orchestrator: local path, `lemon models` alias or HF id"
    )
    pool: str = Field("cpu", description="pool YAML path or built-in name (cpu, gpu, simulated)")
    out: str = Field("runs/train", description="output folder (checkpoints, metrics, plots, rollouts)")
    seed: int = 0
    device: str = "cpu"
    dtype: str = Field("auto", description="auto (bf16 on a bf16 GPU, else fp32), float32, bfloat16")
    include_roles: bool = Field(True, description="list the base-role library in the orchestrator prompt")
    include_format: bool = Field(True, description="show the YAML format + example in the prompt")
    spec_format: SpecFormat = Field(
        "yaml",
        description="how the orchestrator writes specs: yaml (a ```yaml block) or json (a bare JSON object; "
        "needed by rollout.vllm.guided_json). Prompt, SFT targets and serving follow it",
    )
    agent_max_tokens: int | None = Field(
        None, ge=1, description="cap every pool level's max_tokens (CPU runs)"
    )
    iterations: int = Field(3, ge=0, description="GRPO steps")
    tasks_per_iteration: int = Field(2, ge=1)
    checkpoint_every: int = Field(1, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    eval_every: int = Field(
        0, ge=0, description="evaluate on the held-out tasks every N steps (0: only at the end)"
    )
    save_rollouts: bool = True
    progress: bool = True
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @model_validator(mode="after")
    def _sampler_settings_agree(self) -> TrainConfig:
        if self.rollout.sampler == "vllm" and self.rollout.vllm.guided_json and self.spec_format != "json":
            raise ValueError(
                "rollout.vllm.guided_json constrains samples to the spec's JSON schema, so it needs "
                f"spec_format: json (got {self.spec_format!r}); set spec_format: json or guided_json: false"
            )
        if self.rollout.sampler == "vllm" and self.distributed.strategy == "fsdp":
            raise ValueError(
                "rollout.sampler=vllm with distributed.strategy=fsdp is not supported yet: the vLLM engines "
                "would need the sharded weights gathered on every rank after each update; use "
                "rollout.sampler: transformers with fsdp, or strategy: replicate (LoRA for large models)"
            )
        return self

    @model_validator(mode="after")
    def _fsdp_without_lora(self) -> TrainConfig:
        if self.distributed.strategy == "fsdp" and self.lora.enabled:
            raise ValueError(
                "distributed.strategy=fsdp with lora.enabled is not supported: LoRA trains a small adapter "
                "on a frozen base that fits one GPU, so use distributed.strategy: replicate (or disable lora)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings  # environment overrides the YAML file

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """Load a YAML config (a bundled name like ``train-cpu`` also works); ``overrides`` win over both."""
        p = Path(path)
        if not p.exists():
            bundled = Path(__file__).parent / "configs" / (p.name if p.suffix else f"{p.name}.yaml")
            if not bundled.exists():
                raise FileNotFoundError(f"config {str(path)!r} not found (nor bundled as {bundled.name})")
            p = bundled
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{p}: a train config is a YAML mapping of fields, got {type(data).__name__}")
        cfg = cls(**data)
        return cfg.model_copy(update=overrides) if overrides else cfg


# --- data order -----------------------------------------------------------------------------------
def load_tasks(cfg: DataConfig, seed: int) -> tuple[list[Any], list[Any]]:
    """(train, held-out eval) tasks, shuffled once with ``seed``."""
    from lemon_core.benchmarks import Example, get

    if cfg.tasks_jsonl:
        rows = [json.loads(line) for line in Path(cfg.tasks_jsonl).read_text().splitlines() if line.strip()]
        tasks = [Example.model_validate(r) for r in rows]
    else:
        tasks = [ex for name in cfg.benchmarks for ex in get(name).load(cfg.split, cfg.limit, cfg.data_dir)]
    random.Random(seed).shuffle(tasks)
    if len(tasks) <= cfg.eval_tasks:
        raise ValueError(
            f"data: {len(tasks)} tasks but eval_tasks={cfg.eval_tasks}; raise data.limit "
            "or lower data.eval_tasks"
        )
    return tasks[cfg.eval_tasks :], tasks[: cfg.eval_tasks]


def tasks_for_step(tasks: Sequence[Any], step: int, n: int, seed: int) -> list[Any]:
    """The n tasks of GRPO step ``step`` (1-based): epochs of seeded permutations, a pure function."""
    out = []
    for k in range((step - 1) * n, step * n):
        epoch, pos = divmod(k, len(tasks))
        order = list(range(len(tasks)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(tasks[order[pos]])
    return out


# --- distributed (torchrun) -----------------------------------------------------------------------
def world(device: str | None = None) -> tuple[int, int]:
    """(rank, world size); initialises torch.distributed when launched by torchrun.

    The backend follows the device the ranks train on (NCCL for CUDA, gloo for CPU), not merely
    whether a GPU exists, so a CPU run on a GPU box still works. Each rank is pinned to GPU
    ``LOCAL_RANK`` first, so a config saying just ``cuda`` puts every rank on its own GPU (``.to("cuda")``
    means the current device) and NCCL object collectives know which device to use. The timeout is
    generous because rank 0 alone writes checkpoints and runs the final evaluation while the others
    wait at a barrier.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return 0, 1
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            "nccl" if use_cuda else "gloo", timeout=timedelta(minutes=DIST_TIMEOUT_MIN)
        )
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _all_reduce_sum(value: float) -> float:
    if not _distributed():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_comm_device())
    torch.distributed.all_reduce(t)
    return float(t.item())


def _all_reduce_max(value: int) -> int:
    if not _distributed():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


def _sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Sum float metrics over ranks by key (a rank without records may lack some keys)."""
    total: dict[str, float] = defaultdict(float)
    for part in _all_gather(dict(values)):
        for k, v in part.items():
            total[k] += v
    return dict(total)


def _comm_device() -> torch.device:
    backend = torch.distributed.get_backend()
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def _all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum every trainable parameter's gradient over ranks (what DDP does, without wrapping the model).

    Each rank's loss is already divided by the *global* token (or sequence) count, so the sum is the
    gradient of the full batch. A trainable parameter that got no gradient on this rank contributes
    zeros: skipping it would leave the ranks issuing different collectives and hang.
    """
    if not _distributed():
        return
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad)


def _all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (a one-element list when not distributed)."""
    if not _distributed():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def shard_by_group(records: Sequence[RolloutRecord], rank: int, world_size: int) -> list[RolloutRecord]:
    """This rank's records when one batch of rollout records is split over ranks.

    Whole GRPO groups (step, task) go to one rank, round-robin in order of first appearance: the group
    advantage is a mean/std over the group, so a group split over ranks would get a different
    advantage on each rank. (A plain ``records[rank::world]`` splits every group.)
    """
    keys = list(dict.fromkeys((r.step, r.task_id) for r in records))
    mine = {k for i, k in enumerate(keys) if i % world_size == rank}
    return [r for r in records if (r.step, r.task_id) in mine]


# --- the update -----------------------------------------------------------------------------------
def record_advantages(records: Sequence[RolloutRecord], cfg: GRPOConfig) -> list[torch.Tensor]:
    """Per-token advantages of each record: group advantage (per step+task) + counterfactual span term.

    Each edit's Δ is divided by its group's contrast divisor (cf_delta_scale) and clipped (cf_clip)
    before weighting; see lemon_core.grpo.contrast_divisors.
    """
    rewards = [r.reward.total for r in records]
    groups = [(r.step, r.task_id) for r in records]
    group_adv = batched_group_advantages(rewards, groups, std_eps=cfg.std_eps, scale=cfg.scale_rewards)
    divisors = contrast_divisors(rewards, groups, cfg)
    out = []
    for rec, adv, divisor in zip(records, group_adv.tolist(), divisors, strict=True):
        n = len(rec.completion_ids)
        edits = [(span_token_mask(rec.offsets, e.span), e.delta) for e in rec.edits if e.span[1] > e.span[0]]
        cf = (
            counterfactual_token_advantages(
                n, edits, cfg.cf_coef, cfg.cf_weight_by_abs_delta, delta_divisor=divisor, delta_clip=cfg.cf_clip
            )
            if edits
            else None
        )
        out.append(token_advantages(adv, n, cf))
    return out


def _pad(rows: Sequence[Sequence[float] | torch.Tensor], width: int) -> torch.Tensor:
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
) -> dict[str, float]:
    """One GRPO optimizer step (per PPO epoch) on ``records``; returns loss/kl/clip metrics.

    Under torchrun ``records`` is this rank's share (whole groups, see ``shard_by_group``). The
    normaliser of the loss - completion tokens for token aggregation, completions for sequence
    aggregation - is summed over ranks first and gradients are summed after backward, so the step
    equals the single-process step on the union of all ranks' records, however the batch is split
    over ranks and micro-batches. Metrics are likewise over all ranks' tokens. A rank with no records
    (fewer groups than ranks) still takes part in every collective and contributes zero gradient.

    A sharded policy (``distributed.strategy: fsdp``) sums gradients inside FSDP's backward instead
    of ``_all_reduce_grads``; since its forward and backward are collectives, every rank runs as many
    micro-batches as the rank with the most, padding with a one-token micro-batch whose loss is
    multiplied by zero (it contributes nothing, not even to the metrics).
    """
    advantages = record_advantages(records, cfg.grpo) if records else []
    total_tokens = _all_reduce_sum(float(sum(len(r.completion_ids) for r in records)))
    total_seqs = _all_reduce_sum(float(sum(1 for r in records if r.completion_ids)))
    model = policy.model
    sharded = fsdp.is_sharded(model)
    mb = cfg.optim.micro_batch_size
    n_micro = -(-len(records) // mb)
    if sharded:
        n_micro = _all_reduce_max(n_micro)
    padding = _MicroBatch([[policy.pad_id]], [[policy.pad_id]], [[0.0]], [torch.zeros(1)], 1.0)
    model.train()
    sums: dict[str, float] = defaultdict(float)
    t0 = time.perf_counter()
    for _ in range(cfg.optim.epochs_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for i in range(n_micro):
            batch = records[i * mb : (i + 1) * mb]
            if not batch:  # FSDP only: this rank is out of records but must join the collectives
                loss, _, _ = _micro_batch_loss(policy, ref_model, padding, cfg, total_tokens, total_seqs)
                (loss * 0.0).backward()
                continue
            micro = _MicroBatch(
                [r.prompt_ids for r in batch],
                [r.completion_ids for r in batch],
                [r.old_logprobs for r in batch],
                advantages[i * mb : (i + 1) * mb],
                batch[0].temperature,
            )
            loss, m, tokens = _micro_batch_loss(policy, ref_model, micro, cfg, total_tokens, total_seqs)
            loss.backward()
            for k, v in m.items():
                sums[k] += v * (tokens if k != "loss" else 1.0)
            sums["_tokens"] += tokens
        if not sharded:
            _all_reduce_grads(model)
        sums["grad_norm"] += fsdp.clip_grad_norm(model, cfg.optim.max_grad_norm)
        optimizer.step()
        scheduler.step()
    model.eval()
    grad_norm = sums.pop("grad_norm")  # identical on every rank after the all-reduce
    sums = _sum_over_ranks(sums)
    n_tok, epochs = max(sums.pop("_tokens", 0.0), 1.0), cfg.optim.epochs_per_batch
    metrics = {k: (v / epochs if k == "loss" else v / n_tok) for k, v in sums.items()}
    metrics["grad_norm"] = grad_norm / epochs
    metrics["update_tokens_per_s"] = n_tok / max(time.perf_counter() - t0, 1e-9)
    metrics["lr"] = scheduler.get_last_lr()[0]
    return metrics


@dataclass
class _MicroBatch:
    prompts: list[list[int]]
    completions: list[list[int]]
    old_logprobs: list[list[float]]
    advantages: Sequence[torch.Tensor]
    temperature: float


def _micro_batch_loss(
    policy: OrchestratorPolicy,
    ref_model: Any,
    micro: _MicroBatch,
    cfg: TrainConfig,
    total_tokens: float,
    total_seqs: float,
) -> tuple[torch.Tensor, dict[str, float], float]:
    """(loss, metrics, completion tokens) of one micro-batch; the loss is scaled to the whole batch."""
    lp, mask = policy.logprob_tensor(micro.prompts, micro.completions, micro.temperature)
    ref = None
    if cfg.grpo.kl_coef > 0:
        with torch.no_grad():
            ref = _ref_logprobs(policy, ref_model, micro.prompts, micro.completions, micro.temperature)
    width = lp.shape[1]
    old = _pad(micro.old_logprobs, width).to(lp.device)
    adv = _pad(micro.advantages, width).to(lp.device)
    loss, m = grpo_loss(lp, old.to(lp.dtype), ref, adv, mask, cfg.grpo, total_tokens=total_tokens)
    if cfg.grpo.loss_aggregation == "sequence":  # grpo_loss averages over this micro-batch; reweight to all
        loss = loss * (sum(1 for c in micro.completions if c) / total_seqs)
        m["loss"] = loss.item()
    return loss, m, float(mask.sum())


def _ref_logprobs(
    policy: OrchestratorPolicy, ref_model: Any, prompts: Any, completions: Any, temperature: float
) -> torch.Tensor:
    if ref_model is not None:
        return policy.logprob_tensor(prompts, completions, temperature, model=ref_model)[0]
    with policy.model.disable_adapter():  # LoRA: the reference is the base weights
        return policy.logprob_tensor(prompts, completions, temperature)[0]


# --- metrics --------------------------------------------------------------------------------------
def rollout_metrics(records: Sequence[RolloutRecord], levels: Sequence[str]) -> dict[str, Any]:
    valid = [r for r in records if r.valid]
    totals = [r.reward.total for r in records]
    m: dict[str, Any] = {
        "reward/mean": statistics.fmean(totals),
        "reward/std": statistics.pstdev(totals),
        "valid_rate": len(valid) / len(records),
    }
    for term in ("success", "efficiency", "structure", "cost", "invalid"):
        m[f"reward/{term}"] = statistics.fmean(getattr(r.reward, term) for r in records)
    if valid:
        m["score"] = statistics.fmean(r.score for r in valid)
        m["tokens_per_execution"] = statistics.fmean(r.tokens for r in valid)
        m["cost"] = statistics.fmean(r.cost for r in valid)
    specs = [r.spec for r in valid if r.spec]  # records read back without their spec have none
    if specs:
        m["agents/mean"] = statistics.fmean(len(spec["agents"]) for spec in specs)
        agents = [a for spec in specs for a in spec["agents"]]
        for level in levels:
            m[f"capacity/{level}"] = sum(a["capacity"] == level for a in agents) / len(agents)
    by_family: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for e in r.edits:
            by_family[e.family].append(e.delta)
    for family in EditFamily:
        if by_family[family.value]:
            m[f"delta/{family.value}"] = statistics.fmean(by_family[family.value])
            m[f"delta_abs/{family.value}"] = statistics.fmean(abs(d) for d in by_family[family.value])
    m["completion_tokens"] = statistics.fmean(len(r.completion_ids) for r in records)
    return m


def evaluate_policy(
    policy: OrchestratorPolicy,
    tasks: Sequence[Any],
    pool: CapacityPool,
    cfg: TrainConfig,
    scorer: Scorer,
    seed: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, float]:
    """Greedy spec per held-out task, executed and scored.

    Returns eval/valid_rate, eval/score, eval/reward and eval/cost. With ``world_size > 1`` every rank
    must call it (a sharded policy samples collectively): the tasks are split over ranks, each rank
    samples the same number of prompts (a short share is padded with a task whose result is dropped
    unexecuted), and the per-task outcomes are gathered, so every rank returns the metrics of all tasks.
    """
    if not tasks:
        return {}
    share = list(tasks[rank::world_size])
    per_rank = -(-len(tasks) // world_size)
    padded = share + [tasks[0]] * (per_rank - len(share))
    mine = _eval_outcomes(policy, padded, len(share), pool, cfg, scorer, seed)
    outcomes = [o for part in _all_gather(mine) for o in part] if world_size > 1 else mine
    costs = [cost for _, _, _, cost in outcomes if cost is not None]
    return {
        "eval/valid_rate": sum(valid for valid, _, _, _ in outcomes) / len(outcomes),
        "eval/score": statistics.fmean(score for _, score, _, _ in outcomes),
        "eval/reward": statistics.fmean(reward for _, _, reward, _ in outcomes),
        "eval/cost": statistics.fmean(costs) if costs else 0.0,
    }


def _eval_outcomes(
    policy: OrchestratorPolicy,
    tasks: Sequence[Any],
    n_real: int,
    pool: CapacityPool,
    cfg: TrainConfig,
    scorer: Scorer,
    seed: int,
) -> list[tuple[bool, float, float, float | None]]:
    """(valid, score, reward, cost or None) of the first ``n_real`` tasks; all of ``tasks`` are sampled."""
    prompts = [policy.prompt_ids(t.question, pool) for t in tasks]
    samples = [
        g[0]
        for g in policy.sample(
            prompts, 1, max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0, seed=seed
        )
    ][:n_real]
    outcomes: list[tuple[bool, float, float, float | None]] = []
    valid = []
    for task, s in zip(tasks[:n_real], samples, strict=True):
        parsed, _ = parse_completion(s.text, pool)
        if parsed is not None:
            valid.append((task, parsed.spec))
        else:
            outcomes.append((False, 0.0, compute_reward(0.0, None, cfg.reward).total, None))
    traces = execute_specs([sp for _, sp in valid], [t for t, _ in valid], pool, seed=seed)
    for (task, _), trace in zip(valid, traces, strict=True):
        score = scorer(trace.answer, task) if trace.ok else 0.0
        outcomes.append((True, score, compute_reward(score, trace, cfg.reward).total, trace.cost))
    return outcomes


# --- checkpoints ----------------------------------------------------------------------------------
def _save_model_dir(
    policy: OrchestratorPolicy,
    final: Path,
    extra: Callable[[Path], None] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """save_pretrained into ``final.tmp``, then rename: ``final`` is either complete or absent.

    ``state_dict``: the full weights to write instead of the model's own (an FSDP-sharded policy, whose
    ``fsdp.full_state`` was gathered on this rank).
    """
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if state_dict is not None:
        policy.model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    else:
        policy.model.save_pretrained(tmp, safe_serialization=True)
    policy.tokenizer.save_pretrained(tmp)
    if extra is not None:
        extra(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    out: Path,
    step: int,
    policy: OrchestratorPolicy,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    sampler: EditFamilySampler,
    keep: int,
    rng_by_rank: list[tuple[torch.Tensor, Any]] | None = None,
    full_state: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> Path:
    """Write ``ckpt-N`` atomically (call on rank 0 only; nothing in here is a collective).

    ``rng_by_rank`` holds every rank's (torch, python) RNG state under torchrun, so each rank resumes
    with its own generators; without it the caller's RNG state is saved. ``full_state`` is (model,
    optimizer) state gathered by ``fsdp.full_state`` for a sharded policy, written instead of the
    policy's and optimizer's own (shards); the checkpoint is the same plain HF folder either way.
    """
    model_state, optimizer_state = full_state if full_state is not None else (None, optimizer.state_dict())
    ckpt_dir = out / "checkpoints"
    final = ckpt_dir / f"ckpt-{step:06d}"

    def extra(tmp: Path) -> None:
        state = {
            "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(),
            "rng_torch": torch.get_rng_state(),
            "rng_python": random.getstate(),
        }
        if rng_by_rank is not None:
            state["rng_by_rank"] = rng_by_rank
        torch.save(state, tmp / "training_state.pt")
        (tmp / "trainer_state.json").write_text(
            json.dumps(
                {
                    "step": step,
                    "data_position": step,
                    "sampler": {f.value: v for f, v in sampler.mean_abs_delta.items()},
                },
                indent=2,
            )
        )

    _save_model_dir(policy, final, extra, state_dict=model_state)
    _write_atomic(ckpt_dir / LATEST, final.name)
    for old in sorted(ckpt_dir.glob("ckpt-*")):
        if old.name.endswith(".tmp") or old.name >= f"ckpt-{step - keep + 1:06d}" or old == final:
            continue
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out: Path) -> Path | None:
    pointer = out / "checkpoints" / LATEST
    if not pointer.exists():
        return None
    path = out / "checkpoints" / pointer.read_text().strip()
    return path if (path / "trainer_state.json").exists() else None


# --- the run --------------------------------------------------------------------------------------
class TrainResult(BaseModel):
    out: str
    steps: int
    metrics: list[dict[str, Any]]
    valid_rate_before_sft: float | None = None
    valid_rate_after_sft: float | None = None
    seconds_per_iteration: float | None = None
    reward_curve: str | None = None


def sft_valid_rate(policy: OrchestratorPolicy, questions: Sequence[str], pool: CapacityPool,
                   cfg: TrainConfig) -> float:
    """Valid-spec rate of ``policy`` on ``questions``, sampled as rollouts sample (before/after SFT)."""
    return valid_spec_rate(
        policy, questions, pool, samples=cfg.sft.eval_samples, max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature, seed=cfg.seed,
    )


def load_policy(cfg: TrainConfig, name_or_path: str, device: str | None = None) -> OrchestratorPolicy:
    """The policy at ``name_or_path`` with ``cfg``'s prompt settings (roles, format, spec_format) and
    dtype: every stage loads it this way, so all of them prompt it exactly as it was trained."""
    return OrchestratorPolicy.load(
        name_or_path, device or cfg.device, resolve_dtype(cfg), cfg.include_roles, cfg.include_format,
        cfg.spec_format,
    )  # fmt: skip


def resolve_dtype(cfg: TrainConfig) -> str:
    if cfg.dtype != "auto":
        return cfg.dtype
    return "bfloat16" if cfg.device.startswith("cuda") and torch.cuda.is_bf16_supported() else "float32"


def load_train_pool(cfg: TrainConfig) -> CapacityPool:
    pool = load_pool(cfg.pool)
    if cfg.agent_max_tokens is not None:
        pool.levels = [
            lv.model_copy(update={"max_tokens": min(lv.max_tokens, cfg.agent_max_tokens)})
            for lv in pool.levels
        ]
    return pool


def _import_peft() -> Any:
    try:
        import peft
    except ImportError as e:
        raise RuntimeError(
            "lora.enabled needs peft: pip install peft==0.21.2 (or set lora.enabled: false)"
        ) from e
    return peft


def _apply_lora(
    policy: OrchestratorPolicy, cfg: LoraSettings, base: str, adapter: Path | None = None
) -> None:
    """Wrap the policy in LoRA adapters: fresh ones, or the trainable adapters of checkpoint ``adapter``.

    Only the adapters train; the frozen base doubles as the KL reference (``disable_adapter``), so no
    second copy of the model is held. ``base`` (where the base weights were loaded from) is written
    into the adapter config as an absolute path when it is a local folder, so a checkpoint loads for
    sampling from any working directory: ``from_pretrained(ckpt)`` (transformers attaches the
    adapter) or ``merge_lora_checkpoint`` for a plain model folder.
    """
    peft = _import_peft()
    if adapter is not None:
        policy.model = peft.PeftModel.from_pretrained(policy.model, adapter, is_trainable=True)
    else:
        policy.model = peft.get_peft_model(
            policy.model,
            peft.LoraConfig(
                r=cfg.r,
                lora_alpha=cfg.alpha,
                lora_dropout=cfg.dropout,
                target_modules=cfg.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    local = Path(base).expanduser()
    for adapter_cfg in policy.model.peft_config.values():
        adapter_cfg.base_model_name_or_path = str(local.resolve()) if local.exists() else base


def merge_lora_checkpoint(checkpoint: str | Path, dest: str | Path) -> Path:
    """Fold a LoRA checkpoint's adapters into its base weights and save a plain HF model folder.

    The result loads anywhere a full checkpoint does (transformers backend, vLLM, ``lemon serve``)
    without peft; written atomically like every other model folder.
    """
    from transformers import AutoTokenizer

    peft = _import_peft()
    src, final = Path(checkpoint), Path(dest)
    if not (src / "adapter_config.json").exists():
        raise ValueError(f"{src} has no adapter_config.json: not a LoRA checkpoint (nothing to merge)")
    model = peft.AutoPeftModelForCausalLM.from_pretrained(src).merge_and_unload()
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final


class _Log:
    """metrics.jsonl writer (rank 0 only); on resume, rows past the checkpoint are dropped."""

    def __init__(self, path: Path, keep_until: int | None, enabled: bool) -> None:
        self.path, self.enabled = path, enabled
        self.rows: list[dict[str, Any]] = []
        if enabled and path.exists() and keep_until is not None:
            self.rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            self.rows = [r for r in self.rows if r.get("step", 0) <= keep_until]
            _write_atomic(path, "".join(json.dumps(r) + "\n" for r in self.rows))
        elif enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.enabled:
            with self.path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")


def uses_fsdp(cfg: TrainConfig, world_size: int) -> bool:
    """FSDP sharding is on: ``distributed.strategy: fsdp`` under torchrun (one process has nothing to shard)."""
    return cfg.distributed.strategy == "fsdp" and world_size > 1


def shard_for_training(policy: OrchestratorPolicy, ref_model: Any, cfg: TrainConfig) -> None:
    """Shard the policy (and the frozen KL reference: a full replica per GPU would cost what sharding the
    policy saves) with FSDP2 over all ranks; build the optimizer afterwards, on the shards."""
    fsdp.shard_policy(policy, cfg.device, cfg.distributed.fsdp_reshard_after_forward)
    if ref_model is not None:
        fsdp.shard_model(ref_model, cfg.device, reshard_after_forward=True)


def sampling(policy: OrchestratorPolicy, cfg: TrainConfig) -> AbstractContextManager[None]:
    """Context for sampling from the policy: with FSDP the full weights stay gathered meanwhile
    (``distributed.fsdp_gather_for_sampling``) and are resharded after; otherwise nothing."""
    return fsdp.gathered_for_sampling(
        policy.model, cfg.distributed.fsdp_gather_for_sampling, cfg.distributed.fsdp_reshard_after_forward
    )


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """A checkpoint's optimizer state (``Optimizer.state_dict`` form, either strategy) into ``optimizer``;
    for a sharded model each rank keeps its shard (every rank calls this)."""
    if fsdp.is_sharded(model):
        fsdp.load_optimizer_state(model, optimizer, state)
    else:
        optimizer.load_state_dict(state)


def _merge_ranks(
    records: list[RolloutRecord],
    stats: RolloutStats,
    sampler: EditFamilySampler,
    sampler_before: dict[EditFamily, float],
) -> tuple[list[RolloutRecord], RolloutStats]:
    """All ranks' records and summed stats of this step; every rank's sampler replays every |Delta|.

    Each rank's sampler only saw its own counterfactual contrasts; replaying all of them in rank order
    from the pre-rollout state leaves the same sampler on every rank (what rank 0 checkpoints is then
    what every rank resumes with), and the step's metrics cover the whole batch, not rank 0's slice.
    """
    gathered = _all_gather((records, stats.model_dump()))
    sampler.mean_abs_delta = dict(sampler_before)
    merged: list[RolloutRecord] = [r for recs, _ in gathered for r in recs]
    for r in merged:
        for e in r.edits:
            sampler.update(EditFamily(e.family), e.delta)
    total = RolloutStats()
    for _, st in gathered:
        for k, v in st.items():
            setattr(total, k, getattr(total, k) + v)
    return merged, total


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    examples: tuple[list[Any], list[Any]] | None = None,
    scorer: Scorer = benchmark_scorer,
) -> TrainResult:
    """SFT warm-up then ``cfg.iterations`` GRPO steps; see the module docstring. ``examples`` =
    (train, eval) tasks overrides ``cfg.data``; ``scorer`` overrides benchmark scoring (tests)."""
    from tqdm.auto import tqdm

    from lemon_core.backends.simulated import register_examples

    rank, world_size = world(cfg.device)
    is_main = rank == 0
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if is_main:
        (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    train_tasks, eval_tasks = examples if examples is not None else load_tasks(cfg.data, cfg.seed)
    pool = load_train_pool(cfg)
    if any(lv.backend == "simulated" for lv in pool.levels):
        register_examples([*train_tasks, *eval_tasks])
    dtype = resolve_dtype(cfg)
    ckpt = latest_checkpoint(out) if resume else None
    sft_dir = out / "sft-model"
    result = TrainResult(out=str(out), steps=0, metrics=[])

    # 1. SFT warm-up (skipped when resuming past it) -> the reference policy.
    start_model = cfg.model
    if cfg.sft.enabled and not (resume and sft_dir.exists()):
        policy = load_policy(cfg, cfg.model)
        questions = [
            t.question for t in eval_tasks[: cfg.sft.eval_tasks] or train_tasks[: cfg.sft.eval_tasks]
        ]

        result.valid_rate_before_sft = sft_valid_rate(policy, questions, pool, cfg)
        pairs = sft_pairs([t.question for t in train_tasks], pool, cfg.sft, cfg.seed, cfg.spec_format)
        sft_losses = sft_train(policy, pairs, pool, cfg.sft, seed=cfg.seed, progress=cfg.progress and is_main)
        result.valid_rate_after_sft = sft_valid_rate(policy, questions, pool, cfg)
        if is_main:
            _save_model_dir(policy, sft_dir)
            _write_atomic(
                out / "sft.json",
                json.dumps(
                    {
                        "valid_rate_before": result.valid_rate_before_sft,
                        "valid_rate_after": result.valid_rate_after_sft,
                        "loss_first": sft_losses[0] if sft_losses else None,
                        "loss_last": sft_losses[-1] if sft_losses else None,
                        "pairs": len(pairs),
                        "steps": cfg.sft.steps,
                    },
                    indent=2,
                ),
            )
        if world_size > 1:
            torch.distributed.barrier()
        del policy
    if cfg.sft.enabled:
        start_model = str(sft_dir)
        if (out / "sft.json").exists():
            info = json.loads((out / "sft.json").read_text())
            result.valid_rate_before_sft, result.valid_rate_after_sft = (
                info["valid_rate_before"],
                info["valid_rate_after"],
            )

    # 2. Policy (from the checkpoint when resuming), reference, optimizer, scheduler.
    sharded = uses_fsdp(cfg, world_size)
    load_device = "cpu" if sharded else cfg.device  # FSDP: only each rank's shard goes to cfg.device
    ref_model = None
    if cfg.lora.enabled:
        policy = load_policy(cfg, start_model)
        _apply_lora(policy, cfg.lora, base=start_model, adapter=ckpt)
    else:
        policy = load_policy(cfg, str(ckpt) if ckpt else start_model, load_device)
        if cfg.grpo.kl_coef > 0:
            ref_model = OrchestratorPolicy.load(start_model, load_device, dtype).model.eval()
            ref_model.requires_grad_(False)
    if sharded:
        shard_for_training(policy, ref_model, cfg)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    warm = cfg.optim.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warm + 1)))
    sampler = EditFamilySampler(floor=cfg.rollout.edit_floor, decay=cfg.rollout.edit_decay)
    step = 0
    if ckpt is not None:
        state = torch.load(ckpt / "training_state.pt", weights_only=False)
        load_optimizer_state(policy.model, optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        rng_torch, rng_python = state["rng_torch"], state["rng_python"]
        if len(state.get("rng_by_rank") or []) == world_size:  # same world size: each rank its own
            rng_torch, rng_python = state["rng_by_rank"][rank]
        torch.set_rng_state(rng_torch)
        random.setstate(rng_python)
        info = json.loads((ckpt / "trainer_state.json").read_text())
        step = int(info["step"])
        sampler.mean_abs_delta = {EditFamily(k): float(v) for k, v in info["sampler"].items()}

    # vLLM sampling (GPU): an engine per rank on the current weights, refreshed after every update.
    # A LoRA policy keeps the frozen base in vLLM and hands over only its adapter (rollout.vllm.lora_adapters).
    sampler_weights = out / f"sampler-weights-rank{rank}"
    if cfg.rollout.sampler != "transformers" and cfg.lora.enabled and cfg.rollout.vllm.lora_adapters:
        attach_sampler(policy, resolve_model(start_model), cfg.rollout, pool, cfg.seed + rank, cfg.lora.r)
        policy.sync_sampler(sampler_weights)  # the adapter as it is now (fresh, or the resumed checkpoint's)
    elif cfg.rollout.sampler != "transformers":
        attach_sampler(policy, str(policy.export_weights(sampler_weights)), cfg.rollout, pool, seed=cfg.seed + rank)

    # 3. GRPO iterations.
    log = _Log(out / "metrics.jsonl", keep_until=step if ckpt else None, enabled=is_main)
    bar = tqdm(total=cfg.iterations, initial=step, desc="grpo", disable=not (cfg.progress and is_main))
    iteration_times = []
    while step < cfg.iterations:
        step += 1
        t0 = time.perf_counter()
        step_tasks = tasks_for_step(train_tasks, step, cfg.tasks_per_iteration * world_size, cfg.seed)
        tasks = step_tasks[rank::world_size]
        sampler_before = dict(sampler.mean_abs_delta)
        with sampling(policy, cfg):
            records, stats = collect_rollouts(
                policy,
                tasks,
                pool,
                cfg.rollout,
                cfg.reward,
                sampler,
                step=step,
                seed=cfg.seed * 1_000_003 + step * 7919 + rank,
                scorer=scorer,
            )
        t_rollout = time.perf_counter() - t0
        if cfg.save_rollouts:
            write_records(records, str(out / "rollouts" / f"step-{step:06d}-rank{rank}.jsonl"))
        update = grpo_update(policy, ref_model, records, optimizer, scheduler, cfg)
        policy.sync_sampler(sampler_weights)  # the next rollouts sample from the updated weights
        if world_size > 1:
            records, stats = _merge_ranks(records, stats, sampler, sampler_before)
        row: dict[str, Any] = {
            "step": step,
            "task_ids": [t.id for t in step_tasks],
            **rollout_metrics(records, pool.level_names),
            **update,
            "agent_calls": stats.agent_calls,
            "edit_agent_calls": stats.edit_agent_calls,
            "cache_hits": stats.cache_hits,
            "time/rollout_s": t_rollout,
            "time/step_s": time.perf_counter() - t0,
        }
        iteration_times.append(row["time/step_s"])
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.iterations:
            if sharded:  # sampling is a collective: every rank evaluates its share of the tasks
                with sampling(policy, cfg):
                    row.update(evaluate_policy(policy, eval_tasks, pool, cfg, scorer, cfg.seed, rank=rank,
                                               world_size=world_size))  # fmt: skip
            elif is_main:
                row.update(evaluate_policy(policy, eval_tasks, pool, cfg, scorer, seed=cfg.seed))
        log.write(row)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward/mean']:.3f}", valid=f"{row['valid_rate']:.2f}")
        if step % cfg.checkpoint_every == 0 or step == cfg.iterations:
            rngs = _all_gather((torch.get_rng_state(), random.getstate())) if world_size > 1 else None
            full = fsdp.full_state(policy.model, optimizer) if sharded else None  # a collective
            if is_main:
                save_checkpoint(
                    out, step, policy, optimizer, scheduler, sampler, cfg.keep_checkpoints, rngs, full
                )
        if world_size > 1:
            torch.distributed.barrier()
    bar.close()

    result.steps, result.metrics = step, log.rows
    result.seconds_per_iteration = statistics.fmean(iteration_times) if iteration_times else None
    if is_main and log.rows:
        from lemon_core.plots import plot_reward_curve

        result.reward_curve = str(plot_reward_curve(log.rows, out / "reward_curve.png"))
        _write_atomic(out / "result.json", result.model_dump_json(indent=2, exclude={"metrics"}))
    if policy.sampler is not None:
        policy.sampler.close()
    pool.close()
    return result
