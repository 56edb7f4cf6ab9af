"""Evaluation report: Pareto front, PNG, self-contained HTML, Markdown."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import pytest

from lemon_core.baselines import chain, cot
from lemon_core.executor import AgentTrace, Trace
from lemon_core.plots import curve_series, plot_reward_curve
from lemon_core.report import (
    as_rows,
    choice_stats,
    pareto_front,
    pick_examples,
    plot_pareto,
    read_traces,
    render_html,
    render_markdown,
    sft_vs_trained,
    wilson_interval,
    write_report,
)
from lemon_core.spec import AgentSpec, OrchestrationSpec

ROWS = [
    {
        "benchmark": "gsm8k",
        "method": "cot",
        "n": 10,
        "accuracy": 0.5,
        "mean_cost_usd": 1e-5,
        "mean_tokens": 200.0,
        "mean_latency_s": 1.0,
        "failures": 0,
    },
    {
        "benchmark": "gsm8k",
        "method": "sc",
        "n": 10,
        "accuracy": 0.6,
        "mean_cost_usd": 4e-5,
        "mean_tokens": 800.0,
        "mean_latency_s": 2.0,
        "failures": 0,
    },
    {
        "benchmark": "gsm8k",
        "method": "debate",
        "n": 10,
        "accuracy": 0.55,
        "mean_cost_usd": 9e-5,
        "mean_tokens": 1500.0,
        "mean_latency_s": 4.0,
        "failures": 1,
    },
    {
        "benchmark": "multiarith",
        "method": "cot",
        "n": 10,
        "accuracy": 0.9,
        "mean_cost_usd": 1e-5,
        "mean_tokens": 150.0,
        "mean_latency_s": 1.0,
        "failures": 0,
    },
]


def test_pareto_front_by_hand() -> None:
    # (cost, acc): b dominates c (cheaper and better); a and b trade off; d ties a on cost but is worse.
    points = [(1.0, 0.5), (2.0, 0.8), (3.0, 0.7), (1.0, 0.4), (2.0, 0.8)]
    assert pareto_front(points) == [0, 1, 4]
    assert pareto_front([]) == []
    assert pareto_front([(0.0, 0.0)]) == [0]


def test_write_report(tmp_path: Path) -> None:
    curve = b"\x89PNG\r\n\x1a\nfake-curve"
    paths = write_report(
        ROWS,
        tmp_path,
        title="run 7",
        notes=["pool: cpu"],
        extra_images={"Reward curve": curve},
        tables={"Training": [{"iteration": 1, "reward": 0.25}]},
    )
    png = paths["pareto"].read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    page = paths["html"].read_text()
    embedded = [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)]
    assert embedded == [png, curve], "both plots are embedded, in order, byte for byte"
    assert "src='http" not in page and "<link" not in page, "the page is self-contained"
    assert page.count("<tr>") == 1 + len(ROWS) + 2
    assert "run 7" in page and "pool: cpu" in page and "0.250" in page
    md = paths["markdown"].read_text()
    lines = [ln for ln in md.splitlines() if ln.startswith("| gsm8k")]
    assert [ln.split("|")[2].strip() for ln in lines] == ["sc", "debate", "cot"], "sorted by accuracy"
    on_front = {ln.split("|")[2].strip() for ln in lines if ln.rstrip().endswith("* |")}
    assert on_front == {"cot", "sc"}, "debate is dominated by sc (more costly, less accurate)"


def test_bad_rows_name_the_missing_field() -> None:
    with pytest.raises(ValueError, match="mean_cost_usd"):
        render_markdown([{"benchmark": "x", "method": "y", "accuracy": 1.0}])


# --- the full report: intervals, the orchestrator's choices, SFT vs trained, the gallery ----------------
FOUR_AGENTS = OrchestrationSpec(
    agents=[
        AgentSpec(id="plan", role="Arithmetic planner", base_role="planner", duty="Number the steps.",
                  capacity="small"),
        AgentSpec(id="solve_a", role="Careful calculator", base_role="solver", duty="Do the steps.",
                  capacity="medium", depends_on=["plan"]),
        AgentSpec(id="solve_b", role="Backwards solver", base_role="solver", duty="Solve from the question.",
                  capacity="small", depends_on=["plan"]),
        AgentSpec(id="check", role="Answer checker", base_role="verifier", duty="Check both; state the number.",
                  capacity="large", depends_on=["solve_a", "solve_b"]),
    ],
    output="check",
)
LEVELS = ["small", "medium", "large"]


def trace_record(i: int, spec: OrchestrationSpec | None, score: float, output: str = "42") -> dict:
    """A traces.jsonl record as lemon_core.evaluate writes it (Trace.to_dict plus the scoring fields)."""
    task = f"Question {i}: Sam has 40 apples and buys 2 more. How many apples now?"
    if spec is None:
        return {"id": f"q{i}", "gold": "42", "prediction": None, "score": 0.0, "agent_calls": 0, "tokens": 0,
                "task": task, "spec": None, "answer": "", "error": "spec invalid: field 'output': unknown agent",
                "prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0, "latency_s": 0.0, "agents": []}
    trace = Trace(spec=spec, task=task, answer=output)
    for a in spec.agents:
        trace.agents.append(AgentTrace(a.id, a.capacity, "system", "prompt", output=f"{a.id} says {output}",
                                       prompt_tokens=30, completion_tokens=10, cost=1e-6, latency_s=0.1))
    return {"id": f"q{i}", "gold": "42", "prediction": output, "score": score, "agent_calls": len(spec.agents),
            "tokens": trace.tokens, **trace.to_dict()}


def demo_run() -> tuple[list[dict], dict[tuple[str, str], list[dict]]]:
    """Summaries and traces of a small run: trained and SFT-only orchestrators next to cot and sc."""
    trained = [trace_record(0, FOUR_AGENTS, 1.0), trace_record(1, cot("small"), 0.0, output="41"),
               trace_record(2, None, 0.0), trace_record(3, FOUR_AGENTS, 1.0, output="<script>alert(1)</script>")]
    sft = [trace_record(0, cot("large"), 1.0), trace_record(1, None, 0.0), trace_record(2, None, 0.0),
           trace_record(3, chain("medium"), 0.0)]
    rows = [
        {**ROWS[0], "n": 4, "accuracy": 0.5},
        {**ROWS[1], "n": 4, "accuracy": 0.5},
        {"benchmark": "gsm8k", "method": "lemon", "n": 4, "accuracy": 0.5, "mean_cost_usd": 3e-6,
         "mean_tokens": 120.0, "mean_latency_s": 0.3, "failures": 1, "valid_rate": 0.75, "invalid": 1,
         "accuracy_ci_low": 0.15, "accuracy_ci_high": 0.85, "truncated_answers": 0, "sandbox_mode": None},
        {"benchmark": "gsm8k", "method": "lemon-sft", "n": 4, "accuracy": 0.25, "mean_cost_usd": 1e-6,
         "mean_tokens": 60.0, "mean_latency_s": 0.2, "failures": 2, "invalid_specs": 2},
    ]
    return rows, {("gsm8k", "lemon"): trained, ("gsm8k", "lemon-sft"): sft}


def test_wilson_interval_by_hand() -> None:
    # Wilson (1927) with z=1.96: 5/10 -> [0.2366, 0.7634]; 0/10 -> [0, 0.2775]; 10/10 -> [0.7225, 1]
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_old_summaries_get_intervals_and_valid_rates() -> None:
    rows, _ = demo_run()
    cot_row, _, lemon, sft = as_rows(rows)
    assert cot_row["valid_rate"] == 1.0 and cot_row["invalid"] == 0, "a baseline spec is always valid"
    assert (cot_row["accuracy_ci_low"], cot_row["accuracy_ci_high"]) == pytest.approx(wilson_interval(2, 4))
    assert (lemon["accuracy_ci_low"], lemon["accuracy_ci_high"]) == (0.15, 0.85), "given intervals are kept"
    assert sft["valid_rate"] == 0.5 and sft["invalid"] == 2, "old orchestrator rows counted invalid_specs"


def test_choice_stats_count_levels_agents_and_topologies() -> None:
    _, traces = demo_run()
    st = choice_stats(traces["gsm8k", "lemon"], LEVELS)
    # valid specs: FOUR_AGENTS twice (small, medium, small, large) and cot(small): 9 agents
    assert st["examples"] == 4 and st["invalid"] == 1
    assert st["capacity_share"] == pytest.approx({"small": 5 / 9, "medium": 2 / 9, "large": 2 / 9})
    assert st["agent_counts"] == {1: 1, 4: 2}
    assert st["mean_agents"] == pytest.approx(3.0)
    assert st["topologies"] == {"diamond": 2, "single": 1}
    empty = choice_stats([trace_record(0, None, 0.0)])
    assert empty["invalid"] == 1 and empty["mean_agents"] is None and empty["capacity_share"] == {}


def test_the_choice_table_says_how_often_the_orchestrator_wrote_a_baselines_very_spec() -> None:
    """The 2026-12-05 `make run`: lemon 0.667 = CoT 0.667 because all 30 specs were CoT's; the table says so."""
    from lemon_core.report import choice_rows

    _, traces = demo_run()
    traces["gsm8k", "cot"] = [trace_record(i, cot("small"), 0.0) for i in range(4)]
    traces["gsm8k", "chain"] = [trace_record(i, chain("medium"), 0.0) for i in range(4)]
    traces["svamp", "cot"] = [trace_record(i, FOUR_AGENTS, 0.0) for i in range(4)]  # another benchmark: not compared
    rows = {r["method"]: r for r in choice_rows(traces, LEVELS)}
    assert set(rows) == {"lemon", "lemon-sft"}
    assert rows["lemon"]["same spec as a baseline"] == "cot 1/4"  # q1 is cot(small); q0 and q3 are its own teams
    assert rows["lemon-sft"]["same spec as a baseline"] == "chain 1/4"  # q3; its cot(large) on q0 is not cot(small)
    traces["gsm8k", "cot"][1] = trace_record(1, cot("large"), 0.0)
    assert {r["method"]: r for r in choice_rows(traces, LEVELS)}["lemon"]["same spec as a baseline"] == "none"


