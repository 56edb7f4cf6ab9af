"""One config loader for every stage: YAML path, bundled name or JSON; validated overrides; LEMON_* env;
every failure a ConfigError that names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from lemon_core.config import PipelineConfig, TrainConfig, load_settings
from lemon_core.errors import ConfigError, LemonError
from lemon_core.serve.settings import ServeSettings
from lemon_core.stages import load_config


def test_bundled_name_json_and_path_load_the_same(tmp_path: Path) -> None:
    by_name = load_config("local-tiny")
    again = load_config(by_name.model_dump_json())
    path = tmp_path / "p.yaml"
    path.write_text("prepare: {benchmarks: [multiarith]}\ntrain: {iterations: 7}\n")
    from_file = load_config(path)
    assert again == by_name and isinstance(from_file.train, TrainConfig) and from_file.train.iterations == 7


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("train: [1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "mapping of fields"),
        ("prepare: {benchmarks: [multiarith]}\ntrain: {optim: {lr: fast}}\n", "train: optim.lr"),
        ("prepare: {benchmarks: [multiarith]}\ntrian: {}\n", r"unknown field\(s\) \[.trian.\]"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_binary_file_and_folder_are_clear(tmp_path: Path) -> None:
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(b"\xff\xfe\x00\x01" * 10)
    with pytest.raises(ConfigError, match="not a text file"):
        load_settings(TrainConfig, blob)
    with pytest.raises(ConfigError, match="is a folder"):
        load_settings(TrainConfig, tmp_path)
    with pytest.raises(LemonError, match="bundled configs"):
        load_settings(TrainConfig, "no-such-config")


def test_overrides_are_validated_and_merge_into_sections() -> None:
    cfg = TrainConfig.from_yaml("train-tiny", iterations=5, optim={"lr": 0.5})
    assert cfg.iterations == 5 and cfg.optim.lr == 0.5
    assert cfg.optim.micro_batch_size == TrainConfig.from_yaml("train-tiny").optim.micro_batch_size  # merged
    with pytest.raises(ConfigError, match="iterations"):
        TrainConfig.from_yaml("train-tiny", iterations=-1)
    with pytest.raises(ConfigError, match="lr"):
        TrainConfig.from_yaml("train-tiny").with_overrides(optim={"lr": "fast"})


def test_env_overrides_the_file_in_the_pipeline_train_section_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_OPTIM__LR", "0.25")
    assert load_config("local-tiny").train.optim.lr == 0.25
    assert TrainConfig.from_yaml("train-tiny").optim.lr == 0.25


def test_every_config_field_has_a_description() -> None:
    missing = []

    def walk(model: type, prefix: str) -> None:
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(prefix + name)
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields") and ann is not model:
                walk(ann, f"{prefix}{name}.")

    walk(PipelineConfig, "")
    walk(ServeSettings, "serve.")
    assert not missing, f"config fields without a description: {missing}"


def test_a_training_cap_tighter_than_the_evaluated_one_is_warned_about() -> None:
    """The teacher sweep and the rollouts measure agents under train.agent_max_tokens; a tighter cap than
    evaluation's cuts answers in training only and skews what is taught (local-cpu at 192, 2026-12-05)."""
    import warnings

    base = {"prepare": {"benchmarks": ["multiarith"]}}
    with pytest.warns(UserWarning, match=r"train.agent_max_tokens=192 .*evaluate.agent_max_tokens=None"):
        PipelineConfig.model_validate({**base, "train": {"agent_max_tokens": 192}})
    with pytest.warns(UserWarning, match=r"evaluate.agent_max_tokens=384"):
        PipelineConfig.model_validate({**base, "train": {"agent_max_tokens": 192},
                                       "evaluate": {"agent_max_tokens": 384}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # equal caps, no training cap, and every shipped pipeline config: silent
        PipelineConfig.model_validate({**base, "train": {"agent_max_tokens": 24}, "evaluate": {"agent_max_tokens": 24}})
        PipelineConfig.model_validate(base)
        for name in ("local-cpu", "local-tiny", "cluster-gpu"):
            load_config(name)


def test_the_progress_display_variable_reads_as_on_or_off(monkeypatch) -> None:  # noqa: ANN001
    """LEMON_PROGRESS names the display mode (progress.py) and is also TrainConfig.progress's environment name."""
    for mode, on in (("lines", True), ("bar", True), ("off", False)):
        monkeypatch.setenv("LEMON_PROGRESS", mode)
        assert TrainConfig().progress is on
        assert load_settings(PipelineConfig, {"prepare": {"benchmarks": ["multiarith"]}}).train.progress is on
    monkeypatch.setenv("LEMON_PROGRESS", "sideways")
    with pytest.raises(ValueError, match="progress"):  # pydantic's ValidationError is a ValueError
        TrainConfig()
