"""lemon_core.metrics: exposition files, Pushgateway pushes, and the monitoring examples' names."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
import yaml
from moto.server import ThreadedMotoServer
from prometheus_client.parser import text_string_to_metric_families

from lemon_core import metrics, storage
from lemon_core.metrics import LemonMetrics, new_registry

MONITORING = Path(__file__).resolve().parents[1] / "charts" / "monitoring"


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value, from a text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def filled_metrics() -> LemonMetrics:
    m = LemonMetrics(new_registry())
    m.record_call("small", prompt_tokens=100, completion_tokens=20, cost_usd=0.001)
    m.record_call("small", prompt_tokens=50, completion_tokens=10, cost_usd=0.0005)
    m.record_call("large", prompt_tokens=300, completion_tokens=80, cost_usd=0.02)
    m.record_rewards("total", [1.0, 0.0, 0.5, -0.5])
    m.record_deltas("capacity_downgrade", [0.2, 0.4])
    m.spec_valid_ratio.set(0.875)
    m.record_train_step(loss=0.42, kl=0.013, clip_ratio=0.05)
    m.record_eval("gsm8k", "lemon", accuracy=0.75, cost_usd_per_example=0.003)
    m.record_eval("gsm8k", "cot", accuracy=0.5, cost_usd_per_example=0.001)
    for seconds in (0.2, 0.7, 3.0):
        m.request_latency.observe(seconds)
    m.spec_invalid.inc()
    return m


def test_exposition_file_has_the_recorded_values(tmp_path: Path) -> None:
    m = filled_metrics()
    uri = metrics.write_exposition(m.registry, str(tmp_path / "eval" / metrics.EXPOSITION_NAME))
    got = samples(Path(uri).read_text())

    def value(name: str, **labels: str) -> float:
        return got[(name, frozenset(labels.items()))]

    assert value("lemon_agent_calls_total", capacity="small") == 2
    assert value("lemon_tokens_total", capacity="small", kind="prompt") == 150
    assert value("lemon_tokens_total", capacity="large", kind="completion") == 80
    assert value("lemon_cost_usd_total", capacity="small") == pytest.approx(0.0015)
    assert value("lemon_rollout_reward", term="total") == pytest.approx(0.25)
    assert value("lemon_counterfactual_delta", family="capacity_downgrade") == pytest.approx(0.3)
    assert value("lemon_spec_valid_ratio") == 0.875
    train = (value("lemon_train_loss"), value("lemon_train_kl"), value("lemon_train_clip_ratio"))
    assert train == (0.42, 0.013, 0.05)
    assert value("lemon_eval_accuracy", benchmark="gsm8k", method="lemon") == 0.75
    assert value("lemon_eval_cost_usd", benchmark="gsm8k", method="cot") == 0.001
    assert value("lemon_request_latency_seconds_count") == 3
    assert value("lemon_request_latency_seconds_bucket", le="1.0") == 2
    assert value("lemon_request_latency_seconds_sum") == pytest.approx(3.9)
    assert value("lemon_spec_invalid_total") == 1
    # Every exposed sample name is one series_names() promises (what rules/dashboards may use).
    assert {name for name, _ in got} <= metrics.series_names()


def test_exposition_goes_to_s3_through_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        env = {"LEMON_S3_ENDPOINT_URL": endpoint, "LEMON_S3_ACCESS_KEY_ID": "testing",
               "LEMON_S3_SECRET_ACCESS_KEY": "testing", "LEMON_S3_ADDRESSING_STYLE": "path"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="lemon-metrics")
        m = filled_metrics()
        uri = metrics.write_exposition(m.registry, "s3://lemon-metrics/runs/r1/metrics.prom")
        got = samples(storage.read_text(uri))
        labels = frozenset({"benchmark": "gsm8k", "method": "lemon"}.items())
        assert got[("lemon_eval_accuracy", labels)] == 0.75
    finally:
        server.stop()


def test_helpers_reject_bad_values() -> None:
    m = LemonMetrics(new_registry())
    with pytest.raises(ValueError, match="reward term 'correct'"):
        m.record_rewards("correct", [1.0])
    with pytest.raises(ValueError, match="accuracy for gsm8k/lemon must be in"):
        m.record_eval("gsm8k", "lemon", accuracy=75.0, cost_usd_per_example=0.0)
    with pytest.raises(ValueError, match="prompt_tokens=-1"):
        m.record_call("small", prompt_tokens=-1, completion_tokens=0, cost_usd=0.0)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        LemonMetrics(m.registry)  # one definition per registry, never two


def test_record_eval_sets_valid_rate_interval_and_n() -> None:
    m = LemonMetrics(new_registry())
    m.record_eval("gsm8k", "lemon", accuracy=0.75, cost_usd_per_example=0.003, valid_rate=0.9, n=100)
    m.record_eval("gsm8k", "cot", accuracy=0.5, cost_usd_per_example=0.001,
                  ci_low=0.4, ci_high=0.6, n=100)  # an interval computed elsewhere is kept as given
    m.record_eval("mmlu", "cot", accuracy=0.0, cost_usd_per_example=0.001, n=10)
    m.record_eval("svamp", "cot", accuracy=0.5, cost_usd_per_example=0.001)  # an old caller
    got = samples(metrics.exposition(m.registry).decode())

    def value(name: str, benchmark: str, method: str) -> float | None:
        return got.get((name, frozenset({"benchmark": benchmark, "method": method}.items())))

    # 95% Wilson interval of 75/100 by hand: centre (p + z^2/2n) / (1 + z^2/n), z = 1.96
    assert value("lemon_eval_accuracy_ci_low", "gsm8k", "lemon") == pytest.approx(0.65696, abs=1e-5)
    assert value("lemon_eval_accuracy_ci_high", "gsm8k", "lemon") == pytest.approx(0.82455, abs=1e-5)
    assert value("lemon_eval_valid_rate", "gsm8k", "lemon") == 0.9
    assert value("lemon_eval_examples", "gsm8k", "lemon") == 100
    assert value("lemon_eval_accuracy_ci_low", "gsm8k", "cot") == 0.4
    assert value("lemon_eval_accuracy_ci_high", "gsm8k", "cot") == 0.6
    assert value("lemon_eval_valid_rate", "gsm8k", "cot") == 1.0  # baselines are always valid specs
    # 0 of 10 correct: the interval is [0, 0.2775], not a point at 0
    assert value("lemon_eval_accuracy_ci_low", "mmlu", "cot") == 0.0
    assert value("lemon_eval_accuracy_ci_high", "mmlu", "cot") == pytest.approx(0.27753, abs=1e-5)
    # without n nor an interval nothing is made up
    assert value("lemon_eval_accuracy_ci_low", "svamp", "cot") is None
    assert value("lemon_eval_examples", "svamp", "cot") is None
    assert value("lemon_eval_valid_rate", "svamp", "cot") == 1.0
    with pytest.raises(ValueError, match="valid_rate for gsm8k/lemon must be in"):
        m.record_eval("gsm8k", "lemon", accuracy=0.5, cost_usd_per_example=0.0, valid_rate=1.5)
    with pytest.raises(ValueError, match="both ci_low and ci_high"):
        m.record_eval("gsm8k", "lemon", accuracy=0.5, cost_usd_per_example=0.0, ci_low=0.4)
    with pytest.raises(ValueError, match="n must be >= 1"):
        m.record_eval("gsm8k", "lemon", accuracy=0.5, cost_usd_per_example=0.0, n=0)
    assert {"lemon_eval_valid_rate", "lemon_eval_accuracy_ci_low", "lemon_eval_accuracy_ci_high",
            "lemon_eval_examples"} <= metrics.series_names()


def test_a_process_exposes_only_the_parts_it_fills() -> None:
    m = LemonMetrics(new_registry(), parts=metrics.SERVICE_PARTS)
    m.record_call("small", prompt_tokens=1, completion_tokens=2, cost_usd=0.0)
    m.record_train_step(loss=0.5, kl=0.1, clip_ratio=0.0)  # not this process's: no error, not exposed
    m.record_eval("gsm8k", "lemon", accuracy=0.5, cost_usd_per_example=0.0, n=4)
    text = metrics.exposition(m.registry).decode()
    names = {name for name, _ in samples(text)}
    assert {"lemon_agent_calls_total", "lemon_requests_in_flight", "lemon_spec_invalid_total"} <= names
    assert not [n for n in names if n.startswith(("lemon_train", "lemon_eval", "lemon_rollout", "lemon_spec_valid"))]
    assert "lemon_train_loss" not in text
    # all parts (the default) still expose everything, and series_names() lists every part
    full = {name for name, _ in samples(metrics.exposition(filled_metrics().registry).decode())}
    assert {"lemon_train_loss", "lemon_eval_accuracy", "lemon_request_latency_seconds_count"} <= full
    assert "lemon_train_loss" in metrics.series_names()
    with pytest.raises(ValueError, match="unknown metric part"):
        LemonMetrics(new_registry(), parts=("serving",))


# ------------------------------------------------------------------------------------- Pushgateway


class FakePushgateway:
    """Loopback HTTP server that records each request (method, path, body) and answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                gateway.requests.append((self.command, self.path, body))
                self.send_response(status)
                self.end_headers()

            do_PUT = do_POST = _record

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_push_sends_exposition_to_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = FakePushgateway()
    try:
        monkeypatch.setenv("LEMON_PUSHGATEWAY", gateway.address)
        m = filled_metrics()
        assert metrics.push_if_configured(m.registry, "lemon-evaluate", grouping_key={"run": "r1"})
        assert len(gateway.requests) == 1
        method, path, body = gateway.requests[0]
        assert (method, path) == ("PUT", "/metrics/job/lemon-evaluate/run/r1")
        got = samples(body.decode())
        assert got[("lemon_agent_calls_total", frozenset({"capacity": "large"}.items()))] == 1
    finally:
        gateway.close()


