"""Capacity pool: the named levels (small / medium / large ...) an orchestrator can assign agents to.

Each level says which backend serves it, which model, how to sample, and what 1M input/output tokens
cost. Levels are listed cheapest first; "downgrade one level" (a counterfactual edit) means moving one
step towards the start of that list. Levels that name the same backend kind and model share one
backend instance, so two levels over one model do not load it twice.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lemon_core.backends.base import Backend, BackendError
from lemon_core.errors import LemonError, format_validation_error

BackendKind = Literal["transformers", "openai", "vllm", "simulated"]


class PoolError(LemonError, ValueError):
    """A pool file or level reference is wrong; the message names the field and the fix."""


class CapacityLevel(BaseModel):
    """One capacity level: backend + model + sampling + price."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
    backend: BackendKind
    model: str = Field(min_length=1, description="HF id, local path, or a `lemon models` alias")
    price_in_per_1m: float = Field(ge=0, description="USD per 1M prompt tokens")
    price_out_per_1m: float = Field(ge=0, description="USD per 1M completion tokens")
    max_tokens: int = Field(default=256, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    timeout_s: float = Field(default=120.0, gt=0)
    base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint (backend: openai)")
    api_key_env: str | None = Field(default=None, description="env var holding the API key, if any")
    max_concurrency: int = Field(default=8, ge=1)
    options: dict[str, Any] = Field(default_factory=dict, description="extra backend constructor args")

    @model_validator(mode="after")
    def _openai_needs_url(self) -> CapacityLevel:
        if self.backend == "openai" and not self.base_url:
            raise ValueError(f"level {self.name!r}: backend 'openai' needs base_url (e.g. http://vllm:8000/v1)")
        return self

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD cost of one call at this level's prices."""
        return (prompt_tokens * self.price_in_per_1m + completion_tokens * self.price_out_per_1m) / 1e6


class CapacityPool(BaseModel):
    """Ordered capacity levels (cheapest first) plus the backends that serve them (built lazily)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    levels: list[CapacityLevel] = Field(min_length=1)
    description: str = ""

    @field_validator("levels")
    @classmethod
    def _unique_names(cls, levels: list[CapacityLevel]) -> list[CapacityLevel]:
        names = [lv.name for lv in levels]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate level names {dupes}: each capacity level needs a unique name")
        return levels

    def model_post_init(self, _context: Any) -> None:
        self._backends: dict[tuple[str, str, str], Backend] = {}
        self._overrides: dict[str, Backend] = {}
        self._answer_dir: Path | None = None

    # --- remembered answers -----------------------------------------------------------------------
    def remember_answers(self, directory: Path) -> None:
        """Keep this pool's agent answers in ``directory`` (``executor.ExecutionCache.for_pool``): stages of one
        run that share the directory reuse each other's identical calls instead of running them again."""
        self._answer_dir = Path(directory)

    @property
    def answer_cache_dir(self) -> Path | None:
        return self._answer_dir

    def identity(self) -> str:
        """A short digest of what decides this pool's answers (levels: backends, models, caps, sampling)."""
        levels = [lv.model_dump(mode="json") for lv in self.levels]
        return hashlib.sha256(json.dumps(levels, sort_keys=True).encode()).hexdigest()[:12]

    # --- lookup -------------------------------------------------------------------------------
    @property
    def level_names(self) -> list[str]:
        return [lv.name for lv in self.levels]

    def level(self, name: str) -> CapacityLevel:
        for lv in self.levels:
            if lv.name == name:
                return lv
        raise PoolError(f"unknown capacity level {name!r}; this pool has {self.level_names}")

    def downgrade(self, name: str) -> str | None:
        """The next cheaper level, or None if ``name`` is already the cheapest."""
        i = self.level_names.index(self.level(name).name)
        return self.levels[i - 1].name if i > 0 else None

    def cost(self, name: str, prompt_tokens: int, completion_tokens: int) -> float:
        return self.level(name).cost(prompt_tokens, completion_tokens)

    # --- backends -----------------------------------------------------------------------------
    def set_backend(self, name: str, backend: Backend) -> None:
        """Serve one level with a given backend object (tests, or an already-loaded model)."""
        self.level(name)
        self._overrides[name] = backend

    def backend(self, name: str) -> Backend:
        """The backend serving level ``name``, created on first use and shared by same-model levels."""
        if name in self._overrides:
            return self._overrides[name]
        lv = self.level(name)
        key = (lv.backend, lv.model, lv.base_url or "")
        if key not in self._backends:
            self._backends[key] = make_backend(lv)
        return self._backends[key]

    def greedy_uses_seed(self, name: str) -> bool:
        """Whether a greedy (temperature 0) call at level ``name`` depends on its seed. A language model's
        greedy answer does not; the simulated pool draws every answer from a seed. A backend given with
        ``set_backend`` says so with its ``greedy_uses_seed`` attribute (unknown: assume it does). Decided
        without creating the backend, so a call served from the cache loads no model."""
        if name in self._overrides:
            return bool(getattr(self._overrides[name], "greedy_uses_seed", True))
        return self.level(name).backend == "simulated"

    def close(self) -> None:
        for b in list(self._backends.values()) + list(self._overrides.values()):
            b.close()
        self._backends.clear()

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path) -> CapacityPool:
        return load_pool(path)


def make_backend(level: CapacityLevel) -> Backend:
    """Build the backend object for one level. Imports are lazy so CPU installs never import vllm."""
    if level.backend == "openai":
        from lemon_core.backends.openai_http import OpenAIBackend

        return OpenAIBackend(
            base_url=level.base_url or "", model=level.model, api_key_env=level.api_key_env,
            timeout_s=level.timeout_s, max_concurrency=level.max_concurrency, **level.options,
        )
    if level.backend == "transformers":
        from lemon_core.backends.transformers_backend import TransformersBackend

        return TransformersBackend(model=level.model, **level.options)
    if level.backend == "vllm":
        from lemon_core.backends.vllm_backend import VLLMBackend

        return VLLMBackend(model=level.model, **level.options)
    if level.backend == "simulated":
        from lemon_core.backends.simulated import SimulatedBackend

        return SimulatedBackend(level=level.name, **level.options)
    raise BackendError(f"level {level.name!r}: unknown backend kind {level.backend!r}")


BUILTIN_POOLS = {"cpu": "pool-cpu.yaml", "gpu": "pool-gpu.yaml", "simulated": "pool-simulated.yaml"}


def load_pool(source: str | Path) -> CapacityPool:
    """Load a pool from a YAML path, or a built-in name: ``cpu`` (default), ``gpu``, ``simulated``."""
    if str(source) in BUILTIN_POOLS:
        text = resources.files("lemon_core.configs").joinpath(BUILTIN_POOLS[str(source)]).read_text()
        where = f"built-in pool {source!r}"
    else:
        path = Path(source)
        if not path.is_file():
            raise PoolError(
                f"pool file {str(path)!r} not found; pass a YAML path or one of {sorted(BUILTIN_POOLS)}"
            )
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError:
            raise PoolError(f"pool file {str(path)!r} is not a text file (a pool is a UTF-8 YAML file)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PoolError(f"{where}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise PoolError(f"{where}: expected a mapping with a 'levels' list at the top")
    try:
        return CapacityPool.model_validate(data)
    except ValidationError as e:
        raise PoolError(f"{where}: {format_validation_error(e)}") from None
