"""The publish gate: a trained orchestrator is published only when it is better than what is served,
not worse than the best baseline evaluated in the same run, and not dominated by a cheaper baseline.

Both comparisons use the configured metric (``publish.metric``, higher is better, averaged over the
run's benchmarks weighted by n). The baseline comparison is interval-aware: for ``accuracy`` the
candidate is refused only when even its 95% Wilson upper bound plus ``publish.baseline_margin`` stays
below the best baseline's accuracy, i.e. when the run shows it worse with confidence. With
``publish.refuse_dominated`` (default) it is also refused when a baseline is cheaper per example (the
orchestrator's own call counted) and at least as accurate as the run can tell
(``comparison.dominating_baseline``): an orchestrator that ties CoT at a higher price is not worth serving.
A refusal is not a failed run: the decision and its reason go into the report and the run's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from lemon_core.comparison import dominating_baseline, pooled, pooled_cost
from lemon_core.config import ORCHESTRATOR, SFT_ORCHESTRATOR, PipelineConfig
from lemon_core.errors import LemonError
from lemon_core.stats import wilson_interval


class PublishDecision(BaseModel):
    publish: bool
    reason: str
    candidate: float
    served: float | None = None
    best_baseline: str | None = None
    best_baseline_value: float | None = None


def _pooled(rows: Sequence[dict[str, Any]], metric: str) -> tuple[float, float]:
    """(n-weighted mean of ``metric``, upper 95% bound); the bound is Wilson's for accuracy."""
    value, n = pooled(rows, lambda r: float(r[metric]))
    upper = wilson_interval(value * n, n)[1] if metric == "accuracy" else value
    return value, upper


def _candidate(rows: Sequence[dict[str, Any]], metric: str, method: str = ORCHESTRATOR) -> tuple[float, float]:
    """(n-weighted ``metric``, its 95% upper bound) of the trained orchestrator over the run's benchmarks."""
    mine = [r for r in rows if r["method"] == method and metric in r]
    if not mine:
        raise LemonError(f"no {method!r} rows with field {metric!r} to compare; check publish.metric")
    return _pooled(mine, metric)


def candidate_metric(rows: Sequence[dict[str, Any]], metric: str, method: str = ORCHESTRATOR) -> float:
    """The trained orchestrator's ``metric`` over the run's benchmarks (n-weighted)."""
    return _candidate(rows, metric, method)[0]


def publish_decision(cfg: PipelineConfig, rows: Sequence[dict[str, Any]],
                     served_card: dict[str, Any] | None) -> PublishDecision:
    """Whether to publish the run's orchestrator, and why (see the module docstring)."""
    metric, margin = cfg.publish.metric, cfg.publish.baseline_margin
    cand, cand_upper = _candidate(rows, metric)
    served = (served_card or {}).get("metrics", {}).get(metric)
    decision = PublishDecision(publish=False, reason="", candidate=cand, served=served)
    baselines: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["method"] not in (ORCHESTRATOR, SFT_ORCHESTRATOR) and metric in r:
            baselines.setdefault(r["method"], []).append(r)
    if baselines:
        name, best = max(((m, _pooled(rs, metric)[0]) for m, rs in baselines.items()), key=lambda x: x[1])
        decision.best_baseline, decision.best_baseline_value = name, best
        if cand_upper + margin < best:
            decision.reason = (f"{metric} {cand:.3f} (95% upper bound {cand_upper:.3f}) is below the best baseline "
                               f"{name} ({best:.3f}) by more than the margin {margin:g}")
            return decision
        mine = [r for r in rows if r["method"] == ORCHESTRATOR and "mean_cost_usd" in r]
        priced = {m: rs for m, rs in baselines.items() if all("mean_cost_usd" in r for r in rs)}
        dominating = dominating_baseline(mine, priced) if cfg.publish.refuse_dominated and mine else None
        if dominating is not None:
            name, accuracy, cost = dominating
            mine_cost = pooled_cost(mine)
            decision.reason = (f"dominated by {name}: accuracy {accuracy:.3f} at ${cost:.2e}/example is as accurate "
                               f"as the run can tell (the candidate's {metric} {cand:.3f}, its 95% interval reaching "
                               f"down to it) and cheaper than the candidate's ${mine_cost:.2e}/example (its own "
                               "call counted); set publish.refuse_dominated: false to publish it anyway")
            return decision
    if served is not None and not cand > served + cfg.publish.min_improvement:
        decision.reason = (f"{metric} {cand:.3f} does not beat the served model's {served:.3f} "
                           f"by more than {cfg.publish.min_improvement:g}")
        return decision
    decision.publish = True
    versus = f"served {served:.3f}" if served is not None else "nothing served yet"
    if decision.best_baseline:
        best = decision.best_baseline_value or 0.0
        versus += f"; best baseline {decision.best_baseline} {best:.3f}"
        if cand < best:  # published, and the reader should see that it is below the baseline, not above it
            versus += f", below it but not with confidence: 95% upper bound {cand_upper:.3f}"
    decision.reason = f"{metric} {cand:.3f} ({versus})"
    return decision