def test_push_is_a_no_op_without_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEMON_PUSHGATEWAY", raising=False)
    assert metrics.push_if_configured(filled_metrics().registry, "lemon-train") is False


def test_push_failures_only_warn(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    gateway = FakePushgateway(status=500)
    try:
        caplog.set_level(logging.WARNING, logger="lemon_core.metrics")
        pushed = metrics.push_if_configured(filled_metrics().registry, "lemon-train", gateway=gateway.address)
        assert pushed is False
        assert len(gateway.requests) == 1
        assert "could not push metrics for job 'lemon-train'" in caplog.text
    finally:
        gateway.close()
    # Nothing listening at all: still no exception, and no long hang.
    start = time.monotonic()
    monkeypatch.setenv("LEMON_PUSHGATEWAY", gateway.address)
    assert metrics.push_if_configured(filled_metrics().registry, "lemon-train", timeout_s=2) is False
    assert time.monotonic() - start < 5


# ------------------------------------------------------------------------------- monitoring examples

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def lemon_names(expr: str) -> set[str]:
    """Identifiers in a PromQL expression that name lemon series or recorded lemon series.

    Quoted label values are removed first so a value such as method="lemon" does not count.
    """
    unquoted = re.sub(r'"[^"]*"', '""', expr)
    return {n for n in _NAME.findall(unquoted) if "lemon_" in n}


def recorded_names() -> set[str]:
    groups = yaml.safe_load((MONITORING / "recording-rules.yaml").read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def test_recording_rules_use_only_defined_metrics() -> None:
    groups = yaml.safe_load((MONITORING / "recording-rules.yaml").read_text())["groups"]
    known = metrics.series_names() | recorded_names()
    exprs = [rule["expr"] for group in groups for rule in group["rules"]]
    assert len(exprs) >= 10
    for expr in exprs:
        names = lemon_names(expr)
        assert names, f"rule without a lemon metric: {expr}"
        assert names <= known, f"{expr!r} uses undefined {sorted(names - known)}"
    # The brief's three: accuracy per benchmark, cost per correct answer, p99 latency.
    assert {"benchmark:lemon_eval_accuracy:max", "benchmark_method:lemon_eval_cost_per_correct_usd:ratio",
            "job:lemon_request_latency_seconds:p99_5m"} <= recorded_names()


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package `prometheus`; .ci/install_prometheus.sh)")
def test_promtool_accepts_rules() -> None:
    proc = subprocess.run(["promtool", "check", "rules", str(MONITORING / "recording-rules.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_scrape_config_example_is_consistent() -> None:
    config = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    for rule_file in config["rule_files"]:
        assert (MONITORING / rule_file).is_file(), rule_file
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"lemon-serve", "lemon-pushgateway"}
    assert jobs["lemon-pushgateway"]["honor_labels"] is True
    assert jobs["lemon-serve"]["metrics_path"] == "/metrics"


def test_grafana_dashboard_queries_defined_series() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    known = metrics.series_names() | recorded_names()
    used: set[str] = set()
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = lemon_names(target["expr"])
            assert names and names <= known, f"panel {panel['title']!r}: {target['expr']!r}"
            used |= names
    # Every metric family from the brief appears on some panel, directly or via a recorded series.
    families = {
        "lemon_eval_accuracy", "lemon_eval_cost_usd", "lemon_rollout_reward", "lemon_spec_valid_ratio",
        "lemon_counterfactual_delta", "lemon_train_loss", "lemon_train_kl", "lemon_train_clip_ratio",
        "lemon_agent_calls", "lemon_tokens", "lemon_cost_usd", "lemon_request_latency_seconds",
        "lemon_requests_in_flight", "lemon_spec_invalid",
        "lemon_eval_valid_rate", "lemon_eval_accuracy_ci_low", "lemon_eval_accuracy_ci_high", "lemon_eval_examples",
    }
    text = " ".join(sorted(used))
    missing = {f for f in families if f not in text}
    assert not missing, missing
