"""One pipeline run's config (``configs/local-cpu.yaml``): ``prepare``, a typed ``train`` section, ``evaluate``,
``publish`` and ``kubernetes``."""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lemon_core.config.names import ORCHESTRATOR, SFT_ORCHESTRATOR
from lemon_core.config.prepare import PrepareConfig
from lemon_core.config.training import TrainConfig
from lemon_core.errors import format_validation_error


class EvalSettings(BaseModel):
    """The evaluation matrix of a pipeline run: methods × benchmarks on one prepared split."""

    model_config = ConfigDict(extra="forbid")

    benchmarks: list[str] | None = Field(None, description="default: the prepared benchmarks")
    methods: list[str] = Field(
        default_factory=lambda: [ORCHESTRATOR, "cot"],
        description=f"'{ORCHESTRATOR}' (the trained orchestrator), '{SFT_ORCHESTRATOR}' (the SFT-only one) "
        "and/or baselines; a baseline at one level is 'method@level' (cot@small), else it runs at `capacity`",
    )
    samples_per_problem: int = Field(
        0, ge=0, le=32,
        description="orchestrators: also sample this many specs per problem at the rollout temperature and report "
        "their mean training reward (the distribution GRPO moves, which one greedy pick hides); 0 = off",
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
    refuse_dominated: bool = Field(
        True,
        description="refuse to publish when a baseline of the same run is cheaper per example (the orchestrator's own "
        "call counted) and at least as accurate as the run can tell (the candidate's 95% lower bound does not clear "
        "it): such an orchestrator costs more for nothing; the refusal names the baseline",
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
    probe_tasks: int = Field(
        0, ge=0, le=16,
        description="validation tasks per benchmark sampled (G specs each, no edits, no update) at every GRPO "
        "iteration with the policy of that iteration: their mean reward is a curve of the policy, not of the "
        "step's task difficulty; 0 = off",
    )
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
        sweep and the rollout rewards then under-rate specs whose answers need the longer cap (a verifier that
        finishes a cut answer looks better in training than it is under the evaluation's cap)."""
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
