"""Every config model of lemon and the one way they are loaded: YAML file + ``LEMON_*`` environment.

``load_settings(Model, source, overrides)`` reads a YAML path, a bundled config name (``train-cpu``,
``local-cpu``) or a JSON string, merges validated overrides (CLI flags) into it, and builds the model;
for ``BaseSettings`` models the environment (``LEMON_OPTIM__LR=1e-5``) wins over the file. Every
failure is a ``ConfigError`` naming the file, the field and the problem (``format_validation_error``).

Models: ``TrainConfig`` (``lemon train``; its sections ``data``, ``optim``, ``lora``, ``distributed`` are
here, ``rollout``/``reward``/``grpo``/``sft`` live beside the code they configure) and
``PipelineConfig`` (one pipeline run: ``prepare``, a typed ``train`` section, ``evaluate``,
``publish``, ``kubernetes``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lemon_core.baselines import ORCHESTRATOR, SFT_ORCHESTRATOR
from lemon_core.errors import ConfigError, ConfigNotFoundError, format_validation_error
from lemon_core.grpo import GRPOConfig
from lemon_core.prepare import PrepareConfig
from lemon_core.reward import RewardConfig
from lemon_core.rollout import RolloutConfig
from lemon_core.sft import SFTConfig

SpecFormat = Literal["yaml", "json"]
BUNDLED = Path(__file__).parent / "configs"

M = TypeVar("M", bound=BaseModel)


# --- loading --------------------------------------------------------------------------------------
def bundled_config(name: str) -> Path | None:
    """``lemon_core/configs/<name>.yaml`` for a bare name such as ``train-cpu`` (None if there is none)."""
    p = Path(name)
    candidate = BUNDLED / (p.name if p.suffix else f"{p.name}.yaml")
    return candidate if candidate.is_file() else None


def read_config_source(source: str | Path) -> tuple[dict[str, Any], str]:
    """(mapping, where it came from) of a YAML path, a bundled name, or a JSON object string."""
    text = str(source)
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"config JSON: {e}") from None
        return _mapping(data, "config JSON"), "config JSON"
    path = Path(text).expanduser()
    if not path.exists():
        bundled = bundled_config(text)
        if bundled is None:
            raise ConfigNotFoundError(
                f"config {text!r} not found (nor bundled as lemon_core/configs/{Path(text).stem}.yaml); "
                f"bundled configs: {sorted(p.stem for p in BUNDLED.glob('*.yaml'))}"
            )
        path = bundled
    if path.is_dir():
        raise ConfigError(f"config {str(path)!r} is a folder; give the YAML file inside it")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a YAML config is UTF-8 text)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({yaml_problem(e)}); fix the file") from None
    return _mapping(data, str(path)), str(path)


def yaml_problem(e: yaml.YAMLError) -> str:
    """The YAML error on one line, with the line and column a person can look at."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def _mapping(data: Any, where: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a config is a mapping of fields, got {type(data).__name__}")
    return data


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, section by section (nested dicts merge, values replace)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def build_model(model: type[M], data: Mapping[str, Any], where: str = "config") -> M:
    """Validate ``data`` as ``model``; settings models also read ``LEMON_*`` env (env wins)."""
    try:
        return model(**data) if issubclass(model, BaseSettings) else model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{where}: {format_validation_error(e)}") from None


def apply_overrides(config: M, overrides: Mapping[str, Any], where: str = "override") -> M:
    """A copy of ``config`` with ``overrides`` (CLI flags; nested sections as dicts, merged) validated field by
    field: they win over the file *and* the environment, and a bad one fails like a bad file field."""
    out = config.model_copy(deep=True)
    for key, value in overrides.items():
        if value is None:
            continue
        current = getattr(out, key, None)
        if isinstance(value, Mapping) and isinstance(current, BaseModel):
            value = merge(current.model_dump(), value)
        try:
            type(out).__pydantic_validator__.validate_assignment(out, key, value)
        except ValidationError as e:
            raise ConfigError(f"{where}: {format_validation_error(e)}") from None
    return out


