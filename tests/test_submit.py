"""``pipelines.run.submit`` against a loopback fake of the Kubeflow Pipelines v2beta1 REST API.

The fake records every request and answers the endpoints a real KFP API server exposes for this
flow: GET /apis/v2beta1/healthz (the client checks it first), GET /apis/v2beta1/pipelines (filter
by display_name), POST /apis/v2beta1/pipelines/upload (multipart IR YAML), POST
/apis/v2beta1/pipelines/upload_version, GET /apis/v2beta1/pipelines/{id}/versions,
GET/POST /apis/v2beta1/experiments, POST /apis/v2beta1/runs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from lemon_core.stages import load_config
from pipelines.run import submit


class FakeKFP:
    def __init__(self, existing_pipeline: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        self.pipelines: dict[str, str] = {"lemon-train": "p-1"} if existing_pipeline else {}
        self.experiments: dict[str, str] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, obj: dict[str, Any], code: int = 200) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self, method: str) -> dict[str, Any]:
                url = urlparse(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = {
                    "method": method,
                    "path": url.path,
                    "query": parse_qs(url.query),
                    "body": body,
                    "content_type": self.headers.get("Content-Type", ""),
                }
                fake.requests.append(req)
                return req

            def do_GET(self) -> None:
                req = self._record("GET")
                flt = json.loads(req["query"].get("filter", ["{}"])[0] or "{}")
                name = (flt.get("predicates") or [{}])[0].get("string_value") or (
                    flt.get("predicates") or [{}]
                )[0].get("stringValue")
                if req["path"] == "/apis/v2beta1/healthz":
                    return self._send({"multi_user": False})
                if req["path"] == "/apis/v2beta1/pipelines":
                    pid = fake.pipelines.get(name)
                    return self._send(
                        {"pipelines": [{"pipeline_id": pid, "display_name": name}]} if pid else {}
                    )
                if req["path"].endswith("/versions"):
                    return self._send({"pipeline_versions": [{"pipeline_version_id": "v-1"}]})
                if req["path"] == "/apis/v2beta1/experiments":
                    eid = fake.experiments.get(name)
                    return self._send(
                        {"experiments": [{"experiment_id": eid, "display_name": name}]} if eid else {}
                    )
                self._send({"error": "not found"}, 404)

            def do_POST(self) -> None:
                req = self._record("POST")
                if req["path"] == "/apis/v2beta1/pipelines/upload":
                    fake.pipelines[req["query"]["name"][0]] = "p-1"
                    return self._send({"pipeline_id": "p-1", "display_name": req["query"]["name"][0]})
                if req["path"] == "/apis/v2beta1/pipelines/upload_version":
                    return self._send({"pipeline_id": "p-1", "pipeline_version_id": "v-2"})
                if req["path"] == "/apis/v2beta1/experiments":
                    body = json.loads(req["body"])
                    fake.experiments[body["display_name"]] = "e-1"
                    return self._send({"experiment_id": "e-1", "display_name": body["display_name"]})
                if req["path"] == "/apis/v2beta1/runs":
                    return self._send({"run_id": "r-1", **json.loads(req["body"])})
                self._send({"error": "not found"}, 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host = f"http://127.0.0.1:{self.server.server_address[1]}"

    def posts(self, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "POST" and r["path"] == path]


@pytest.fixture
def kfp_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads ~/.config/kfp/context.json
    servers: list[FakeKFP] = []

    def start(**kw: Any) -> FakeKFP:
        servers.append(FakeKFP(**kw))
        return servers[-1]

    yield start
    for s in servers:
        s.server.shutdown()
        s.server.server_close()


def test_submit_uploads_creates_experiment_and_runs(kfp_api: Any, tmp_path: Path) -> None:
    fake = kfp_api()
    cfg = load_config("local-tiny")
    cfg.artifacts = "s3://lemon-runs/tiny"
    out = submit(cfg, "train", host=fake.host, experiment="nightly", work_dir=tmp_path)
    assert out == {
        "pipeline_id": "p-1",
        "version_id": "v-1",
        "experiment_id": "e-1",
        "run_id": "r-1",
        "url": f"{fake.host}/#/runs/details/r-1",
    }
    (upload,) = fake.posts("/apis/v2beta1/pipelines/upload")
    assert upload["query"]["name"] == ["lemon-train"] and "multipart/form-data" in upload["content_type"]
    ir, platform = yaml.safe_load_all(upload["body"].split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n--", 1)[0])
    assert ir["pipelineInfo"]["name"] == "lemon-train" and "root" in ir and "platforms" in platform
    (exp,) = fake.posts("/apis/v2beta1/experiments")
    assert json.loads(exp["body"])["display_name"] == "nightly"
    (run,) = fake.posts("/apis/v2beta1/runs")
    body = json.loads(run["body"])
    assert body["experiment_id"] == "e-1"
    assert body["pipeline_version_reference"] == {"pipeline_id": "p-1", "pipeline_version_id": "v-1"}
    params = body["runtime_config"]["parameters"]
    assert json.loads(params["config_json"])["artifacts"] == "s3://lemon-runs/tiny"


def test_existing_pipeline_gets_a_new_version(kfp_api: Any, tmp_path: Path) -> None:
    fake = kfp_api(existing_pipeline=True)
    out = submit(load_config("local-tiny"), "train", host=fake.host, experiment="e", work_dir=tmp_path)
    assert not fake.posts("/apis/v2beta1/pipelines/upload")
    (version,) = fake.posts("/apis/v2beta1/pipelines/upload_version")
    assert version["query"]["pipelineid"] == ["p-1"] and out["version_id"] == "v-2"


def test_unreachable_host_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from lemon_core.cli_pipeline import pipeline_app

    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(
        pipeline_app, ["submit", "--host", "http://127.0.0.1:9", "--config", "local-tiny"]
    )
    assert result.exit_code == 2 and "submitting to http://127.0.0.1:9 failed" in result.output