def test_a_baselines_spec_with_other_role_names_and_ids_is_named_as_that_baseline() -> None:
    """The 2026-12 report said 'same spec as a baseline: none' for CoT@large with the solver called something
    else; free text and id names do not make another team, the structure does."""
    from lemon_core.report import choice_rows

    renamed = OrchestrationSpec(agents=[AgentSpec(id="answer", role="Careful arithmetic solver", base_role="solver",
                                                  duty="Work it out and say the number.", capacity="large")],
                                output="answer")
    traces = {("gsm8k", "lemon"): [trace_record(i, renamed, 1.0) for i in range(3)] + [trace_record(3, None, 0.0)],
              ("gsm8k", "cot"): [trace_record(i, cot("large"), 1.0) for i in range(4)],
              ("gsm8k", "chain"): [trace_record(i, chain("large"), 1.0) for i in range(4)]}
    assert choice_rows(traces, LEVELS)[0]["same spec as a baseline"] == "cot 3/4"
    traces["gsm8k", "cot"] = [trace_record(i, cot("small"), 1.0) for i in range(4)]
    assert choice_rows(traces, LEVELS)[0]["same spec as a baseline"] == "none", "the capacity still counts"


def test_pick_examples_shows_a_correct_a_wrong_and_an_invalid_one() -> None:
    _, traces = demo_run()
    picked = pick_examples(traces["gsm8k", "lemon"], 3)
    assert [r["id"] for r in picked] == ["q0", "q1", "q2"]
    assert [r["id"] for r in pick_examples(traces["gsm8k", "lemon"], 4)] == ["q0", "q1", "q2", "q3"]
    # SFT: q0 correct, q3 wrong (valid spec, score 0), q1 invalid: a correct and a wrong one come first
    assert [r["id"] for r in pick_examples(traces["gsm8k", "lemon-sft"], 2)] == ["q0", "q3"]


