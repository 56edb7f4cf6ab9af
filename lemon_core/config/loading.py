"""The one way lemon loads a config: a YAML file (or a bundled name, or a JSON string) + ``LEMON_*`` env + CLI flags.

``load_settings(Model, source, overrides)`` reads a YAML path, a bundled config name (``train-cpu``,
``local-cpu``) or a JSON string, merges validated overrides (CLI flags) into it, and builds the model;
for ``BaseSettings`` models the environment (``LEMON_OPTIM__LR=1e-5``) wins over the file. Every
failure is a ``ConfigError`` naming the file, the field and the problem (``format_validation_error``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

from lemon_core.errors import ConfigError, ConfigNotFoundError, format_validation_error

BUNDLED = Path(__file__).parent.parent / "configs"

M = TypeVar("M", bound=BaseModel)


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
