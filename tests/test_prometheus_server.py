"""A real Prometheus server scrapes a lemon metrics endpoint and evaluates lemon's recording rules.

Needs /usr/bin/prometheus (Debian package `prometheus`, installed by .ci/install_prometheus.sh);
skipped only when the binary is absent. Everything listens on 127.0.0.1; the server is killed in
teardown and its TSDB lives in a temporary directory.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client import start_http_server

from lemon_core.metrics import LemonMetrics, new_registry

PROMETHEUS = shutil.which("prometheus") or shutil.which("/usr/bin/prometheus")
RULES = Path(__file__).resolve().parents[1] / "charts" / "monitoring" / "recording-rules.yaml"
DEADLINE_S = 25.0  # new targets show up after ~5-6 s (discovery refresh), then 1 s scrapes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not found: install the Debian package "
                       "`prometheus` (.ci/install_prometheus.sh) to run the real-server test"),
]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def lemon_endpoint() -> Iterator[tuple[str, LemonMetrics]]:
    """A lemon /metrics endpoint on a random loopback port with a few known values."""
    m = LemonMetrics(new_registry())
    m.record_eval("gsm8k", "lemon", accuracy=0.75, cost_usd_per_example=0.003)
    m.record_eval("gsm8k", "cot", accuracy=0.5, cost_usd_per_example=0.001)
    m.record_call("small", prompt_tokens=120, completion_tokens=30, cost_usd=0.0004)
    m.spec_valid_ratio.set(0.9)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=m.registry)
    yield f"127.0.0.1:{server.server_address[1]}", m
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def prometheus(tmp_path: Path, lemon_endpoint: tuple[str, LemonMetrics]) -> Iterator[Server]:
    """Start Prometheus scraping the endpoint every second with lemon's rules evaluated every second."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"  # the shipped intervals are 15-30 s; too slow for a test
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [{"job_name": "lemon", "static_configs": [{"targets": [lemon_endpoint[0]]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed in teardown
    args = [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn"]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Server(f"http://127.0.0.1:{port}", proc, tmp_path / "prometheus.log")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    if proc.returncode not in (0, -15):
        tail = (tmp_path / "prometheus.log").read_text()[-2000:]
        pytest.fail(f"prometheus exited {proc.returncode}: {tail}")


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=3) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(server: Server, promql: str, deadline: float) -> list[dict]:
    """Poll until the query returns something or the deadline passes (then fail with the last error)."""
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"prometheus exited {server.proc.returncode}: {server.log.read_text()[-2000:]}")
        try:
            result = query(server.url, promql)
            if result:
                return result
        except OSError as err:  # server still starting
            last_error = err
        time.sleep(0.5)
    pytest.fail(f"no result for {promql!r} within {DEADLINE_S:.0f}s (last error: {last_error})")


def test_prometheus_scrapes_lemon_metrics_and_records_rules(
    prometheus: Server, lemon_endpoint: tuple[str, LemonMetrics]
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    result = wait_for(prometheus, 'lemon_eval_accuracy{benchmark="gsm8k",method="lemon"}', deadline)
    assert result[0]["metric"]["job"] == "lemon"
    assert float(result[0]["value"][1]) == 0.75

    tokens = wait_for(prometheus, 'lemon_tokens_total{capacity="small",kind="prompt"}', deadline)
    assert float(tokens[0]["value"][1]) == 120

    # A value changed on the endpoint reaches Prometheus on a later scrape.
    lemon_endpoint[1].spec_valid_ratio.set(0.5)
    assert wait_for(prometheus, "lemon_spec_valid_ratio == 0.5", deadline)

    # The shipped recording rules run on the scraped data: cost per correct = 0.003 / 0.75.
    recorded = wait_for(
        prometheus, 'benchmark_method:lemon_eval_cost_per_correct_usd:ratio{method="lemon"}', deadline
    )
    assert float(recorded[0]["value"][1]) == pytest.approx(0.004)
    gap = wait_for(prometheus, "benchmark:lemon_eval_accuracy:lemon_minus_best_baseline", deadline)
    assert float(gap[0]["value"][1]) == pytest.approx(0.25)