def test_sft_vs_trained_side_by_side() -> None:
    rows, traces = demo_run()
    table = {r["metric"]: r for r in sft_vs_trained(as_rows(rows), traces, LEVELS)}
    assert table["accuracy"]["lemon-sft"] == 0.25 and table["accuracy"]["lemon"] == 0.5
    assert table["accuracy"]["change"] == "+0.25"
    assert table["valid_rate"]["change"] == "+0.25"
    assert table["mean agents"]["lemon-sft"] == 2.0 and table["mean agents"]["lemon"] == 3.0
    assert table["share of large agents"]["lemon-sft"] == pytest.approx(0.25)
    assert sft_vs_trained(as_rows(rows[:3])) == [], "nothing to compare without both orchestrators"


def test_pareto_plot_draws_the_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    drawn: list[tuple[float, float, list]] = []
    real = matplotlib.axes.Axes.errorbar

    def spy(self, x, y, *args, **kwargs):
        drawn.append((x, y, kwargs["yerr"]))
        return real(self, x, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
    rows, _ = demo_run()
    assert plot_pareto(rows).startswith(b"\x89PNG")
    by_cost = {x: (y, yerr) for x, y, yerr in drawn}
    y, yerr = by_cost[3e-6]  # lemon: 0.5 with the interval [0.15, 0.85] from its summary
    assert y == 0.5 and yerr == [[pytest.approx(0.35)], [pytest.approx(0.35)]]
    lo, hi = wilson_interval(2, 4)
    assert by_cost[1e-5][1] == [[pytest.approx(0.5 - lo)], [pytest.approx(hi - 0.5)]]


def test_the_pareto_cost_axis_names_its_unit_and_prints_no_exponent_into_its_label() -> None:
    """Costs per example are ~1e-5 USD; a scientific axis printed its exponent at the axis end, on top of the
    axis label. The axis is ticked in plain numbers of a unit the label names, and the label stands clear."""
    import matplotlib.pyplot as plt

    from lemon_core.report import pareto_figure

    rows, _ = demo_run()
    fig = pareto_figure([*rows, {**ROWS[3], "n": 4}])  # two panels
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        assert ax.xaxis.get_offset_text().get_text() == "", "no exponent beside the axis"
        assert ax.get_xlabel().startswith("mean cost, USD per million examples")
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high]
        assert ticks and all(re.fullmatch(r"-?[0-9.]+", t.get_text().replace("\u2212", "-")) for t in ticks)
        label = ax.xaxis.label.get_window_extent(renderer)
        assert not any(label.overlaps(t.get_window_extent(renderer)) for t in ticks)
        assert fig.bbox.x0 <= label.x0 and label.x1 <= fig.bbox.x1, "the label is not cut off at the figure edge"
    plt.close(fig)


