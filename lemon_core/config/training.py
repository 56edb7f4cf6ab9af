"""``lemon train``'s config: ``TrainConfig`` and its own sections (``data``, ``optim``, ``lora``, ``distributed``).

The sections that configure one piece of the loop live beside each other in this package (``rollout``,
``reward``, ``grpo``, ``sft``); nothing here imports torch or the code the settings configure, so reading a
config (or compiling a pipeline) loads no trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lemon_core.config.grpo import GRPOConfig
from lemon_core.config.loading import apply_overrides, load_settings
from lemon_core.config.reward import RewardConfig
from lemon_core.config.rollout import RolloutConfig
from lemon_core.config.sft import SFTConfig

SpecFormat = Literal["yaml", "json"]


class DataConfig(BaseModel):
    """Which tasks ``lemon train`` trains on and which it holds out."""

    model_config = ConfigDict(extra="forbid")

    benchmarks: list[str] = Field(default_factory=lambda: ["multiarith"], description="benchmark names")
    split: str | None = Field(None, description="split to train on (default: each benchmark's default)")
    limit: int | None = Field(64, ge=1, description="tasks per benchmark")
    data_dir: str | None = Field(
        None, description="raw datasets folder, or 'hf' for the Hugging Face hub; when set, the only place read "
        "(default: $LEMON_DATA_DIR, a shared/datasets folder, then the `lemon data pull` cache)",
    )
    tasks_jsonl: str | None = Field(None, description="instead of benchmarks: JSONL of Example rows")
    eval_tasks: int = Field(4, ge=0, description="tasks held out for periodic evaluation")


class OptimConfig(BaseModel):
    """AdamW + linear warm-up; one optimizer step per PPO epoch over a rollout batch."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-6, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up, in optimizer steps")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping by global norm")
    micro_batch_size: int = Field(4, ge=1, description="completions per forward/backward (grad accumulation)")
    epochs_per_batch: int = Field(1, ge=1, description="optimizer steps on each rollout batch (PPO epochs)")
    logprob_mode: Literal["logits", "hidden"] = Field(
        "logits",
        description="how token log-probs are computed (lemon_core/logprobs.py), both chunked: logits gathers "
        "logit[target] - logsumexp block by block (any model); hidden applies the LM head per block from the "
        "decoder's hidden states, much less peak memory at a large vocabulary (bench/logprobs.py), not with fsdp",
    )
    logprob_chunk_tokens: int = Field(256, ge=1, description="tokens per log-prob block")


class LoraSettings(BaseModel):
    """LoRA adapters (peft): only they train; the frozen base is the KL reference."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="train LoRA adapters instead of the full model")
    r: int = Field(16, ge=1, description="adapter rank")
    alpha: int = Field(32, ge=1, description="LoRA alpha (scale = alpha / r)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="modules that get adapters"
    )


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
    seed: int = Field(0, description="seeds data order, sampling and initialisation")
    device: str = Field("cpu", description="torch device of the policy: cpu, cuda, cuda:1")
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
    tasks_per_iteration: int = Field(2, ge=1, description="tasks (GRPO groups) per step and rank")
    checkpoint_every: int = Field(1, ge=1, description="write a checkpoint every N steps (and at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk (older ones are deleted)")
    eval_every: int = Field(
        0, ge=0, description="evaluate on the held-out tasks every N steps (0: only at the end)"
    )
    save_rollouts: bool = Field(True, description="write every step's rollout records under out/rollouts")
    progress: bool = Field(True, description="progress bars on a terminal, one line per step in logs")
    data: DataConfig = Field(default_factory=DataConfig, description="training and held-out tasks")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="sampling and counterfactuals")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="reward terms and weights")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="the GRPO loss and credit")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="SFT warm-up")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimizer")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="torchrun strategy")

    @field_validator("progress", mode="before")
    @classmethod
    def _progress_mode_means_on(cls, value: Any) -> Any:
        """``LEMON_PROGRESS`` also names the progress display (``bar``, ``lines``, ``off``: lemon_core/progress.py),
        and the environment reaches this field under the same name: a display mode is read as on or off."""
        if isinstance(value, str) and value.strip().lower() in ("bar", "lines", "off"):
            return value.strip().lower() != "off"
        return value

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
    def _hidden_logprobs_without_fsdp(self) -> TrainConfig:
        if self.optim.logprob_mode == "hidden" and self.distributed.strategy == "fsdp":
            raise ValueError("optim.logprob_mode=hidden runs the decoder without its LM head, which FSDP shards "
                             "with the root module; use logprob_mode: logits with distributed.strategy: fsdp")
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
        """Load a YAML config (a bundled name like ``train-cpu`` also works); ``overrides`` (CLI flags) win
        over the file and the environment and are validated like file fields."""
        return load_settings(cls, path, overrides)

    def with_overrides(self, **overrides: Any) -> TrainConfig:
        """A copy with ``overrides`` merged in and validated (nested sections as dicts); they win over env."""
        return apply_overrides(self, overrides)


def resolve_dtype(cfg: TrainConfig) -> str:
    """``cfg.dtype``, with ``auto`` = bf16 on a GPU that has it, else fp32."""
    if cfg.dtype != "auto":
        return cfg.dtype
    import torch

    return "bfloat16" if cfg.device.startswith("cuda") and torch.cuda.is_bf16_supported() else "float32"
