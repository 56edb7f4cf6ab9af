"""Every config model of lemon, as leaves of the module graph: nothing in this package imports torch or the code
the settings configure, so the code imports its config from here and never the other way round.

| module | models |
|---|---|
| ``loading`` | ``load_settings`` (YAML file + ``LEMON_*`` env + CLI flags), ``ConfigError`` on any problem |
| ``training`` | ``TrainConfig``: ``DataConfig``, ``OptimConfig``, ``LoraSettings``, ``DistributedConfig`` |
| ``rollout`` | ``RolloutConfig`` (sampling, counterfactual edits), ``VLLMSamplerConfig`` |
| ``grpo`` | ``GRPOConfig`` (the loss and the credit term) |
| ``reward`` | ``RewardConfig`` |
| ``sft`` | ``SFTConfig``, ``SweepConfig`` (the teacher sweep) |
| ``prepare`` | ``PrepareConfig`` |
| ``pipeline`` | ``PipelineConfig`` (a pipeline run): ``EvalSettings``, ``PublishSettings``, ``KubernetesSettings`` |
"""

from lemon_core.config.grpo import GRPOConfig
from lemon_core.config.loading import (
    BUNDLED,
    apply_overrides,
    build_model,
    bundled_config,
    load_settings,
    merge,
    read_config_source,
    yaml_problem,
)
from lemon_core.config.names import ORCHESTRATOR, SFT_ORCHESTRATOR
from lemon_core.config.pipeline import EvalSettings, KubernetesSettings, PipelineConfig, PublishSettings
from lemon_core.config.prepare import PrepareConfig
from lemon_core.config.reward import RewardConfig
from lemon_core.config.rollout import RolloutConfig, VLLMSamplerConfig
from lemon_core.config.sft import SWEEP_TOPOLOGIES, TOPOLOGIES, SFTConfig, SweepConfig
from lemon_core.config.training import (
    DataConfig,
    DistributedConfig,
    LoraSettings,
    OptimConfig,
    SpecFormat,
    TrainConfig,
    resolve_dtype,
)

__all__ = [
    "BUNDLED", "ORCHESTRATOR", "SFT_ORCHESTRATOR", "SWEEP_TOPOLOGIES", "TOPOLOGIES", "DataConfig",
    "DistributedConfig", "EvalSettings", "GRPOConfig", "KubernetesSettings", "LoraSettings", "OptimConfig",
    "PipelineConfig", "PrepareConfig", "PublishSettings", "RewardConfig", "RolloutConfig", "SFTConfig",
    "SpecFormat", "SweepConfig", "TrainConfig", "VLLMSamplerConfig", "apply_overrides", "build_model",
    "bundled_config", "load_settings", "merge", "read_config_source", "resolve_dtype", "yaml_problem",
]
