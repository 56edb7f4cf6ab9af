"""A saved orchestrator is prompted the way it was trained: its prompt settings travel with its weights.

Why it matters: a model fine-tuned without the prompt's format example (``include_format: false``, the CPU
configs) and then asked with it - or the other way round - sees a prompt it never saw in training. Every loader
(training stages, ``lemon eval --orchestrator``, the service) reads the record that ``save_model_dir`` writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from lemon_core.checkpoint import save_model_dir
from lemon_core.config import TrainConfig
from lemon_core.errors import ConfigError
from lemon_core.policy import OrchestratorPolicy
from lemon_core.pool import load_pool
from lemon_core.prompts import (
    PROMPT_SETTINGS_FILE,
    PromptSettings,
    read_prompt_settings,
    settings_for_model,
)
from lemon_core.serve.orchestrator import with_model_prompt
from lemon_core.serve.settings import ServeSettings
from lemon_core.train import load_policy

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def trained_without_format(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model saved by lemon after being prompted without the format example or the role list."""
    torch.set_num_threads(1)
    base = build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=0)
    policy = OrchestratorPolicy.load(str(base), include_roles=False, include_format=False)
    saved = tmp_path_factory.mktemp("saved") / "sft-model"
    save_model_dir(policy, saved)
    return saved


def tiny_config(model: Path, **fields: object) -> TrainConfig:
    return TrainConfig(model=str(model), pool="simulated", **fields)


def test_saving_a_model_records_its_prompt_settings(trained_without_format: Path) -> None:
    record = json.loads((trained_without_format / PROMPT_SETTINGS_FILE).read_text())
    assert record == {"include_roles": False, "include_format": False, "spec_format": "yaml"}
    assert read_prompt_settings(trained_without_format) == PromptSettings(include_roles=False, include_format=False)


def test_a_base_model_has_no_record_and_gets_the_requested_settings(tmp_path: Path) -> None:
    asked = PromptSettings(include_format=False)
    assert read_prompt_settings(tmp_path) is None
    assert settings_for_model(tmp_path, asked, {"include_format"}) == asked


def test_a_broken_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / PROMPT_SETTINGS_FILE).write_text('{"include_format": "sometimes"}')
    with pytest.raises(ValueError, match=PROMPT_SETTINGS_FILE):
        read_prompt_settings(tmp_path)


def test_load_policy_prompts_a_saved_model_as_it_was_trained(trained_without_format: Path) -> None:
    """A config that leaves the prompt settings at their defaults (include_format true) gets the record's."""
    cfg = tiny_config(trained_without_format)
    assert "include_format" not in cfg.model_fields_set and cfg.include_format
    policy = load_policy(cfg, str(trained_without_format))
    assert (policy.include_roles, policy.include_format) == (False, False)
    pool = load_pool("simulated")
    as_trained = OrchestratorPolicy(policy.model, policy.tokenizer, include_roles=False, include_format=False)
    with_defaults = OrchestratorPolicy(policy.model, policy.tokenizer)
    assert policy.prompt_ids(QUESTION, pool) == as_trained.prompt_ids(QUESTION, pool)
    assert len(policy.prompt_ids(QUESTION, pool)) < len(with_defaults.prompt_ids(QUESTION, pool))


def test_a_config_that_contradicts_the_record_is_refused(trained_without_format: Path) -> None:
    cfg = tiny_config(trained_without_format, include_format=True)
    with pytest.raises(ConfigError, match=r"include_format=True.*trained with include_format: false"):
        load_policy(cfg, str(trained_without_format))
    # ... unless the caller says the config names no prompt setting (lemon eval's fallback config)
    assert load_policy(cfg, str(trained_without_format), explicit=()).include_format is False


def test_the_service_serves_a_saved_model_with_its_own_prompt(trained_without_format: Path) -> None:
    served = with_model_prompt(ServeSettings(orchestrator=str(trained_without_format)))
    assert (served.include_roles, served.include_format) == (False, False)
    with pytest.raises(ValueError, match="include_roles=True"):
        with_model_prompt(ServeSettings(orchestrator=str(trained_without_format), include_roles=True))
    # over HTTP there is no folder to read: the settings stand as given
    remote = ServeSettings(orchestrator=str(trained_without_format), orchestrator_base_url="http://127.0.0.1:9/v1")
    assert with_model_prompt(remote).include_format is True


def test_the_recorded_spec_format_also_sets_the_grammar_and_sft_targets(tmp_path: Path) -> None:
    """A model trained to write JSON keeps writing JSON under a config that leaves spec_format at its default:
    the prompt, the sampling grammar and any further SFT targets all follow the record."""
    from lemon_core.baselines import cot
    from lemon_core.sft import teacher_pairs
    from lemon_core.train import constrain

    torch.set_num_threads(1)
    base = build_tiny_chat_model(tmp_path / "tiny", seed=0)
    saved = tmp_path / "json-model"
    save_model_dir(OrchestratorPolicy.load(str(base), include_roles=False, include_format=False,
                                           spec_format="json"), saved)
    cfg = tiny_config(saved, include_roles=False, include_format=False,
                      rollout={"grammar": True, "check_budget": False}, sft={"pairs_per_task": 1})
    pool = load_pool("simulated")
    policy = constrain(load_policy(cfg, str(saved)), cfg, pool.level_names)
    assert policy.spec_format == "json" and policy.grammar.spec_format == "json"
    task = type("Task", (), {"question": QUESTION, "id": "t0"})()
    pairs, _ = teacher_pairs(policy, cfg, pool, [task], scorer=lambda answer, ex: 0.0, progress=False)
    assert pairs and all(target.startswith("{") for _, target in pairs)
    assert policy.spec_completion(cot("small")).startswith("{")
