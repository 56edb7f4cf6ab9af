"""LoRA (peft): wrap the policy in adapters, fold adapters into plain weights, merge a checkpoint.

Only adapters train; the frozen base doubles as the KL reference (``disable_adapter``). Checkpoints hold
the adapter only; a sampler that knows nothing of peft (vLLM without LoRA support, the pipeline's pods)
gets plain weights from ``merged_lora_state`` or ``merge_lora_checkpoint``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lemon_core.storage import atomic_path

if TYPE_CHECKING:
    from lemon_core.config import LoraSettings


def import_peft() -> Any:
    try:
        import peft
    except ImportError as e:
        raise RuntimeError(
            "lora.enabled needs peft: pip install peft==0.21.2 (or set lora.enabled: false)"
        ) from e
    return peft


def apply_lora(
    policy: Any, cfg: LoraSettings, base: str, adapter: Path | None = None
) -> None:
    """Wrap the policy in LoRA adapters: fresh ones, or the trainable adapters of checkpoint ``adapter``.

    Only the adapters train; the frozen base doubles as the KL reference (``disable_adapter``), so no
    second copy of the model is held. ``base`` (where the base weights were loaded from) is written
    into the adapter config as an absolute path when it is a local folder, so a checkpoint loads for
    sampling from any working directory: ``from_pretrained(ckpt)`` (transformers attaches the
    adapter) or ``merge_lora_checkpoint`` for a plain model folder.
    """
    peft = import_peft()
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

    src, final = Path(checkpoint), Path(dest)
    model = load_merged_lora(src)
    with atomic_path(final, directory=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
    return final


def is_lora_checkpoint(path: str | Path) -> bool:
    """A folder that holds a LoRA adapter (and the name of its base), not full weights."""
    return (Path(path) / "adapter_config.json").exists()


def load_merged_lora(checkpoint: str | Path, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A LoRA checkpoint's base model with its adapters folded into the weights: a plain model (plain
    ``nn.Linear`` layers computing base + B·A), for inference code that packs or copies weights."""
    peft = import_peft()
    src = Path(checkpoint)
    if not is_lora_checkpoint(src):
        raise ValueError(f"{src} has no adapter_config.json: not a LoRA checkpoint (nothing to merge)")
    kwargs = {} if dtype is None else {"dtype": dtype}
    return peft.AutoPeftModelForCausalLM.from_pretrained(src, **kwargs).merge_and_unload()


@torch.no_grad()
def merged_lora_state(base: torch.nn.Module) -> dict[str, Tensor]:
    """The state dict of a peft-wrapped model with every LoRA layer folded in, without touching it."""
    state = {k.replace(".base_layer.", "."): v.detach() for k, v in base.state_dict().items() if "lora_" not in k}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            delta = sum(
                module.get_delta_weight(a) for a in module.active_adapters if a in getattr(module, "lora_A", {})
            )
            key = f"{name}.weight"
            state[key] = state[key] + delta
    return state
