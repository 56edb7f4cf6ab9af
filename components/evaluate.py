"""evaluate: one (method, benchmark) cell -> summary.json + traces; and the report over all cells.

``evaluation_report`` is the fan-in step: it writes the HTML report (Pareto plot, reward curve,
tables) as a kfp HTML artifact the Kubeflow UI renders, the Markdown summary, kfp Metrics, and
decides whether the candidate beats the served model (the gate before ``publish``).
"""

from typing import Any, NamedTuple

from kfp.dsl import HTML, Markdown, Metrics, Output

from components.common import lightweight


def evaluate(
    config_json: str, manifest_uri: str, method: str, benchmark: str, checkpoint_uri: str, sft_uri: str
) -> str:
    """Returns the summary.json URI of this cell (``lemon`` evaluates checkpoint_uri, ``lemon-sft`` sft_uri)."""
    from lemon_core.stages import SFT_ORCHESTRATOR, load_config, stage_evaluate

    orchestrator = sft_uri if method == SFT_ORCHESTRATOR else checkpoint_uri
    return stage_evaluate(load_config(config_json), manifest_uri, method, benchmark, orchestrator)


def evaluation_report(
    config_json: str,
    summary_uris: list,
    html: Output[HTML],
    markdown: Output[Markdown],
    metrics: Output[Metrics],
) -> NamedTuple(
    "ReportOutputs", [("publish", bool), ("candidate", float), ("served", float), ("report_uri", str)]
):
    import shutil
    import tempfile
    from collections import namedtuple
    from pathlib import Path

    from lemon_core import storage
    from lemon_core.stages import (
        ORCHESTRATOR,
        load_config,
        read_summaries,
        root_of_summary,
        should_publish,
        stage_report,
    )

    cfg = load_config(config_json)
    rows = read_summaries(summary_uris)
    with tempfile.TemporaryDirectory() as tmp:
        paths = stage_report(cfg, summary_uris, Path(tmp))
        shutil.copyfile(paths["html"], html.path)
        shutil.copyfile(paths["markdown"], markdown.path)
    for r in rows:
        metrics.log_metric(f"{r['benchmark']}/{r['method']}/accuracy", float(r["accuracy"]))
        metrics.log_metric(f"{r['benchmark']}/{r['method']}/mean_cost_usd", float(r["mean_cost_usd"]))
        metrics.log_metric(f"{r['benchmark']}/{r['method']}/valid_rate", float(r.get("valid_rate", 1.0)))
    publish, candidate, served = False, -1.0, -1.0
    if any(r["method"] == ORCHESTRATOR for r in rows):
        publish, candidate, served_or_none = should_publish(cfg, summary_uris)
        served = -1.0 if served_or_none is None else served_or_none
    report_uri = storage.join(root_of_summary(summary_uris[0]), "report", "report.html")
    print(f"report: {report_uri}")
    return namedtuple("ReportOutputs", ["publish", "candidate", "served", "report_uri"])(
        publish, candidate, served, report_uri
    )


def make(image: str) -> Any:
    return lightweight(evaluate, image)


def make_report(image: str) -> Any:
    return lightweight(evaluation_report, image)
