"""Service configuration: one pydantic-settings model, from YAML + ``LEMON_*`` environment + CLI flags.

Precedence (highest first): ``lemon serve`` flags, ``LEMON_*`` environment, the YAML file, defaults.
Unknown ``LEMON_*`` variables are ignored on purpose: the same pod environment carries variables
meant for other lemon parts (``LEMON_CACHE_DIR`` is read by lemon_core.models, not here). Unknown
keys in the YAML file are rejected, since there a typo is almost certainly a mistake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lemon_core.errors import ConfigError


class ServeSettings(BaseSettings):
    """Everything ``lemon serve`` needs. Environment: ``LEMON_<FIELD>`` (e.g. ``LEMON_MAX_AGENTS=4``)."""

    model_config = SettingsConfigDict(env_prefix="LEMON_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings  # the environment overrides the YAML file; CLI flags override both

    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0 in a pod)")
    port: int = Field(8080, ge=1, le=65535, description="TCP port")
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field("info", description="log level")
    pool: str = Field("cpu", description="pool YAML path or built-in name (cpu, gpu, simulated)")
    # orchestrator
    orchestrator: str = Field(
        "smollm2-135m-instruct",
        description="in-process: local path, checkpoint or train-output folder, `lemon models` alias; "
                    "over HTTP (orchestrator_base_url set): the served model name")
    orchestrator_base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint of the orchestrator (e.g. http://vllm:8000/v1)")
    orchestrator_api_key_env: str | None = Field(None, description="env var holding its API key, if any")
    orchestrator_timeout_s: float = Field(120.0, gt=0, description="longest wait for the orchestrator's spec")
    orchestrator_device: str = Field("cpu", description="torch device of an in-process orchestrator")
    orchestrator_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="weights dtype of an in-process orchestrator")
    orchestrator_max_tokens: int = Field(512, ge=1, le=32768, description="length cap of a written spec")
    orchestrator_temperature: float = Field(0.0, ge=0, le=2, description="first sample (0 = greedy)")
    orchestrator_grammar: bool = Field(
        True,
        description="constrain the orchestrator to the spec grammar (lemon_core/grammar.py): in process through "
        "a logits processor, over HTTP through vLLM's `structured_outputs` (guidance backend); ids are a1, a2, "
        "... and the output is the last agent, so only graph rules and budgets can still make a spec invalid",
    )
    orchestrator_grammar_max_text_chars: int = Field(
        300, ge=1, description="longest role/duty text under the grammar (a weak model's rambling duty would "
        "otherwise run the spec past orchestrator_max_tokens)",
    )
    resample_temperature: float = Field(0.7, ge=0, le=2, description="the re-sample after an invalid spec")
    include_roles: bool = Field(True, description="list the base-role library in the orchestrator prompt")
    include_format: bool = Field(True, description="show the YAML format + example in the prompt")
    spec_format: Literal["yaml", "json"] = Field(
        "yaml", description="the spec form the orchestrator was trained to write (train config spec_format)")
    seed: int = Field(0, description="sampling seed of the orchestrator and agents")
    # security and limits
    auth_token_file: str | None = Field(None, description="file with one bearer token per line")
    allow_unauthenticated: bool = Field(False, description="serve without auth (local development only)")
    max_body_bytes: int = Field(65536, ge=1024, description="larger request bodies get 413")
    max_task_chars: int = Field(8000, ge=1, description="longer tasks get 422")
    max_agents: int = Field(8, ge=1, le=64, description="most agents a spec may use (clients may ask fewer)")
    max_tokens: int = Field(
        8192, ge=1, description="most completion tokens a team may generate: the sum of its agents' "
                                "level max_tokens, checked on the spec before it runs")
    max_concurrent_requests: int = Field(32, ge=1, description="requests in progress; more get 429")
    retry_after_s: int = Field(1, ge=1, description="Retry-After sent with 429 and 503")
    batch_max_size: int = Field(16, ge=1, description="most requests orchestrated + executed together")
    batch_wait_ms: float = Field(10.0, ge=0, description="how long a batch waits for more requests")
    readiness_timeout_s: float = Field(2.0, gt=0, description="per-backend GET /models timeout of /readyz")
    readiness_cache_s: float = Field(
        5.0, ge=0, description="/readyz reuses its last backend checks this long, so probes never fan out "
                               "to every backend on each call")
    max_answer_format_chars: int = Field(500, ge=1, description="longer answer_format gets 422")
    min_budget_agents: int = Field(
        2, ge=1, description="smallest budget.max_agents a client may ask for: the orchestrator is not told "
                             "budgets (it gets the prompt it was trained on) and writes teams, so a tighter "
                             "budget would be met only by chance; it also sets the smallest max_tokens budget "
                             "(this many agents at the cheapest level's max_tokens)")
    header_timeout_s: float = Field(
        10.0, gt=0, description="a connection whose request headers are not complete this long is closed")
    body_timeout_s: float = Field(
        30.0, gt=0, description="a request body not complete this long after the headers gets 408")
    shutdown_grace_s: float = Field(
        25.0, gt=0, description="after SIGTERM, requests in progress get this long to finish before they are "
                                "cancelled; keep it below the pod's terminationGracePeriodSeconds")
    enable_docs: bool = Field(
        False, description="serve the interactive API docs at /docs (the page loads its JavaScript from a "
                           "public CDN, so it is off by default; /openapi.json is always there)")
    served_model_name: str = Field("lemon", description="model name of /v1/chat/completions")


def load_settings(config: str | Path | None = None, **overrides: Any) -> ServeSettings:
    """Settings from an optional YAML file, the environment, and ``overrides`` (None values skipped), through
    lemon's one config loader (``lemon_core.config.load_settings``); a problem is a ConfigError naming it."""
    from lemon_core.config import load_settings as load

    if config is not None and not Path(config).is_file() and not Path(config).is_dir():
        raise ConfigError(f"serve config {str(config)!r} not found; pass an existing YAML file")
    return load(ServeSettings, config, overrides)
