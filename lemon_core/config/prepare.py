"""What ``prepare`` writes (``prepare`` in a pipeline config); the stage itself is ``lemon_core.prepare``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PrepareConfig(BaseModel):
    """What to prepare. Fractions split each benchmark's source split; limits cap each part after."""

    model_config = ConfigDict(extra="forbid")

    benchmarks: list[str] = Field(min_length=1, description="benchmark names, e.g. [multiarith, gsm8k]")
    source_split: dict[str, str] = Field(
        default_factory=dict, description="benchmark -> split to draw from (default: its protocol split)"
    )
    data_dir: str | None = Field(default=None, description="raw benchmark files (default: loader's own)")
    train_fraction: float = Field(default=0.6, gt=0, lt=1, description="share of each benchmark for training")
    val_fraction: float = Field(default=0.1, ge=0, lt=1, description="share held out for validation (SFT checks)")
    train_limit: int | None = Field(default=None, ge=1, description="max train tasks per benchmark")
    val_limit: int | None = Field(default=None, ge=1, description="max val tasks per benchmark")
    test_limit: int | None = Field(default=None, ge=1, description="max test tasks per benchmark")
    shard_size: int = Field(default=64, ge=1, description="tasks per shard (one rollout pod each)")
    seed: int = Field(0, description="seeds the split and the shard order")

    @model_validator(mode="after")
    def _fractions_leave_test(self) -> PrepareConfig:
        if self.train_fraction + self.val_fraction >= 1:
            raise ValueError(
                f"train_fraction + val_fraction = {self.train_fraction + self.val_fraction:g} leaves no test "
                "examples; make their sum < 1"
            )
        return self
