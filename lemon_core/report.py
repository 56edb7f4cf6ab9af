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
sandboxed ``srcdoc`` iframe) and what survives being mailed around. This module computes what the page
says and puts it together; ``lemon_core.report_html`` renders the pieces (the style, tables that fit the
page width, the gallery cards). The Markdown is the short version for the UI's Markdown viewer, a CI log
or an issue comment.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from lemon_core.baselines import ORCHESTRATOR
from lemon_core.baselines import SFT_ORCHESTRATOR as SFT_ONLY
from lemon_core.comparison import paired_test, per_problem, total_cost
from lemon_core.report_choices import Traces, choice_rows, choice_stats, is_orchestrator
from lemon_core.report_html import STYLE, example_html, fmt, table_html, table_section
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
                f"{bench}: {row['method']} accuracy {fmt(float(row['accuracy']))} "
                f"{fmt(row['accuracy 95% CI'])} (n={row.get('n', '?')}), valid specs "
                f"{fmt(float(row['valid_rate']))} {fmt((row['valid_ci_low'], row['valid_ci_high']))}, "
                f"cost ${fmt(total_cost(row))}/example"
            )
            if row.get("orchestrator_cost_usd") is not None:
                text += f" (its own call ${fmt(float(row['orchestrator_cost_usd']))} of it)"
            if best is not None:
                text += (
                    f"; best baseline {best['method']} {fmt(float(best['accuracy']))} "
                    f"{fmt(best['accuracy 95% CI'])} at ${fmt(float(best['mean_cost_usd']))}/example"
                )
            lines.append(text)
    return lines


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
             {"what": "loss first \u2192 last", "value": f"{fmt(sft.get('loss_first'))} \u2192 "
                                                          f"{fmt(sft.get('loss_last'))}"}]
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
            ("mean reward (own call counted)", sft.get("mean_reward"), trained.get("mean_reward"), True),
            (f"sampled specs' mean reward (k={trained.get('sampled_k')})", sft.get("sampled_reward"),
             trained.get("sampled_reward"), True),
        ]
        if traces and (bench, SFT_ONLY) in traces and (bench, ORCHESTRATOR) in traces:
            for field, label in (("score", "problems won / lost, sign test"),
                                 ("sampled_reward", "sampled reward won / lost, sign test")):
                test = paired_test(per_problem(traces[bench, ORCHESTRATOR], field),
                                   per_problem(traces[bench, SFT_ONLY], field))
                if test.n:
                    metrics.append((label, "", f"{test.wins} / {test.losses}, p={test.p:.3g}", False))
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
        lines.append("| " + " | ".join(fmt(row.get(c, "")) for c in COLUMNS) + f" | {on_front} |")
    return "\n".join(lines) + "\n"


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
    ordered = _sorted(rows)
    results = table_html(
        (*COLUMNS, "pareto"),
        [{**row, "pareto": "\u2605" if (row["benchmark"], str(row["method"])) in front else ""} for row in ordered],
        headers=HEADERS, row_classes=["orch" if is_orchestrator(str(r["method"])) else "" for r in ordered],
        table_id="table-results")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        *(f"<p>{esc(n)}</p>" for n in notes),
        *(f"<p class='headline'>{esc(h)}</p>" for h in headlines(rows)),
        f"<h2>Results</h2>{results}",
        "<p>accuracy 95% CI: Wilson interval over the n examples; valid_rate: share of examples whose "
        "orchestrator output parsed and validated (an invalid one scores 0); &#9733;: on the "
        "accuracy-vs-cost Pareto front of its benchmark.</p>",
    ]
    for name, png in images.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{esc(name)}</h2><img alt='{esc(name)}' src='data:image/png;base64,{data}'>")
    side_by_side = sft_vs_trained(rows, traces, levels)
    if side_by_side:
        parts += table_section("SFT-only vs trained orchestrator", side_by_side)
    chosen = choice_rows(traces or {}, levels)
    if chosen:
        parts += table_section("What the orchestrator chose", chosen)
    for name, extra in (tables or {}).items():
        parts += table_section(name, extra)
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
