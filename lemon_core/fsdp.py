"""FSDP strategy of the trainer: PyTorch FSDP2 (``fully_shard``) over the torchrun ranks.

With ``distributed.strategy: fsdp`` the policy's parameters, gradients and AdamW state are sharded
over the ranks instead of replicated, so a model whose full fine-tuning state does not fit one GPU
(7B: ~14 GB bf16 weights + 14 GB gradients + 28 GB Adam moments) trains on several. The step itself
is the same as the replicate strategy's: every rank takes whole GRPO groups, the loss is divided by
the *global* token count, and gradients are *summed* over ranks (FSDP2 averages by default; here the
divide factor is 1 and the reduce-scatter is a plain sum).

What sharding changes for the rest of the trainer, and how this module handles it:

* Forward and backward are collectives (each layer's weights are all-gathered on use). Every rank
  must run the same number of forward/backward passes: ``grpo_update`` pads a rank's micro-batches
  with zero-weight ones, and sampling runs in lockstep (``OrchestratorPolicy.lockstep``: ``generate``
  keeps stepping until every rank's batch is done). ``gathered_for_sampling`` optionally keeps the
  full weights gathered while sampling, so a decoding step costs no all-gather.
* The KL reference model is sharded too (frozen; forward-only): a full replica of a 7B reference on
  every GPU would cost what sharding the policy saves.
* Checkpoints stay plain HF folders: ``full_state`` gathers the full model and optimizer state onto
  rank 0's CPU (a collective: every rank calls it), rank 0 writes them with ``save_pretrained``. The
  optimizer state is saved in ``torch.optim.Optimizer.state_dict`` form (integer parameter ids), the
  replicate strategy's format, so either strategy resumes from either's checkpoints.
* On resume every rank loads the full weights from the checkpoint folder *before* sharding
  (``shard_model`` keeps each rank's shard only) and ``load_optimizer_state`` scatters the optimizer.

Weights are loaded on the CPU and ``fully_shard`` moves only each rank's shard to the GPU, so no GPU
ever holds the whole policy for training. (The SFT warm-up in ``train`` still runs as a full replica
on every rank; skip it - ``sft.enabled: false`` with an SFT'd ``model`` - when that does not fit.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

_LAYER_SUFFIXES = ("DecoderLayer", "DecoderBlock")


def _fsdp() -> Any:
    from torch.distributed import fsdp

    return fsdp


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was wrapped by ``shard_model`` (an FSDP2 root)."""
    return isinstance(model, _fsdp().FSDPModule)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM, each of which becomes one FSDP unit.

    HF models name their block class in ``_no_split_modules`` (what accelerate's device_map never
    splits); otherwise any module whose class name ends in ``DecoderLayer``/``DecoderBlock`` counts.
    Blocks nested inside another block are not returned twice.
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        cls = type(module).__name__
        if cls in names or cls.endswith(_LAYER_SUFFIXES):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    if not found:
        raise ValueError(
            f"distributed.strategy=fsdp: found no decoder layers in {type(model).__name__} (no class in "
            f"_no_split_modules={sorted(names)} nor one named *DecoderLayer); use strategy: replicate"
        )
    return found


