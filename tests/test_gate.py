"""The publish gate: better than what is served AND not worse than the run's best baseline beyond its
95% interval; a refusal says why and is not an error."""

from __future__ import annotations

from typing import Any

import pytest

from lemon_core.config import ORCHESTRATOR, SFT_ORCHESTRATOR, PipelineConfig
from lemon_core.gate import publish_decision


def _cfg(**publish: Any) -> PipelineConfig:
    return PipelineConfig.model_validate({"prepare": {"benchmarks": ["multiarith"]}, "publish": publish})


def _row(method: str, acc: float, n: int = 60, benchmark: str = "multiarith") -> dict[str, Any]:
    return {"benchmark": benchmark, "method": method, "accuracy": acc, "n": n}


def test_refuses_a_candidate_worse_than_the_best_baseline_beyond_its_interval() -> None:
    rows = [_row(ORCHESTRATOR, 0.0), _row("cot", 0.625), _row("sc", 0.375)]
    d = publish_decision(_cfg(), rows, served_card=None)  # the README's old run: 0.000 vs CoT 0.625
    assert not d.publish and d.best_baseline == "cot" and "below the best baseline cot" in d.reason


def test_a_small_gap_inside_the_interval_or_the_margin_publishes() -> None:
    rows = [_row(ORCHESTRATOR, 0.60, n=60), _row("cot", 0.65, n=60)]
    d = publish_decision(_cfg(), rows, None)
    assert d.publish  # 0.60's upper bound (~0.72) reaches 0.65
    assert d.reason == "accuracy 0.600 (nothing served yet; best baseline cot 0.650, below it but not with " \
                       "confidence: 95% upper bound 0.714)"  # published, yet the reason says it is below
    above = publish_decision(_cfg(), [_row(ORCHESTRATOR, 0.70), _row("cot", 0.65)], None)
    assert above.publish and "below" not in above.reason
    few = [_row(ORCHESTRATOR, 0.40, n=200), _row("cot", 0.50, n=200)]
    assert not publish_decision(_cfg(), few, None).publish  # upper bound ~0.47 < 0.50
    assert publish_decision(_cfg(baseline_margin=0.05), few, None).publish


def test_must_beat_the_served_model_too() -> None:
    rows = [_row(ORCHESTRATOR, 0.70), _row("cot", 0.65)]
    served = {"metrics": {"accuracy": 0.72}}
    d = publish_decision(_cfg(), rows, served)
    assert not d.publish and "served" in d.reason and d.served == 0.72
    assert publish_decision(_cfg(), rows, {"metrics": {"accuracy": 0.69}}).publish


def test_benchmarks_pool_by_n_and_sft_rows_are_not_baselines() -> None:
    rows = [_row(ORCHESTRATOR, 0.9, n=10, benchmark="a"), _row(ORCHESTRATOR, 0.5, n=90, benchmark="b"),
            _row("cot", 0.55, n=100, benchmark="a"), _row(SFT_ORCHESTRATOR, 0.99, n=100)]
    d = publish_decision(_cfg(), rows, None)
    assert d.candidate == pytest.approx(0.54) and d.best_baseline == "cot" and d.publish