def test_cost_units_write_the_largest_cost_as_a_plain_number() -> None:
    from lemon_core.plots import cost_unit

    assert cost_unit([3e-6, 4e-5]) == (1e6, "USD per million examples")
    assert cost_unit([0.02], per="execution") == (1e3, "USD per 1,000 executions")
    assert cost_unit([0.0, 1.5]) == (1.0, "USD per example")
    assert cost_unit([]) == cost_unit([0.0]) == (1.0, "USD per example"), "nothing spent: plain USD"


def test_full_report_answers_the_question(tmp_path: Path) -> None:
    rows, traces = demo_run()
    paths = write_report(rows, tmp_path, title="run 8", traces=traces, levels=LEVELS, gallery_size=3)
    page = paths["html"].read_text()
    heads = re.findall(r"<p class='headline'>(.*?)</p>", page)
    assert heads[0].startswith("gsm8k: lemon accuracy 0.500 [0.150, 0.850] (n=4), valid specs 0.750")
    assert heads[0].endswith("best baseline cot 0.500 [0.150, 0.850] at $1e-05/example"), "a tie goes to the cheaper"
    assert "SFT-only vs trained orchestrator" in page and "What the orchestrator chose" in page
    assert "small: 56% \u00b7 medium: 22% \u00b7 large: 22%" in page
    assert "diamond: 67% \u00b7 single: 33%" in page
    assert page.count("<div class='example'>") == 6, "3 examples for each of the two orchestrators"
    assert page.count("<details class='agent'>") == 4 + 1 + 1 + 3, "one collapsible output per agent run"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" not in page, "q3 is not among the first three"
    assert "<script" not in page and "src='http" not in page and "<link" not in page
    assert "spec invalid: field &#x27;output&#x27;" in page
    md = paths["markdown"].read_text()
    assert "**gsm8k: lemon accuracy 0.500 [0.150, 0.850]" in md


