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


def _priced(method: str, acc: float, cost: float, own: float | None = None, n: int = 30) -> dict[str, Any]:
    return {**_row(method, acc, n=n), "mean_cost_usd": cost, "orchestrator_cost_usd": own}


def test_refuses_an_orchestrator_a_cheaper_baseline_ties_and_names_it() -> None:
    """The main job's old outcome: CoT@large's spec at CoT's agent cost plus the orchestrator's own call."""
    rows = [_priced(ORCHESTRATOR, 0.667, 4.87e-05, own=8.31e-06), _priced("cot", 0.667, 4.87e-05),
            _priced(SFT_ORCHESTRATOR, 0.9, 1e-9, own=1e-9)]  # the SFT row is not a baseline
    d = publish_decision(_cfg(), rows, None)
    assert not d.publish and d.reason.startswith("dominated by cot") and "refuse_dominated: false" in d.reason
    assert publish_decision(_cfg(refuse_dominated=False), rows, None).publish


def test_a_cheaper_baseline_that_is_less_accurate_with_confidence_does_not_dominate() -> None:
    rows = [_priced(ORCHESTRATOR, 0.80, 5e-05, own=8e-06, n=60), _priced("cot", 0.40, 1e-05, n=60),
            _priced("sc", 0.85, 9e-05, n=60)]  # sc is more accurate but dearer: not dominating either
    d = publish_decision(_cfg(), rows, None)
    assert d.publish, d.reason
    # the cheapest of two dominating baselines is named
    rows = [_priced(ORCHESTRATOR, 0.5, 5e-05, own=1e-05), _priced("cot", 0.5, 2e-05), _priced("chain", 0.55, 4e-05)]
    assert publish_decision(_cfg(), rows, None).reason.startswith("dominated by cot")


def test_sign_test_and_paired_comparison_by_hand() -> None:
    from lemon_core.comparison import paired_test, sign_test_p

    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)  # all five discordant problems one way: 2 · (1/2)^5
    assert sign_test_p(2, 8) == pytest.approx(2 * (1 + 10 + 45) / 1024)
    assert sign_test_p(8, 2) == sign_test_p(2, 8)
    a = {"p1": 1.0, "p2": 1.0, "p3": 0.0, "p4": 1.0, "only-a": 1.0}
    b = {"p1": 0.0, "p2": 1.0, "p3": 1.0, "p4": 0.0, "only-b": 0.0}
    test = paired_test(a, b)
    assert (test.n, test.wins, test.losses) == (4, 2, 1)
    assert test.difference == pytest.approx(0.25) and test.p == pytest.approx(1.0)
