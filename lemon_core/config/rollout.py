"""How rollouts sample and probe specs (``rollout`` in a train config), and the vLLM sampler's engine settings.

The rollout itself is ``lemon_core.rollout``; the vLLM sampler ``lemon_core.vllm_sampler``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class VLLMSamplerConfig(BaseModel):
    """Engine settings of the vLLM sampler (``rollout.vllm`` in the train config)."""

    model_config = ConfigDict(extra="forbid")

    dtype: str = Field("auto", description="weights dtype in vLLM: auto (the checkpoint's), bfloat16, float32")
    gpu_memory_utilization: float = Field(
        0.35, gt=0, le=1,
        description="share of GPU memory vLLM may take (weights + KV cache); the trainer shares the GPU, "
        "so leave room for the policy, its reference, gradients and optimizer state",
    )
    max_model_len: int = Field(4096, ge=64, description="longest prompt + completion vLLM accepts")
    enforce_eager: bool = Field(False, description="skip CUDA graph capture (faster start, slower decode)")
    guided_json: bool = Field(
        False, description="constrain samples to the spec's JSON schema (needs spec_format: json in the config)",
    )
    structured_outputs_backend: Literal["xgrammar", "guidance"] = Field(
        "xgrammar",
        description="vLLM's structured-outputs backend for guided_json (the two that can forbid free "
        "whitespace, which compact JSON specs need)",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM engine spans")
    lora_adapters: bool = Field(
        True,
        description="LoRA policies: vLLM serves the frozen base plus the current adapter, handed over after "
        "every update (a few MB); false hands it the merged weights instead (the whole model, every step)",
    )


class RolloutConfig(BaseModel):
    """How specs are sampled and probed."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(4, ge=2, description="G: specs sampled per task (the GRPO group)")
    edits_per_spec: int = Field(2, ge=0, description="K: counterfactual edits per valid spec (0 = plain GRPO)")
    max_new_tokens: int = Field(256, ge=8, description="longest spec the policy may write, in tokens")
    temperature: float = Field(1.0, gt=0, le=2, description="sampling temperature (also used in the loss)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    sample_batch_size: int = Field(16, ge=1, description="completions generated together")
    edit_families: list[str] = Field(
        default_factory=lambda: ["drop_dependency", "duty_rollback", "capacity_reset"],
        description="counterfactual edit families probed (lemon_core/counterfactual.py): drop_dependency, "
        "duty_rollback, capacity_reset (an agent to the pool's cheapest level: a reference that does not depend on "
        "the sampled level), capacity_downgrade (one level down, the paper's edit), capacity_upgrade (one level up)",
    )
    edit_floor: float = Field(0.2, ge=0, le=1, description="uniform share of the adaptive edit-family sampler")
    edit_decay: float = Field(0.9, ge=0, lt=1, description="EMA decay of each family's mean |Delta|")
    sampler: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="who generates the specs: the policy's own transformers generate (CPU default) or a "
        "vLLM engine on GPU that reloads the policy's weights after every update (see vllm_sampler.py)",
    )
    vllm: VLLMSamplerConfig = Field(default_factory=VLLMSamplerConfig, description="used when sampler: vllm")
    grammar: bool = Field(
        False,
        description="constrain the policy's own generate to the spec grammar (lemon_core/grammar.py, llguidance): "
        "every sample is a well-formed spec with enum levels/base roles and sequential ids a1, a2, ...; old "
        "log-probs and the KL stay those of the unconstrained policy. Graph rules a grammar cannot express are "
        "still checked and counted. The vLLM sampler uses rollout.vllm.guided_json instead",
    )
    grammar_max_agents: int = Field(4, ge=1, le=12, description="most agents a grammar-constrained spec may have")
    grammar_max_duty_chars: int = Field(
        200, ge=1, description="longest role/duty text under the grammar (keeps specs inside max_new_tokens)"
    )
    check_budget: bool = Field(
        True,
        description="refuse a max_new_tokens below the 95th percentile of the SFT targets' token lengths "
        "(sft.check_token_budget); only tiny test configs, whose random model never finishes a spec, turn it off",
    )
    mask_truncated: bool = Field(
        True,
        description="completions that hit max_new_tokens without a complete, valid spec are counted as "
        "`truncated` and contribute no gradient (their reward still enters the group statistics), so GRPO "
        "does not learn 'shorter is valid' from specs the budget cut off (TRL's mask_truncated_completions)",
    )