def test_gallery_pictures_are_svg_of_the_spec(tmp_path: Path) -> None:
    rows, traces = demo_run()
    page = render_html(rows, images={}, traces={("gsm8k", "lemon"): traces["gsm8k", "lemon"]}, gallery_size=4)
    svgs = [base64.b64decode(m).decode() for m in re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", page)]
    assert len(svgs) == 3, "three valid specs among four examples; the invalid one has no picture"
    assert all(s.startswith("<svg") for s in svgs)
    assert svgs[0].count('<g class="agent ') == 4 and svgs[1].count('<g class="agent ') == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, "agent outputs are escaped, never markup"


def test_read_traces_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text('{"id": 1}\n\n{"id": 2\n')
    with pytest.raises(ValueError, match="line 3 is not JSON"):
        read_traces(path)
    path.write_text('{"id": 1}\n\n{"id": 2}\n')
    assert [r["id"] for r in read_traces(path)] == [1, 2]


# --- training curves (lemon_core/plots.py) --------------------------------------------------------------
def metrics_row(step: int) -> dict:
    """A metrics.jsonl row with the fields train.py writes per step."""
    return {"step": step, "reward/mean": 0.1 * step, "reward/ci_low": 0.1 * step - 0.05,
            "reward/ci_high": 0.1 * step + 0.05, "valid_rate": 0.5, "success_rate": 0.25 * step,
            "cost/mean": 2e-5, "capacity_share/small": 0.25 * step, "capacity_share/large": 1 - 0.25 * step,
            "delta/drop_dependency": 0.2, "delta_count/drop_dependency": 3 + step, "loss": 1.0, "kl": 0.01}


def test_curve_series_puts_each_metric_in_its_panel() -> None:
    data = curve_series([metrics_row(1), metrics_row(2)])
    assert data["reward"]["mean"] == ([1, 2], [0.1, 0.2])
    assert data["reward"]["band low"] == ([1, 2], [pytest.approx(0.05), pytest.approx(0.15)])
    assert data["rates"] == {"valid-spec rate": ([1, 2], [0.5, 0.5]), "success rate": ([1, 2], [0.25, 0.5])}
    assert data["cost"] == {"cost per execution": ([1, 2], [2e-5, 2e-5])}
    assert list(data["capacity share"]) == ["small", "large"], "levels in the order train.py wrote them"
    assert data["capacity share"]["large"] == ([1, 2], [0.75, 0.5])
    assert data["delta"] == {"drop_dependency": ([1, 2], [0.2, 0.2])}
    assert data["edit counts"] == {"drop_dependency": ([1, 2], [4.0, 5.0])}
    assert data["optimisation"] == {"loss": ([1, 2], [1.0, 1.0]), "kl": ([1, 2], [0.01, 0.01])}, "no clip_ratio"
    assert data["reward terms"] == {}


def test_curve_series_reads_older_rows() -> None:
    old = [{"step": 1, "reward/mean": 0.5, "reward/std": 0.1, "capacity/small": 1.0, "cost": 3e-5,
            "reward/success": 0.5}, {"step": 2, "reward/mean": 0.7, "reward/std": 0.2, "capacity/small": 0.5,
                                     "cost": 2e-5, "reward/success": 0.75}]
    data = curve_series(old)
    assert data["reward"]["band high"] == ([1, 2], [pytest.approx(0.6), pytest.approx(0.9)]), "mean + std"
    assert data["capacity share"] == {"small": ([1, 2], [1.0, 0.5])}
    assert data["cost"]["cost per execution"] == ([1, 2], [3e-5, 2e-5])
    assert data["reward terms"] == {"success": ([1, 2], [0.5, 0.75])}


def test_reward_curve_png_says_what_was_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    written: list[str] = []
    real = matplotlib.axes.Axes.text

    def spy(self, x, y, s, *args, **kwargs):
        written.append(s)
        return real(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "text", spy)
    out = plot_reward_curve([{"step": 1, "reward/mean": 0.2}, {"step": 2, "reward/mean": 0.3}], tmp_path / "c.png")
    assert out.read_bytes().startswith(b"\x89PNG")
    assert written.count("not recorded") == 7, "every panel but the reward one"
    written.clear()
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(metrics_row(s)) + "\n" for s in (1, 2, 3)))
    plot_reward_curve(path, tmp_path / "full.png")
    assert written.count("not recorded") == 1, "only the reward terms are absent"
    with pytest.raises(ValueError, match="lack 'step'"):
        plot_reward_curve([{"reward/mean": 0.1}], tmp_path / "bad.png")
    with pytest.raises(ValueError, match="no metrics rows"):
        plot_reward_curve([], tmp_path / "bad.png")


