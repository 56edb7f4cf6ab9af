"""Evaluation report: does the trained orchestrator beat the baselines, at what cost, and what did it choose?

``write_report`` writes three files: ``pareto.png`` (accuracy vs cost per benchmark, 95% intervals as
error bars), ``report.html`` and ``report.md``. The HTML answers the question in order:

1. one line per (benchmark, orchestrator): accuracy and valid-spec rate with 95% intervals, next to the
   best baseline of the same run;
2. the results table (every method, with intervals), the Pareto plot and any extra plots (reward curve);
3. SFT-only vs trained side by side, when both were evaluated;
4. what the orchestrator chose per benchmark: capacity levels, agent counts, topologies;
5. a gallery of example tasks: the spec picture, the score, each agent's output (collapsible).

The page is one self-contained file: plots are base64 PNGs, spec pictures base64 SVGs, styles inline,
no script and no network. That is what the Kubeflow UI's HTML viewer needs (it shows the file in a
sandboxed ``srcdoc`` iframe) and what survives being mailed around. The Markdown is the short version
for the UI's Markdown viewer, a CI log or an issue comment.

Rows are evaluation summaries (``lemon_core.evaluate.EvalSummary`` or ``summary.json`` contents).
Fields added later (``valid_rate``, ``invalid``, ``accuracy_ci_low/high``, ``truncated_answers``,
``looped_answers``, ``sandbox_mode``) are read with defaults, so old summaries still render. Traces are ``traces.jsonl``
records (``lemon_core.evaluate``): per example ``spec`` (null when the orchestrator's output was
invalid), ``score``, ``error`` and per-agent outputs. A method is on the Pareto front of a benchmark
when no other method is at least as accurate *and* at most as costly with one of the two strictly better.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from lemon_core.baselines import ORCHESTRATOR, team_structure
from lemon_core.baselines import SFT_ORCHESTRATOR as SFT_ONLY
from lemon_core.evaluate import total_cost
from lemon_core.stats import wilson_interval
from lemon_core.teachers import sweep_candidates_text

COLUMNS = (
    "benchmark",
    "method",
    "n",
    "accuracy",
    "accuracy 95% CI",
    "valid_rate",
    "invalid",
    "mean_cost_usd",
    "orchestrator_cost_usd",
    "mean_tokens",
    "mean_latency_s",
    "cached_calls",
    "failures",
    "truncated_answers",
    "looped_answers",
)
HEADERS = {  # short column titles, so the table fits a Kubeflow UI panel
    "accuracy 95% CI": "95% CI",
    "valid_rate": "valid rate",
    "mean_cost_usd": "agents $/example",
    "orchestrator_cost_usd": "orchestrator $/example",  # writing the spec: its prompt and spec tokens
    "mean_tokens": "tokens/example",
    "mean_latency_s": "latency s",
    "cached_calls": "cached calls",  # answered from the run's node cache: latency 0, price still charged
    "truncated_answers": "truncated",
    "looped_answers": "looped",  # stopped in a repetition loop (greedy): stuck, not cut off by the cap
}
Traces = Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]


def is_orchestrator(method: str) -> bool:
    """The trained orchestrator ('lemon') and its variants ('lemon-sft', ...) write their own specs."""
    return method == ORCHESTRATOR or method.startswith(ORCHESTRATOR + "-")


def as_rows(summaries: Sequence[BaseModel | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Summaries as dicts, checked for the fields the report reads, with later fields defaulted."""
    rows = [s.model_dump() if isinstance(s, BaseModel) else dict(s) for s in summaries]
    for i, row in enumerate(rows):
        missing = [c for c in ("benchmark", "method", "accuracy", "mean_cost_usd") if c not in row]
        if missing:
            raise ValueError(
                f"summary {i} lacks {missing}; pass EvalSummary objects or summary.json contents"
            )
    return [_with_defaults(row) for row in rows]


