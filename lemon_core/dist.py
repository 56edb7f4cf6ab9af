"""Distributed training under torchrun: the world, reductions, sharding of GRPO groups, and the
replicate/FSDP strategy object the training loop calls instead of branching on ``if sharded``.

Every rank takes whole GRPO groups (``shard_by_group``); the loss normaliser is summed over ranks
before backward and gradients are summed after it, so a step equals the single-process step on the
whole batch (tests/test_train_distributed.py, tests/test_train_fsdp.py).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

import torch

from lemon_core import fsdp

DIST_TIMEOUT_MIN = 60  # collective/barrier timeout under torchrun


def world(device: str | None = None) -> tuple[int, int]:
    """(rank, world size); initialises torch.distributed when launched by torchrun.

    The backend follows the device the ranks train on (NCCL for CUDA, gloo for CPU), not merely
    whether a GPU exists, so a CPU run on a GPU box still works. Each rank is pinned to GPU
    ``LOCAL_RANK`` first, so a config saying just ``cuda`` puts every rank on its own GPU. The timeout
    is generous because rank 0 alone writes checkpoints while the others wait at a barrier.
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


def distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def barrier() -> None:
    if distributed():
        torch.distributed.barrier()


def _comm_device() -> torch.device:
    backend = torch.distributed.get_backend()
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def all_reduce_sum(value: float) -> float:
    if not distributed():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_comm_device())
    torch.distributed.all_reduce(t)
    return float(t.item())


def all_reduce_max(value: int) -> int:
    if not distributed():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (a one-element list when not distributed)."""
    if not distributed():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Sum float metrics over ranks by key (a rank without records may lack some keys)."""
    total: dict[str, float] = defaultdict(float)
    for part in all_gather(dict(values)):
        for k, v in part.items():
            total[k] += v
    return dict(total)


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum every trainable parameter's gradient over ranks (what DDP does, without wrapping the model).

    Each rank's loss is already divided by the *global* token (or sequence) count, so the sum is the
    gradient of the full batch. A trainable parameter that got no gradient on this rank contributes
    zeros: skipping it would leave the ranks issuing different collectives and hang.
    """
    if not distributed():
        return
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad)


def shard_by_group(records: Sequence[Any], rank: int, world_size: int) -> list[Any]:
    """This rank's records when one batch of rollout records is split over ranks.

    Whole GRPO groups (step, task) go to one rank, round-robin in order of first appearance: the group
    advantage is a mean/std over the group, so a group split over ranks would get a different
    advantage on each rank. (A plain ``records[rank::world]`` splits every group.)
    """
    keys = list(dict.fromkeys((r.step, r.task_id) for r in records))
    mine = {k for i, k in enumerate(keys) if i % world_size == rank}
    return [r for r in records if (r.step, r.task_id) in mine]


class Replicate:
    """Every rank holds the full model; gradients are all-reduced after backward (DDP-like)."""

    sharded = False

    def prepare(self, policy: Any, ref_model: Any) -> None:
        """Nothing to do: the replica is already on its device."""

    def micro_batches(self, n_local: int) -> int:
        return n_local

    def reduce_gradients(self, model: torch.nn.Module) -> None:
        all_reduce_grads(model)

    def full_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        return None  # the replica's own state is complete

    def sampling(self, model: torch.nn.Module) -> AbstractContextManager[None]:
        return nullcontext()


class FSDP:
    """Parameters, gradients and AdamW state sharded over ranks with FSDP2 (``fsdp.py``).

    Forward and backward are collectives, so every rank runs as many micro-batches as the busiest one,
    FSDP's reduce-scatter sums the gradients, and a checkpoint gathers the full state to rank 0.
    """

    sharded = True

    def __init__(self, device: str, reshard_after_forward: bool, gather_for_sampling: bool) -> None:
        self.device = device
        self.reshard_after_forward = reshard_after_forward
        self.gather_for_sampling = gather_for_sampling

    def prepare(self, policy: Any, ref_model: Any) -> None:
        """Shard the policy and the frozen KL reference (a full replica per GPU would cost what sharding
        the policy saves); build the optimizer afterwards, on the shards."""
        fsdp.shard_policy(policy, self.device, self.reshard_after_forward)
        if ref_model is not None:
            fsdp.shard_model(ref_model, self.device, reshard_after_forward=True)

    def micro_batches(self, n_local: int) -> int:
        return all_reduce_max(n_local)

    def reduce_gradients(self, model: torch.nn.Module) -> None:
        """Nothing to do: FSDP's backward already summed them."""

    def full_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        return fsdp.full_state(model, optimizer)  # a collective: every rank calls it

    def sampling(self, model: torch.nn.Module) -> AbstractContextManager[None]:
        """With ``fsdp_gather_for_sampling`` the full weights stay gathered while sampling."""
        return fsdp.gathered_for_sampling(model, self.gather_for_sampling, self.reshard_after_forward)


Strategy = Replicate | FSDP


def make_strategy(cfg: Any, world_size: int) -> Strategy:
    """FSDP for ``distributed.strategy: fsdp`` under torchrun (one process has nothing to shard)."""
    if cfg.distributed.strategy == "fsdp" and world_size > 1:
        d = cfg.distributed
        return FSDP(cfg.device, d.fsdp_reshard_after_forward, d.fsdp_gather_for_sampling)
    return Replicate()


def uses_fsdp(cfg: Any, world_size: int) -> bool:
    """FSDP sharding is on: ``distributed.strategy: fsdp`` under torchrun."""
    return make_strategy(cfg, world_size).sharded
