"""What the orchestrator chose, from its ``traces.jsonl``: the capacity levels, agent counts and topologies of
its valid specs, and how often its spec was a baseline's team (the report's "What the orchestrator chose"
table; ``bench/learning.py`` prints the same figures). Kept apart from ``lemon_core.report`` because it reads
traces, not summaries, and compares specs, not scores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from lemon_core.baselines import ORCHESTRATOR, team_structure

Traces = Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]  # (benchmark, method) -> traces.jsonl records


def is_orchestrator(method: str) -> bool:
    """The trained orchestrator ('lemon') and its variants ('lemon-sft', ...) write their own specs."""
    return method == ORCHESTRATOR or method.startswith(ORCHESTRATOR + "-")


def choice_stats(records: Sequence[Mapping[str, Any]], levels: Sequence[str] | None = None) -> dict[str, Any]:
    """Over the valid specs of one (benchmark, method): the share of agents at each capacity level, the
    distribution of agent counts and of topologies, and how many outputs were invalid (no spec)."""
    from lemon_core.spec_picture import topology

    specs = [r["spec"] for r in records if r.get("spec")]
    agents = [a for s in specs for a in s["agents"]]
    capacity = Counter(a["capacity"] for a in agents)
    order = list(levels or []) + sorted(c for c in capacity if c not in (levels or []))
    return {
        "examples": len(records),
        "invalid": len(records) - len(specs),
        "capacity_share": {lv: capacity[lv] / len(agents) for lv in order if agents},
        "agent_counts": dict(sorted(Counter(len(s["agents"]) for s in specs).items())),
        "mean_agents": sum(len(s["agents"]) for s in specs) / len(specs) if specs else None,
        "topologies": dict(Counter(topology(s) for s in specs).most_common()),
    }


def _shares(counts: Mapping[Any, float], total: float | None = None) -> str:
    total = total if total is not None else sum(counts.values())
    if not total:
        return "-"
    return " \u00b7 ".join(f"{k}: {100 * v / total:.0f}%" for k, v in counts.items())


def choice_rows(traces: Traces, levels: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The 'what the orchestrator chose' table: one row per (benchmark, orchestrator method)."""
    out = []
    for (bench, method), records in sorted(traces.items()):
        if not is_orchestrator(method):
            continue
        st = choice_stats(records, levels)
        out.append({
            "benchmark": bench,
            "method": method,
            "valid specs": f"{st['examples'] - st['invalid']}/{st['examples']}",
            "same spec as a baseline": same_spec_as_baseline(records, traces, bench),
            "capacity levels (share of agents)": _shares(st["capacity_share"], 1.0),
            "agents per spec": _shares(st["agent_counts"]),
            "mean agents": st["mean_agents"],
            "topologies": _shares(st["topologies"]),
        })
    return out


def same_spec_as_baseline(records: Sequence[Mapping[str, Any]], traces: Traces, bench: str) -> str:
    """On how many examples the orchestrator executed a baseline's team (the baseline with the most): an
    orchestrator that scores what a baseline scores has often just learned to write that baseline, and the
    report should say so rather than let the tie read as a team that happens to match it. Teams are compared
    by structure (``baselines.team_structure``): a spec that is CoT's with the solver given another role name
    or id is CoT's."""
    from lemon_core.spec import OrchestrationSpec

    def structure(spec: Mapping[str, Any] | None) -> Hashable | None:
        return team_structure(OrchestrationSpec.model_validate(dict(spec))) if spec else None

    own = [(r["id"], structure(r.get("spec"))) for r in records]
    best, most = "", 0
    for (other_bench, method), base in sorted(traces.items()):
        if other_bench != bench or is_orchestrator(method):
            continue
        theirs = {r["id"]: structure(r.get("spec")) for r in base}
        same = sum(1 for i, team in own if team is not None and theirs.get(i) == team)
        if same > most:
            best, most = method, same
    return f"{best} {most}/{len(records)}" if most else "none"