def test_report_of_a_real_evaluation(tmp_path: Path) -> None:
    """evaluate() on the seeded simulated pool writes traces.jsonl; the report reads them as written."""
    from lemon_core.backends.simulated import register_examples
    from lemon_core.benchmarks import get
    from lemon_core.evaluate import evaluate
    from lemon_core.pool import load_pool

    pool = load_pool("simulated")
    bench = get("gsm8k")
    examples = bench.load("test", 4, data_dir=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    register_examples(examples)
    rows, traces = [], {}
    for method, spec in (("cot", cot(pool.level_names[-1])), ("lemon", FOUR_AGENTS)):
        summary, _ = evaluate(bench, examples, spec, pool, method=method, out_dir=tmp_path / method, progress=False)
        rows.append(summary)
        traces["gsm8k", method] = read_traces(tmp_path / method / "traces.jsonl")
    page = write_report(rows, tmp_path / "report", traces=traces, levels=pool.level_names)["html"].read_text()
    assert page.count("<div class='example'>") == 3, "the gallery shows the orchestrator's examples only"
    first = traces["gsm8k", "lemon"][0]
    assert html.escape(first["task"][:60]) in page
    for agent in first["agents"]:
        assert f"<pre>{html.escape(agent['output'])}</pre>" in page, "each agent's output, as the trace has it"
    assert "4: 100%" in page and "diamond: 100%" in page


def test_the_sft_section_says_what_was_taught_and_how_valid_the_result_is() -> None:
    """The figures of a real `make run` SFT (2026-12-03): the sweep taught cot@large to all 8 tasks."""
    from lemon_core.report import render_html, sft_rows

    sft = {"valid_rate_before": 0.0, "valid_rate_after": 1.0, "valid_rate_after_ci": [0.8928, 1.0],
           "valid_samples": 32, "loss_first": 1.115, "loss_last": 5.09e-05, "pairs": 8, "steps": 16, "rounds": 1,
           "teacher": "sweep", "sweep": {"tasks": 8, "taught": {"cot@large": 8}, "fallback_tasks": 5,
                                         "teacher_score": 0.375}}
    rows = {r["what"]: r["value"] for r in sft_rows(sft)}
    assert rows["taught (candidate \u00d7 SFT targets)"] == "cot@large \u00d78"
    assert rows["valid-spec rate before \u2192 after (unconstrained)"] == "0.000 \u2192 1.000 [0.893, 1.000] (n=32)"
    assert rows["sweep tasks / no candidate solved"] == "8 / 5"
    assert rows["loss first \u2192 last"] == "1.115 \u2192 5.09e-05"
    templated = {r["what"]: r["value"] for r in sft_rows({"teacher": "templated", "valid_rate_after": None})}
    assert "taught (candidate \u00d7 SFT targets)" not in templated
    assert templated["valid-spec rate before \u2192 after (unconstrained)"] == "- \u2192 - (n=0)"
    page = render_html([], images={}, tables={"SFT warm-up": sft_rows(sft)})
    assert "<h2>SFT warm-up</h2>" in page and "cot@large \u00d78" in page



def test_the_sft_section_shows_the_sweep_candidates_solved_counts_with_intervals() -> None:
    """The 2026-12-05 `make run` taught chain@large on 8 tasks; the report says what it beat and by how little."""
    from lemon_core.report import sft_rows
    from lemon_core.teachers import SWEEP_ROWS_SHOWN

    candidates = [{"candidate": f"c{i}", "solved": 8 - i, "n": 8, "mean_reward": 1.0 - i / 10,
                   "ci": [0.1 * (8 - i) - 0.1, 0.1 * (8 - i) + 0.05]} for i in range(SWEEP_ROWS_SHOWN + 2)]
    candidates[0].update(candidate="chain@large", solved=5, ci=[0.3057, 0.8632], mean_reward=0.6125)
    sft = {"teacher": "sweep", "sweep": {"tasks": 8, "taught": {"chain@large": 8}, "fallback_tasks": 3,
                                         "teacher_score": 0.5, "candidates": candidates}}
    key = "sweep: solved / tasks [95% CI], mean reward \u00b1 s.e., cost (best first)"
    value = {r["what"]: r["value"] for r in sft_rows(sft)}[key]
    assert value.startswith("chain@large 5/8 [0.31, 0.86] reward 0.613; c1 7/8")  # an sft.json without s.e. or cost
    assert value.count(";") == SWEEP_ROWS_SHOWN - 1  # the best few; sft.json keeps them all
    candidates[0].update(reward_se=0.1633, mean_cost=1.13e-4)
    value = {r["what"]: r["value"] for r in sft_rows(sft)}[key]
    assert value.startswith("chain@large 5/8 [0.31, 0.86] reward 0.613 \u00b1 0.163, $1.13e-04/task; c1 7/8")
    older = {"teacher": "sweep", "sweep": {"tasks": 8, "taught": {"cot@large": 8}, "fallback_tasks": 5}}
    assert not any(r["what"].startswith("sweep: solved") for r in sft_rows(older))  # an sft.json from before


def test_an_orchestrator_is_placed_at_its_cost_with_its_own_call() -> None:
    """The Pareto front and the headline count what writing the spec cost: an orchestrator as accurate as a
    baseline whose agents cost less than the baseline's, but whose own call makes it dearer, is not on the front."""
    from lemon_core.report import _front_labels, as_rows, headlines, total_cost

    rows = as_rows([
        {"benchmark": "multiarith", "method": "cot", "n": 30, "accuracy": 0.6, "mean_cost_usd": 5e-5},
        {"benchmark": "multiarith", "method": "lemon", "n": 30, "accuracy": 0.6, "mean_cost_usd": 4.5e-5,
         "orchestrator_cost_usd": 1e-5},
    ])
    assert total_cost(rows[1]) == pytest.approx(5.5e-5) and total_cost(rows[0]) == 5e-5
    assert _front_labels(rows) == {("multiarith", "cot")}
    (line,) = headlines(rows)
    assert "cost $5.5e-05/example (its own call $1e-05 of it)" in line


def test_what_moved_panels_per_benchmark(tmp_path: Path) -> None:
    """The per-benchmark breakdowns of rollout_metrics become one row of panels per benchmark; the overall capacity
    stack keeps only the overall levels (a breakdown key is not a level)."""
    from lemon_core.plots import choice_series, curve_series, plot_choices

    rows = [{"step": s, "capacity/small": 1 - s / 4, "capacity/large": s / 4,
             "capacity/multiarith/small": 1 - s / 2, "capacity/multiarith/large": s / 2,
             "capacity/mmlu/small": 1.0, "capacity/mmlu/large": 0.0,
             "shape/multiarith/single": 1.0, "shape/mmlu/chain2": 0.5, "shape/mmlu/single": 0.5,
             "reward/multiarith": 0.1 * s, "probe/reward": 0.2 * s, "kl": 0.01 * s} for s in (1, 2)]
    data = choice_series(rows)
    assert set(data) == {"multiarith", "mmlu", "all"}
    assert data["multiarith"]["capacity"]["large"] == ([1, 2], [0.5, 1.0])
    assert set(data["mmlu"]["shape"]) == {"chain2", "single"} and data["mmlu"]["reward"] == {}
    assert data["all"]["kl"]["kl"] == ([1, 2], [0.01, 0.02]) and "probe reward" in data["all"]
    assert set(curve_series(rows)["capacity share"]) == {"small", "large"}
    png = plot_choices(rows, tmp_path / "choices.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
