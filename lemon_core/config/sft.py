"""The SFT warm-up's settings (``sft`` in a train config) and the teacher sweep's (``sft.sweep``).

The warm-up itself is ``lemon_core.sft``, the sweep ``lemon_core.teachers``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lemon_core.config.names import SMALL_TOPOLOGIES

TOPOLOGIES = SMALL_TOPOLOGIES
SWEEP_TOPOLOGIES = ("cot", "chain", "sc")


class SweepConfig(BaseModel):
    """Which candidate specs the teacher sweep executes for each training task."""

    model_config = ConfigDict(extra="forbid")

    topologies: list[str] = Field(
        default_factory=lambda: list(SWEEP_TOPOLOGIES),
        description=f"baseline topologies tried at every capacity level, from {list(SWEEP_TOPOLOGIES)} "
        "(cot = one solver, chain = solver then verifier, sc = two solvers + aggregator)",
    )
    helpers_cheap: bool = Field(
        True, description="also try each multi-agent topology with every agent at the cheapest level except "
        "the output agent at the most capable one",
    )
    max_tasks: int | None = Field(
        None, ge=1, description="sweep at most this many training tasks (the rest get no teacher spec)"
    )
    batch_size: int = Field(16, ge=1, description="tasks executed together (every candidate of a task at once)")
    select: Literal["per_benchmark", "per_task"] = Field(
        "per_benchmark",
        description="per_benchmark: every task of a benchmark is taught one candidate chosen from the mean rewards "
        "on that benchmark (`se_margin`; what a policy can learn: it cannot know which tasks a cheap agent solves by "
        "luck); per_task: each task its own best-reward candidate (tasks none solves get the benchmark's choice)",
    )
    se_margin: float = Field(
        1.0, ge=0, description="teach the cheapest candidate (measured cost per task) whose mean reward is within "
        "this many standard errors of the best mean reward (the one-standard-error rule: on a few tasks a candidate "
        "one task ahead is not measurably better); 0 teaches the best mean reward whatever it costs",
    )
    teach_top: int = Field(
        1, ge=1, description="teach each task this many candidates (by the `select` rule: per benchmark the "
        "`se_margin` choice first, then the best mean rewards), one SFT "
        "target each: 1 teaches one spec per benchmark and SFT collapses onto it, so every spec of a GRPO group is "
        "the same and no advantage is left to learn from; 2-3 keep the SFT policy spread over the good choices",
    )


class SFTConfig(BaseModel):
    """SFT warm-up settings."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="run the SFT warm-up before GRPO")
    steps: int = Field(60, ge=0, description="optimizer steps")
    batch_size: int = Field(8, ge=1, description="(prompt, spec) pairs per optimizer step")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate of the warm-up")
    topologies: list[str] = Field(
        default_factory=lambda: list(TOPOLOGIES),
        description=f"baseline topologies to vary, from {list(TOPOLOGIES)}",
    )
    vary_text: bool = Field(True, description="vary role names and customised duties (else defaults)")
    mixed_capacity: bool = Field(True, description="per-agent random capacity (else one level per spec)")
    pairs_per_task: int = Field(1, ge=0, description="templated specs per training task (0: teacher only)")
    teacher_jsonl: str | None = Field(None, description="extra teacher specs, JSONL {question, spec}")
    eval_tasks: int = Field(4, ge=0, description="tasks whose samples measure the valid-spec rate")
    eval_samples: int = Field(2, ge=1, description="samples per task for the valid-spec rate")
    check_before: bool = Field(
        True, description="also measure the valid-spec rate before SFT (the base model's, to compare with the rate "
        "after); it samples as much as a check after, on CPU mostly cut-off gibberish at the full budget",
    )
    teacher: Literal["templated", "sweep"] = Field(
        "templated",
        description="templated: random valid specs (teaches the format only); sweep: per training task the "
        "best-reward spec of a sweep of candidates executed on the pool (teaches choices; lemon_core/teachers.py)",
    )
    sweep: SweepConfig = Field(default_factory=SweepConfig, description="candidates of teacher: sweep")
    target_valid_rate: float | None = Field(
        None, gt=0, le=1,
        description="keep training in rounds of `steps` until the unconstrained valid-spec rate on the held-out "
        "samples (eval_tasks × eval_samples, use ≥ 32) reaches this, at most max_rounds rounds; None: one round",
    )
    max_rounds: int = Field(1, ge=1, description="most rounds of `steps` when target_valid_rate is set")
