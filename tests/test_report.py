"""Evaluation report: Pareto front, PNG, self-contained HTML, Markdown."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from lemon_core.report import pareto_front, render_markdown, write_report

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