def _with_defaults(row: dict[str, Any]) -> dict[str, Any]:
    """Fill the interval and valid-rate fields old summaries lack (baselines are always valid;
    old orchestrator summaries counted invalid outputs in ``invalid_specs``)."""
    n = int(row.get("n") or 0)
    acc = float(row["accuracy"])
    if row.get("accuracy_ci_low") is None or row.get("accuracy_ci_high") is None:
        row["accuracy_ci_low"], row["accuracy_ci_high"] = wilson_interval(acc * n, n)
    if row.get("valid_rate") is None:
        invalid = row.get("invalid", row.get("invalid_specs", 0)) or 0
        row["valid_rate"] = 1.0 - invalid / n if n else 1.0
    row.setdefault("cached_calls", 0)
    row.setdefault("orchestrator_cost_usd", None)
    if row.get("invalid") is None:
        row["invalid"] = round((1.0 - float(row["valid_rate"])) * n)
    row["valid_ci_low"], row["valid_ci_high"] = wilson_interval(float(row["valid_rate"]) * n, n)
    row["accuracy 95% CI"] = (row["accuracy_ci_low"], row["accuracy_ci_high"])
    return row


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, accuracy) points no other point dominates (cheaper-or-equal and
    at-least-as-accurate, one strictly), sorted by cost."""
    front = []
    for i, (cost_i, acc_i) in enumerate(points):
        dominated = any(
            cost_j <= cost_i and acc_j >= acc_i and (cost_j < cost_i or acc_j > acc_i)
            for j, (cost_j, acc_j) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def _by_benchmark(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["benchmark"], []).append(row)
    return groups


def pareto_figure(summaries: Sequence[BaseModel | Mapping[str, Any]]) -> Any:
    """The Pareto plot as a matplotlib figure: one panel per benchmark, accuracy (with its 95% interval as an
    error bar) vs mean cost per example (``total_cost``: an orchestrator pays its own call too), the front
    drawn as a dashed line; orchestrators are stars, baselines dots. Costs are ticked as plain numbers in
    the unit the axis label names (``plots.cost_axis``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lemon_core.plots import cost_axis

    groups = _by_benchmark(as_rows(summaries))
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(4.2 * max(len(groups), 1), 3.8), squeeze=False)
    for ax, (bench, rows) in zip(axes[0], sorted(groups.items()), strict=False):
        points = [(total_cost(r), float(r["accuracy"])) for r in rows]
        for (cost, acc), row in zip(points, rows, strict=True):
            orch = is_orchestrator(str(row["method"]))
            yerr = [[acc - row["accuracy_ci_low"]], [row["accuracy_ci_high"] - acc]]
            ax.errorbar(cost, acc, yerr=yerr, fmt="*" if orch else "o", ms=11 if orch else 6, capsize=3,
                        color="#c0392b" if orch else None, lw=1)
            ax.annotate(
                str(row["method"]), (cost, acc), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
        front = pareto_front(points)
        ax.plot(
            [points[i][0] for i in front], [points[i][1] for i in front], "k--", lw=1, label="Pareto front"
        )
        ax.set_title(bench)
        cost_axis(ax.xaxis, [c for c, _ in points], "mean cost\n(orchestrator's own call included)")
        ax.set_ylabel("accuracy (bars: 95% interval)")
        ax.set_ylim(-0.05, 1.05)
        ax.margins(x=0.2)  # room for the method labels written to the right of each point
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_pareto(summaries: Sequence[BaseModel | Mapping[str, Any]]) -> bytes:
    """PNG bytes of ``pareto_figure``."""
    import matplotlib.pyplot as plt

    fig = pareto_figure(summaries)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _fmt(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2:
        return f"[{_fmt(float(value[0]))}, {_fmt(float(value[1]))}]"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value else f"{value:.3f}"
    return "" if value is None else str(value)


def _front_labels(rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
    labels = set()
    for bench, group in _by_benchmark(rows).items():
        points = [(total_cost(r), float(r["accuracy"])) for r in group]
        labels |= {(bench, str(group[i]["method"])) for i in pareto_front(points)}
    return labels


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["benchmark"], -float(r["accuracy"])))


# --- the headline: each orchestrator against the best baseline -----------------------------------------
def headlines(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per (benchmark, orchestrator): its accuracy and valid rate with intervals, and the
    most accurate baseline of the same run with its interval and cost."""
    lines = []
    for bench, group in sorted(_by_benchmark(rows).items()):
        baselines = [r for r in group if not is_orchestrator(str(r["method"]))]
        best = max(baselines, key=lambda r: (float(r["accuracy"]), -total_cost(r)), default=None)
        for row in sorted((r for r in group if is_orchestrator(str(r["method"]))), key=lambda r: str(r["method"])):
            text = (
                f"{bench}: {row['method']} accuracy {_fmt(float(row['accuracy']))} "
                f"{_fmt(row['accuracy 95% CI'])} (n={row.get('n', '?')}), valid specs "
                f"{_fmt(float(row['valid_rate']))} {_fmt((row['valid_ci_low'], row['valid_ci_high']))}, "
                f"cost ${_fmt(total_cost(row))}/example"
            )
            if row.get("orchestrator_cost_usd") is not None:
                text += f" (its own call ${_fmt(float(row['orchestrator_cost_usd']))} of it)"
            if best is not None:
                text += (
                    f"; best baseline {best['method']} {_fmt(float(best['accuracy']))} "
                    f"{_fmt(best['accuracy 95% CI'])} at ${_fmt(float(best['mean_cost_usd']))}/example"
                )
            lines.append(text)
    return lines


# --- what the orchestrator chose ------------------------------------------------------------------------
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


def sft_rows(sft: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The SFT warm-up as (what, value) rows, from its ``sft.json``: what the teacher sweep taught and how
    valid the unconstrained orchestrator was after it - the first thing to read when the trained
    orchestrator scores exactly what one baseline scores (it learned to write that baseline)."""
    def rate(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}"

    rows = [{"what": "teacher", "value": sft.get("teacher", "?")}]
    sweep = sft.get("sweep") or {}
    if sweep:
        taught = ", ".join(f"{name} \u00d7{n}" for name, n in sweep.get("taught", {}).items())
        rows += [{"what": "taught (candidate \u00d7 SFT targets)", "value": taught},
                 {"what": "sweep tasks / no candidate solved", "value": f"{sweep.get('tasks')} / "
                                                                       f"{sweep.get('fallback_tasks')}"},
                 {"what": "teachers' mean score", "value": rate(sweep.get("teacher_score"))}]
        if sweep.get("candidates"):
            rows.append({"what": "sweep: solved / tasks [95% CI], mean reward ± s.e., cost (best first)",
                         "value": sweep_candidates_text(sweep)})
    ci = sft.get("valid_rate_after_ci")
    after = rate(sft.get("valid_rate_after")) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
    rows += [{"what": "valid-spec rate before \u2192 after (unconstrained)",
              "value": f"{rate(sft.get('valid_rate_before'))} \u2192 {after} (n={sft.get('valid_samples', 0)})"},
             {"what": "pairs / steps / rounds", "value": f"{sft.get('pairs')} / {sft.get('steps')} / "
                                                         f"{sft.get('rounds', 1)}"},
             {"what": "loss first \u2192 last", "value": f"{_fmt(sft.get('loss_first'))} \u2192 "
                                                          f"{_fmt(sft.get('loss_last'))}"}]
    return rows


def sft_vs_trained(rows: list[dict[str, Any]], traces: Traces | None = None,
                   levels: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per benchmark where both were evaluated: SFT-only and trained orchestrator side by side."""
    out: list[dict[str, Any]] = []
    for bench, group in sorted(_by_benchmark(rows).items()):
        by_method = {r["method"]: r for r in group}
        if SFT_ONLY not in by_method or ORCHESTRATOR not in by_method:
            continue
        sft, trained = by_method[SFT_ONLY], by_method[ORCHESTRATOR]
        metrics: list[tuple[str, Any, Any, bool]] = [
            ("accuracy", sft["accuracy"], trained["accuracy"], True),
            ("accuracy 95% CI", sft["accuracy 95% CI"], trained["accuracy 95% CI"], False),
            ("valid_rate", sft["valid_rate"], trained["valid_rate"], True),
            ("mean_cost_usd", sft["mean_cost_usd"], trained["mean_cost_usd"], True),
            ("mean_tokens", sft.get("mean_tokens"), trained.get("mean_tokens"), True),
        ]
        if traces and (bench, SFT_ONLY) in traces and (bench, ORCHESTRATOR) in traces:
            a, b = choice_stats(traces[bench, SFT_ONLY], levels), choice_stats(traces[bench, ORCHESTRATOR], levels)
            metrics.append(("mean agents", a["mean_agents"], b["mean_agents"], True))
            for lv in dict.fromkeys([*a["capacity_share"], *b["capacity_share"]]):
                metrics.append((f"share of {lv} agents", a["capacity_share"].get(lv, 0.0),
                                b["capacity_share"].get(lv, 0.0), True))
        for name, before, after, numeric in metrics:
            change = float(after) - float(before) if numeric and before is not None and after is not None else None
            out.append({"benchmark": bench, "metric": name, SFT_ONLY: before, ORCHESTRATOR: after,
                        "change": None if change is None else f"{change:+.3g}"})
    return out


# --- the gallery ----------------------------------------------------------------------------------------
def pick_examples(records: Sequence[Mapping[str, Any]], k: int = 3) -> list[Mapping[str, Any]]:
    """Up to ``k`` examples worth looking at: the first correct one, the first wrong one, the first
    invalid one (no spec), then the next ones in file order."""
    kinds = (
        lambda r: r.get("spec") and float(r.get("score") or 0) >= 1.0,
        lambda r: r.get("spec") and float(r.get("score") or 0) < 1.0,
        lambda r: not r.get("spec"),
    )
    chosen: list[int] = []
    for kind in kinds:
        first = next((i for i, r in enumerate(records) if kind(r) and i not in chosen), None)
        if first is not None:
            chosen.append(first)
    chosen += [i for i in range(len(records)) if i not in chosen]
    return [records[i] for i in sorted(chosen[:k])]


def _spec_picture_html(spec: Mapping[str, Any], levels: Sequence[str] | None, label: str) -> str:
    """The spec as an inline base64 SVG image."""
    from lemon_core.spec_picture import spec_svg

    data = base64.b64encode(spec_svg(spec, levels).encode()).decode("ascii")
    return f"<img class='spec' alt='{html.escape(label)}' src='data:image/svg+xml;base64,{data}'>"


def _agent_html(agent: Mapping[str, Any], spec_agent: Mapping[str, Any] | None) -> str:
    esc = html.escape
    role = spec_agent["role"] if spec_agent else ""
    tokens = int(agent.get("prompt_tokens") or 0) + int(agent.get("completion_tokens") or 0)
    flags = "".join(f" \u00b7 {f}" for f, on in (("cached", agent.get("cached")), ("error", agent.get("error"))) if on)
    summary = (f"{esc(str(agent.get('agent_id', '?')))} \u00b7 {esc(role)} ({esc(str(agent.get('capacity', '')))})"
               f" \u2014 {tokens} tokens, ${_fmt(float(agent.get('cost') or 0.0))}{flags}")
    body = f"<p class='duty'>duty: {esc(spec_agent['duty'])}</p>" if spec_agent else ""
    if agent.get("error"):
        body += f"<p class='err'>{esc(str(agent['error']))}</p>"
    body += f"<pre>{esc(str(agent.get('output') or ''))}</pre>"
    return f"<details class='agent'><summary>{summary}</summary>{body}</details>"


def example_html(record: Mapping[str, Any], bench: str, method: str, levels: Sequence[str] | None) -> str:
    """One gallery card: the task, the score, prediction vs gold, the spec picture, each agent's output."""
    esc = html.escape
    score = float(record.get("score") or 0.0)
    if not record.get("spec"):
        verdict = "invalid spec"
    elif record.get("error"):
        verdict = "failed run"  # the spec was valid but an agent call failed (see the error below)
    else:
        verdict = "correct" if score >= 1.0 else "wrong"
    parts = [
        "<div class='example'>",
        f"<h3>{esc(bench)} / {esc(method)} \u00b7 example {esc(str(record.get('id', '?')))} \u00b7 "
        f"<span class='{verdict.split()[0]}'>score {_fmt(score)} ({verdict})</span></h3>",
        f"<details><summary>task: {esc(_clip(str(record.get('task', '')), 160))}</summary>"
        f"<pre>{esc(str(record.get('task', '')))}</pre></details>",
        f"<p>prediction <code>{esc(str(record.get('prediction')))}</code> \u00b7 gold "
        f"<code>{esc(str(record.get('gold')))}</code> \u00b7 cost ${_fmt(float(record.get('cost') or 0.0))}"
        f" \u00b7 {int(record.get('tokens') or 0)} tokens</p>",
    ]
    if record.get("error"):
        parts.append(f"<p class='err'>error: {esc(str(record['error']))}</p>")
    spec = record.get("spec")
    if spec:
        parts.append(_spec_picture_html(spec, levels, f"spec of {bench} example {record.get('id', '?')}"))
        by_id = {a["id"]: a for a in spec["agents"]}
        parts += [_agent_html(a, by_id.get(a.get("agent_id"))) for a in record.get("agents") or []]
    parts.append("</div>")
    return "\n".join(parts)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# --- rendering ------------------------------------------------------------------------------------------
def render_markdown(
    summaries: Sequence[BaseModel | Mapping[str, Any]],
    *,
    title: str = "lemon evaluation",
    notes: Sequence[str] = (),
) -> str:
    """The headline sentences and a Markdown table of every (benchmark, method) row; Pareto-optimal
    rows are marked with *."""
    rows = as_rows(summaries)
    front = _front_labels(rows)
    heads = headlines(rows)
    lines = [
        f"# {title}",
        "",
        *[f"- {n}" for n in notes],
        *([""] if notes else []),
        *[f"**{h}**" for h in heads],
        *([""] if heads else []),
        "| " + " | ".join(HEADERS.get(c, c) for c in COLUMNS) + " | pareto |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row in _sorted(rows):
        on_front = "*" if (row["benchmark"], str(row["method"])) in front else ""
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in COLUMNS) + f" | {on_front} |")
    return "\n".join(lines) + "\n"


STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
    "th{background:#f4f4f4}td{white-space:nowrap}tr.orch td{background:#fff4e5;font-weight:bold}img{max-width:100%}"
    "p.headline{font-size:1.1em;font-weight:bold}.note{color:#8a5a00}"
    ".example{border:1px solid #ddd;border-radius:6px;padding:0.5em 1em;margin:1em 0}"
    ".example img.spec{display:block;max-height:480px;margin:0.5em 0}"
    "span.correct{color:#1e7b34}span.wrong,span.failed{color:#b03a2e}span.invalid{color:#8a5a00}"
    "details{margin:0.3em 0}summary{cursor:pointer}pre{white-space:pre-wrap;background:#f8f8f8;padding:0.5em}"
    ".err{color:#b03a2e}.duty{font-style:italic;color:#555}"
)


def _table(name: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    esc = html.escape
    cols = list(dict.fromkeys(k for r in rows for k in r))
    parts = [f"<h2>{esc(name)}</h2><table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{esc(_fmt(r.get(c, '')))}</td>" for c in cols) + "</tr>" for r in rows]
    parts.append("</table>")
    return parts


def render_html(
    summaries: Sequence[BaseModel | Mapping[str, Any]],
    *,
    images: Mapping[str, bytes],
    title: str = "lemon evaluation",
    notes: Sequence[str] = (),
    tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    traces: Traces | None = None,
    levels: Sequence[str] | None = None,
    gallery_size: int = 3,
) -> str:
    """One self-contained HTML page (see the module doc for its sections); ``images`` are PNGs."""
    rows = as_rows(summaries)
    front = _front_labels(rows)
    esc = html.escape
    head = "".join(f"<th>{esc(HEADERS.get(c, c))}</th>" for c in (*COLUMNS, "pareto"))
    body = "".join(
        ("<tr class='orch'>" if is_orchestrator(str(row["method"])) else "<tr>")
        + "".join(f"<td>{esc(_fmt(row.get(c, '')))}</td>" for c in COLUMNS)
        + f"<td>{'&#9733;' if (row['benchmark'], str(row['method'])) in front else ''}</td></tr>"
        for row in _sorted(rows)
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        *(f"<p>{esc(n)}</p>" for n in notes),
        *(f"<p class='headline'>{esc(h)}</p>" for h in headlines(rows)),
        f"<h2>Results</h2><table><tr>{head}</tr>{body}</table>",
        "<p>accuracy 95% CI: Wilson interval over the n examples; valid_rate: share of examples whose "
        "orchestrator output parsed and validated (an invalid one scores 0); &#9733;: on the "
        "accuracy-vs-cost Pareto front of its benchmark.</p>",
    ]
    for name, png in images.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{esc(name)}</h2><img alt='{esc(name)}' src='data:image/png;base64,{data}'>")
    side_by_side = sft_vs_trained(rows, traces, levels)
    if side_by_side:
        parts += _table("SFT-only vs trained orchestrator", side_by_side)
    chosen = choice_rows(traces or {}, levels)
    if chosen:
        parts += _table("What the orchestrator chose", chosen)
    for name, extra in (tables or {}).items():
        parts += _table(name, extra)
    gallery = [
        example_html(record, bench, method, levels)
        for (bench, method), records in sorted((traces or {}).items())
        if is_orchestrator(method)
        for record in pick_examples(records, gallery_size)
    ]
    if gallery:
        parts += ["<h2>Example tasks</h2>", *gallery]
    parts.append("</body></html>")
    return "\n".join(parts)


def read_traces(path: Path) -> list[dict[str, Any]]:
    """Records of a ``traces.jsonl`` (one JSON object a line; blank lines skipped)."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} line {i} is not JSON ({exc.msg}); rewrite or drop that line") from None
    return rows


def write_report(
    summaries: Sequence[BaseModel | Mapping[str, Any]],
    out_dir: Path,
    *,
    title: str = "lemon evaluation",
    notes: Sequence[str] = (),
    extra_images: Mapping[str, Path | bytes] | None = None,
    tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    traces: Traces | None = None,
    levels: Sequence[str] | None = None,
    gallery_size: int = 3,
) -> dict[str, Path]:
    """Write pareto.png, report.html and report.md under ``out_dir``; returns their paths.

    ``extra_images`` (title -> PNG path or bytes; e.g. the reward curve) are embedded after the Pareto plot.
    ``traces`` ((benchmark, method) -> traces.jsonl records) feed the orchestrator's choices and the
    gallery; ``levels`` (the pool's level names, cheapest first) order capacity tables and colours.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    pareto = plot_pareto(summaries)
    images: dict[str, bytes] = {"Accuracy vs cost (Pareto)": pareto}
    for name, img in (extra_images or {}).items():
        images[name] = img if isinstance(img, bytes) else Path(img).read_bytes()
    paths = {
        "pareto": out_dir / "pareto.png",
        "html": out_dir / "report.html",
        "markdown": out_dir / "report.md",
    }
    page = render_html(summaries, images=images, title=title, notes=notes, tables=tables, traces=traces,
                       levels=levels, gallery_size=gallery_size)
    _atomic_write(paths["pareto"], pareto)
    _atomic_write(paths["html"], page.encode())
    _atomic_write(paths["markdown"], render_markdown(summaries, title=title, notes=notes).encode())
    return paths


def _atomic_write(path: Path, data: bytes) -> None:
    from lemon_core.storage import write_atomic

    write_atomic(path, data)
