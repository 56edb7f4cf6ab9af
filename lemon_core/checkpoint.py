"""Checkpoints: a plain HF model folder plus everything an exact resume needs.

``ckpt-N`` holds the model (``save_pretrained``, safetensors; the adapter only for LoRA), the optimizer,
the scheduler, every rank's RNG states, the edit-family sampler and the step. It is written to
``ckpt-N.tmp``, renamed to ``ckpt-N``, and only then is the ``latest`` pointer replaced, so a kill at
any moment leaves the last good checkpoint intact. ``restore_training_state`` is the inverse.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lemon_core import fsdp
from lemon_core.counterfactual import EditFamily, EditFamilySampler
from lemon_core.prompts import write_prompt_settings
from lemon_core.storage import atomic_path, is_temporary, write_atomic

LATEST = "latest"


def save_model_dir(
    policy: Any,
    final: Path,
    extra: Callable[[Path], None] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """save_pretrained into a temporary sibling, then rename: ``final`` is either complete or absent.

    ``state_dict``: the full weights to write instead of the model's own (an FSDP-sharded policy, whose
    ``fsdp.full_state`` was gathered on this rank).
    """
    with atomic_path(final, directory=True) as tmp:
        if state_dict is not None:
            policy.model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        else:
            policy.model.save_pretrained(tmp, safe_serialization=True)
        policy.tokenizer.save_pretrained(tmp)
        write_prompt_settings(tmp, policy.prompt_settings)  # every later loader prompts it as it was trained
        if extra is not None:
            extra(tmp)


def save_checkpoint(
    out: Path,
    step: int,
    policy: Any,
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

    save_model_dir(policy, final, extra, state_dict=model_state)
    write_atomic(ckpt_dir / LATEST, final.name)
    for old in sorted(ckpt_dir.glob("ckpt-*")):
        if is_temporary(old.name) or old.name >= f"ckpt-{step - keep + 1:06d}" or old == final:
            continue
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out: Path) -> Path | None:
    pointer = out / "checkpoints" / LATEST
    if not pointer.exists():
        return None
    path = out / "checkpoints" / pointer.read_text().strip()
    return path if (path / "trainer_state.json").exists() else None


def sampler_state(checkpoint: Path) -> dict[EditFamily, float]:
    """The edit-family sampler's recent |Δ| per family saved in ``checkpoint`` ({} when absent)."""
    state = checkpoint / "trainer_state.json"
    saved = json.loads(state.read_text()).get("sampler", {}) if state.exists() else {}
    return {EditFamily(k): float(v) for k, v in saved.items()}


def restore_training_state(
    checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
    sampler: EditFamilySampler, *, rank: int = 0, world_size: int = 1, rng: bool = True,
) -> int:
    """Load optimizer, scheduler, edit sampler (and with ``rng`` the RNG states) of ``checkpoint``;
    returns its step. A model folder without training state (an SFT model) restores nothing: step 0.

    With the same world size each rank gets its own RNG state back; a sharded model's ranks each keep
    their optimizer shard (every rank calls this)."""
    sampler.mean_abs_delta.update(sampler_state(checkpoint))
    path = checkpoint / "training_state.pt"
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=False)
    if fsdp.is_sharded(model):
        fsdp.load_optimizer_state(model, optimizer, state["optimizer"])
    else:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if rng:
        rng_torch, rng_python = state["rng_torch"], state["rng_python"]
        if len(state.get("rng_by_rank") or []) == world_size:  # same world size: each rank its own
            rng_torch, rng_python = state["rng_by_rank"][rank]
        torch.set_rng_state(rng_torch)
        random.setstate(rng_python)
    info = json.loads((checkpoint / "trainer_state.json").read_text())
    return int(info["step"])