def load_settings(
    model: type[M], source: str | Path | Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> M:
    """The one config loader. Precedence, highest first: ``overrides`` (CLI flags), ``LEMON_*`` environment
    (settings models), the file (or mapping), defaults. Unknown top-level keys in the file are refused (a typo
    there is almost certainly a mistake; unknown ``LEMON_*`` variables are other parts' and ignored)."""
    if source is None:
        data, where = {}, "defaults"
    elif isinstance(source, Mapping):
        data, where = dict(source), "config"
    else:
        data, where = read_config_source(source)
    unknown = sorted(set(data) - set(model.model_fields))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; check the spelling (fields: "
                          f"{', '.join(model.model_fields)})")
    return apply_overrides(build_model(model, data, where), overrides or {})


# --- training -------------------------------------------------------------------------------------
class DataConfig(BaseModel):
    """Which tasks ``lemon train`` trains on and which it holds out."""

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
        "decoder's hidden states, ~5x less peak memory at a 152k vocabulary (bench/logprobs.py), not with fsdp",
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


# --- pipeline -------------------------------------------------------------------------------------
class EvalSettings(BaseModel):
    """The evaluation matrix of a pipeline run: methods × benchmarks on one prepared split."""

    model_config = ConfigDict(extra="forbid")

    benchmarks: list[str] | None = Field(None, description="default: the prepared benchmarks")
    methods: list[str] = Field(
        default_factory=lambda: [ORCHESTRATOR, "cot"],
        description=f"'{ORCHESTRATOR}' (the trained orchestrator), '{SFT_ORCHESTRATOR}' (the SFT-only one) "
        "and/or baselines",
    )
    split: str = Field("test", description="prepared split to evaluate on")
    limit: int | None = Field(None, ge=1, description="examples per benchmark")
    capacity: str | None = Field(None, description="baseline agents' level (default: the most capable)")
    batch_size: int = Field(8, ge=1, description="examples executed together")
    agent_max_tokens: int | None = Field(
        None, ge=1, description="cap on every agent's answer during evaluation (default: the pool's own "
        "max_tokens; train.agent_max_tokens caps rollouts only, so a short training cap cannot cut "
        "the evaluated answers before their final line)",
    )


class PublishSettings(BaseModel):
    """The gate before publishing a trained orchestrator to the serving location."""

    model_config = ConfigDict(extra="forbid")

    serving_uri: str = Field("", description="where the served model lives; '' = <artifacts>/serving")
    metric: str = Field("accuracy", description="summary field compared with the served model's")
    min_improvement: float = Field(0.0, description="publish when candidate > served + this")
    baseline_margin: float = Field(
        0.0, ge=0,
        description="refuse to publish when the candidate is worse than the best baseline of the same run by "
        "more than this margin: for accuracy, its 95% upper bound + margin must reach the best baseline's "
        "point estimate (lemon_core.gate)",
    )


class KubernetesSettings(BaseModel):
    """Cluster placement; only used when compiling/submitting, never by the stage code itself."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field("ghcr.io/lemon-mlops/lemon:0.1.0", description="CPU component image")
    gpu_image: str = Field("ghcr.io/lemon-mlops/lemon-cuda:0.1.0", description="CUDA component image")
    namespace: str = Field("kubeflow", description="namespace of TrainJobs")
    accelerator_type: str = Field("nvidia.com/gpu", description="GPU resource name")
    gpus_per_pod: int = Field(1, ge=0, description="GPUs of each GPU pod")
    node_selector: dict[str, str] = Field(default_factory=dict, description="node selector of GPU pods")
    tolerations: list[dict[str, str]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="tolerations of GPU pods",
    )
    s3_secret: str | None = Field("lemon-s3", description="Secret with S3 credentials, mapped to env")
    s3_secret_keys: dict[str, str] = Field(
        default_factory=lambda: {
            "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
            "LEMON_S3_ENDPOINT_URL": "LEMON_S3_ENDPOINT_URL",
        },
        description="env var -> key of s3_secret",
    )
    cache_pvc: str | None = Field("lemon-model-cache", description="PVC with the model cache")
    cache_mount_path: str = Field("/cache", description="where the cache PVC is mounted")
    train_nodes: int = Field(1, ge=1, description="> 1: train through a Kubeflow Trainer TrainJob")
    trainjob_timeout_s: float = Field(24 * 3600, gt=0, description="how long to wait for a TrainJob")
    pipeline_root: str | None = Field(None, description="KFP pipeline_root (e.g. s3://bucket/kfp)")


class PipelineConfig(BaseModel):
    """One YAML file drives a whole pipeline run (``configs/local-cpu.yaml``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("lemon", description="run name (labels, metrics, model card)")
    artifacts: str = Field("runs/lemon", description="artifact root: a folder, file:// or s3:// URI; each run "
                           "writes under <artifacts>/<run id> (see lemon_core.stages)")
    run_id: str = Field("", description="this run's folder under artifacts; '' = the Kubeflow run id, or a fresh "
                        "time-based id (`lemon pipeline run` sets one), so runs never share artifacts")
    simulated_pool: bool = Field(False, description="must be true to use the SIMULATED pool (tests only)")
    n_iterations: int = Field(1, ge=0, le=50, description="GRPO iterations, unrolled at compile time")
    rollout_shards: int | None = Field(
        None, ge=1, description="train shards used per iteration (default all)"
    )
    tasks_per_shard: int = Field(2, ge=1, description="tasks each rollout pod takes from its shard")
    rollout_parallelism: int = Field(1, ge=1, description="rollout pods at once")
    node_cache: bool = Field(
        True, description="stages of a run on local disk share agent answers (<run>/node-cache): an identical "
        "call (same level, prompt, sampling, seed) is answered once per run; it is still charged its price")
    prepare: PrepareConfig = Field(description="benchmarks, splits and shards")
    train: TrainConfig = Field(default_factory=TrainConfig, description="lemon train's config (same fields)")
    evaluate: EvalSettings = Field(default_factory=EvalSettings, description="evaluation matrix")
    publish: PublishSettings = Field(default_factory=PublishSettings, description="publish gate")
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings, description="cluster placement")

    @model_validator(mode="before")
    @classmethod
    def _train_reads_env(cls, data: Any) -> Any:
        """``train`` is built as ``TrainConfig(**fields)`` so LEMON_* env applies to it as to ``lemon train``."""
        if isinstance(data, dict) and isinstance(data.get("train", {}), dict):
            try:
                data = {**data, "train": TrainConfig(**data.get("train", {}))}
            except ValidationError as e:
                raise ValueError(f"train: {format_validation_error(e)}") from None
        return data

    @model_validator(mode="after")
    def _simulated_pool_is_explicit(self) -> PipelineConfig:
        if ("simulated" in str(self.train.pool)) != self.simulated_pool:
            raise ValueError(
                f"train.pool is {self.train.pool!r} but simulated_pool is {self.simulated_pool}: the simulated "
                "pool is a test environment, so a config must say `simulated_pool: true` to use it (and only then)"
            )
        return self

    @model_validator(mode="after")
    def _training_sees_the_evaluated_caps(self) -> PipelineConfig:
        """Warn when training measures agents under a tighter answer cap than evaluation does: the teacher
        sweep and the rollout rewards then under-rate specs whose answers need the longer cap. In local-cpu
        at 192 tokens, 7 of 11 lone `large` answers of the sweep and rollouts were cut before their final
        line, and the sweep taught a solver + verifier chain (the verifier finished the cut answers) that
        then lost to one solver under the evaluation's 384 (2026-12-05)."""
        train_cap, eval_cap = self.train.agent_max_tokens, self.evaluate.agent_max_tokens
        if train_cap is not None and (eval_cap is None or eval_cap > train_cap):
            warnings.warn(
                f"train.agent_max_tokens={train_cap} caps the teacher sweep's and the rollouts' agents below what "
                f"evaluation gives them (evaluate.agent_max_tokens={eval_cap}; None is the pool's own caps), so "
                "training under-rates specs whose answers need the longer cap; set both to the same value, or "
                "train.agent_max_tokens: null", UserWarning, stacklevel=2,
            )
        return self

    def train_config(self) -> TrainConfig:
        return self.train
