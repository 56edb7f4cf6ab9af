"""Comparing the methods of one run: a method's whole cost, the paired test of two methods on the same problems,
and whether a cheaper baseline dominates the orchestrator.

Light on purpose (no torch): the gate, the report and the printed table all use these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lemon_core.stats import mean_interval, wilson_interval


def total_cost(summary: Mapping[str, Any]) -> float:
    """A method's cost per example from its summary (an ``EvalSummary`` dump or summary.json): the agent calls plus,
    for an orchestrator, its own call (prompt and spec)."""
    own = summary.get("orchestrator_cost_usd")
    return float(summary["mean_cost_usd"]) + (float(own) if own is not None else 0.0)


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test (McNemar's exact test on the discordant pairs): the probability, with no real
    difference, of a split at least as uneven as ``wins`` : ``losses`` among ``wins + losses`` fair coin flips."""
    n = wins + losses
    if n == 0:
        return 1.0
    low = min(wins, losses)
    tail = sum(math.comb(n, k) for k in range(low + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedTest:
    """Method A against method B on the problems both answered: n shared problems, the mean score difference
    A − B with its 95% interval (normal approximation over the per-problem differences), the problems A won and
    lost, and the sign test's p on those discordant problems."""

    n: int
    difference: float
    wins: int
    losses: int
    p: float
    difference_ci: tuple[float, float] = (0.0, 0.0)


def paired_test(scores_a: Mapping[str, float], scores_b: Mapping[str, float]) -> PairedTest:
    """Compare two methods problem by problem (ids present in both); a problem is won where A scored higher."""
    shared = sorted(set(scores_a) & set(scores_b))
    if not shared:
        return PairedTest(n=0, difference=0.0, wins=0, losses=0, p=1.0)
    diffs = [float(scores_a[i]) - float(scores_b[i]) for i in shared]
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return PairedTest(n=len(shared), difference=sum(diffs) / len(shared), wins=wins, losses=losses,
                      p=sign_test_p(wins, losses), difference_ci=mean_interval(diffs))


def pooled(rows: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float]) -> tuple[float, int]:
    """(n-weighted mean of ``value(row)``, n) over one method's rows of the run's benchmarks."""
    n = sum(int(r.get("n", 1)) for r in rows)
    return sum(value(r) * int(r.get("n", 1)) for r in rows) / max(n, 1), n


def pooled_accuracy(rows: Sequence[Mapping[str, Any]]) -> tuple[float, int]:
    """(n-weighted accuracy, n) of one method's rows over the run's benchmarks."""
    return pooled(rows, lambda r: float(r["accuracy"]))


def pooled_cost(rows: Sequence[Mapping[str, Any]]) -> float:
    """n-weighted whole cost per example (``total_cost``) of one method's rows."""
    return pooled(rows, total_cost)[0]


def dominating_baseline(
    candidate: Sequence[Mapping[str, Any]], baselines: Mapping[str, Sequence[Mapping[str, Any]]],
) -> tuple[str, float, float] | None:
    """The cheapest baseline that is cheaper than the candidate (its own call counted) and at least as accurate as
    far as the run can tell: the candidate's 95% lower bound does not clear the baseline's accuracy. Returns
    (name, accuracy, cost per example), or None when no baseline dominates."""
    accuracy, n = pooled_accuracy(candidate)
    lower = wilson_interval(accuracy * n, n)[0]
    cost = pooled_cost(candidate)
    dominating = []
    for name, rows in baselines.items():
        their_accuracy, _ = pooled_accuracy(rows)
        their_cost = pooled_cost(rows)
        if their_cost < cost and lower <= their_accuracy:
            dominating.append((their_cost, name, their_accuracy))
    if not dominating:
        return None
    their_cost, name, their_accuracy = min(dominating)
    return name, their_accuracy, their_cost


def per_problem(records: Sequence[Mapping[str, Any]], field: str) -> dict[str, float]:
    """``field`` of each problem's record (by id), where the record has it."""
    return {str(r["id"]): float(r[field]) for r in records if r.get(field) is not None}


def trained_versus_sft(
    traces: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]], trained: str, sft: str,
) -> dict[str, PairedTest]:
    """The trained orchestrator against the SFT-only one on the same held-out problems, all benchmarks together:
    ``accuracy`` on the greedy specs' scores and, where measured, ``sampled_reward`` on the mean reward of the
    policy's own samples. ``traces`` maps (benchmark, method) to that cell's records."""
    tests: dict[str, PairedTest] = {}
    for field, key in (("score", "accuracy"), ("sampled_reward", "sampled_reward")):
        a: dict[str, float] = {}
        b: dict[str, float] = {}
        for (benchmark, method), records in traces.items():
            target = a if method == trained else b if method == sft else None
            if target is not None:
                target.update({f"{benchmark}/{i}": v for i, v in per_problem(records, field).items()})
        if set(a) & set(b):
            tests[key] = paired_test(a, b)
    return tests