def _mesh(device: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(torch.device(device).type, (torch.distributed.get_world_size(),))


def shard_model(model: nn.Module, device: str, reshard_after_forward: bool = True) -> nn.Module:
    """Wrap ``model`` (in place) with ``fully_shard``: each decoder layer, then the root.

    Call on every rank with the same full weights (from the CPU: each rank's shard moves to
    ``device``). Gradients are then *summed* over ranks, not averaged: lemon's loss is already divided
    by the global token count. The divide factor is set to 1 and the reduce-scatter forced to a plain
    SUM, because FSDP2 would otherwise use PREMUL_SUM, which gloo rejects. ``reshard_after_forward``
    applies to the root too (FSDP2 keeps the root gathered by default), so after a no-grad forward
    (sampling, the reference model) no full weights stay behind.
    """
    fsdp = _fsdp()
    mesh = _mesh(device)
    for layer in decoder_layers(model):
        fsdp.fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fsdp.fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for module in _units(model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return model


def shard_policy(policy: Any, device: str, reshard_after_forward: bool = True) -> None:
    """``shard_model`` on ``policy.model``; the policy then feeds inputs to ``device`` and samples in
    lockstep (every rank runs as many decoding steps as the slowest one)."""
    shard_model(policy.model, device, reshard_after_forward)
    policy.device = torch.device(device)
    policy.lockstep = True


def _units(model: nn.Module) -> list[Any]:
    fsdp = _fsdp()
    return [m for m in model.modules() if isinstance(m, fsdp.FSDPModule)]


def reshard(model: nn.Module) -> None:
    """Free every gathered full weight of a sharded model (``FSDPModule.reshard`` is not recursive)."""
    for module in _units(model):
        module.reshard()


@contextmanager
def gathered_for_sampling(model: nn.Module, keep_gathered: bool, reshard_after_forward: bool) -> Iterator[None]:
    """While sampling, keep the full weights gathered after their first use (``keep_gathered``).

    Decoding runs one forward per token; with resharding each of them all-gathers the whole model.
    Keeping it gathered costs one full copy of the weights per GPU while sampling and makes decoding
    as fast as a replica's. Afterwards the weights are resharded and the training setting restored.
    A no-op for an unsharded model.
    """
    if not is_sharded(model):
        yield
        return
    if keep_gathered:
        model.set_reshard_after_forward(False)
    try:
        yield
    finally:
        if keep_gathered:
            model.set_reshard_after_forward(reshard_after_forward)
        reshard(model)


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the gradients' global norm to ``max_norm``; returns the norm before clipping.

    Under FSDP the gradients are sharded DTensors and the norm comes back as a DTensor over all
    shards; ``full_tensor`` makes it the one number every rank agrees on.
    """
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


# --- state dicts ----------------------------------------------------------------------------------
def _trainable_names(model: nn.Module) -> list[str]:
    """Parameter names in the order the trainer builds its optimizer: ``[p for p in parameters() if
    p.requires_grad]``, i.e. the integer ids of ``Optimizer.state_dict``."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def _check_one_group(optimizer: torch.optim.Optimizer, names: list[str]) -> None:
    groups = optimizer.param_groups
    if len(groups) != 1 or len(groups[0]["params"]) != len(names):
        raise ValueError(
            "FSDP checkpoints expect one optimizer param group over the trainable parameters in model "
            f"order; got {len(groups)} group(s) over {sum(len(g['params']) for g in groups)} of {len(names)}"
        )


def optimizer_state_by_id(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A full FQN-keyed optimizer state dict (``get_optimizer_state_dict``) -> ``Optimizer.state_dict``
    form, where parameter ``names[i]`` is id ``i``."""
    index = {name: i for i, name in enumerate(names)}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
    }


def optimizer_state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of ``optimizer_state_by_id``: what ``set_optimizer_state_dict`` takes."""
    return {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(full model state dict, full optimizer state dict) on rank 0's CPU; ({}, {}) on other ranks.

    A collective: every rank must call it, then rank 0 writes. The model state dict is what
    ``save_pretrained(state_dict=...)`` takes; the optimizer's is in ``Optimizer.state_dict`` form.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    names = _trainable_names(model)
    _check_one_group(optimizer, names)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    if torch.distributed.get_rank() != 0:
        return {}, {}
    return model_state, optimizer_state_by_id(optimizer_state, names)


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full ``Optimizer.state_dict``-form state (a checkpoint of either strategy) into the
    optimizer of a sharded model: each rank keeps its shard. Every rank calls it with the same state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trainable_names(model)
    _check_one_group(optimizer, names)
    set_optimizer_state_dict(
        model,
        optimizer,
        optim_state_dict=optimizer_state_by_name(state, names),
        options=StateDictOptions(full_state_dict=True),
    )
