"""TrainJob body and create/wait logic against a loopback fake of the Kubernetes API server.

The fake implements just the custom-objects endpoints the Trainer client uses:
POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs and GET .../trainjobs/{name};
each GET advances the stored object through a scripted list of status conditions, as the Trainer
controller would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from lemon_core.trainjob import (
    Toleration,
    TrainJobConfig,
    TrainJobError,
    job_state,
    run_trainjob,
    trainjob_body,
    trainjob_name,
    validate_body,
)

PREFIX = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/"


def _cond(kind: str, message: str = "") -> dict[str, Any]:
    return {"conditions": [{"type": kind, "status": "True", "reason": kind, "message": message}]}


class FakeK8s:
    """Records requests; serves TrainJobs whose status follows ``script`` one GET at a time."""

    def __init__(self, script: list[dict[str, Any]], create_status: int = 201) -> None:
        self.script, self.create_status = script, create_status
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.gets = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(("POST", self.path, body))
                ns, _ = self.path[len(PREFIX) :].split("/", 1)
                key = (ns, body["metadata"]["name"])
                if fake.create_status != 201:
                    return self._send(fake.create_status, {"kind": "Status", "code": fake.create_status})
                if key in fake.objects:
                    return self._send(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})
                fake.objects[key] = body
                self._send(201, body)

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path, None))
                ns, _, name = self.path[len(PREFIX) :].split("/")
                obj = fake.objects.get((ns, name))
                if obj is None:
                    return self._send(404, {"kind": "Status", "code": 404})
                step = fake.script[min(fake.gets, len(fake.script) - 1)]
                fake.gets += 1
                if step.get("http") == 500:
                    return self._send(500, {"kind": "Status", "code": 500})
                self._send(200, {**obj, "status": step})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def api_client(self) -> client.ApiClient:
        conf = client.Configuration(host=f"http://127.0.0.1:{self.server.server_address[1]}")
        return client.ApiClient(conf)


@pytest.fixture
def fake_k8s() -> Iterator[Any]:
    fakes: list[FakeK8s] = []

    def start(script: list[dict[str, Any]], create_status: int = 201) -> FakeK8s:
        fake = FakeK8s(script, create_status)
        fake.thread.start()
        fakes.append(fake)
        return fake

    yield start
    for f in fakes:
        f.server.shutdown()
        f.server.server_close()


def _cfg(**kw: Any) -> TrainJobConfig:
    base: dict[str, Any] = dict(
        name="lemon-train-run1",
        namespace="ml",
        image="ghcr.io/x/lemon-gpu:1",
        args=["--records", "s3://b/r"],
        env={"LEMON_LOG": "info"},
        secret_env={"AWS_ACCESS_KEY_ID": ("s3-creds", "access_key")},
        num_nodes=3,
        gpus_per_node=2,
        node_selector={"gpu": "h100"},
        tolerations=[Toleration(key="nvidia.com/gpu")],
        cache_pvc="lemon-cache",
    )
    return TrainJobConfig(**{**base, **kw})


def test_body_shape() -> None:
    body = trainjob_body(_cfg())
    validate_body(body)
    assert body["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and body["kind"] == "TrainJob"
    spec = body["spec"]
    assert spec["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    t = spec["trainer"]
    assert t["numNodes"] == 3 and t["numProcPerNode"] == "auto"
    assert t["command"] == ["torchrun", "--no-python", "lemon", "train"] and t["args"] == ["--records", "s3://b/r"]
    assert t["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "2"}
    assert {
        "name": "AWS_ACCESS_KEY_ID",
        "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "access_key"}},
    } in t["env"]
    (override,) = spec["podTemplateOverrides"]
    assert override["targetJobs"] == [{"name": "node"}]
    assert override["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert override["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert override["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "lemon-cache"}
    assert (
        override["spec"]["containers"][0]["volumeMounts"][0]["name"] == override["spec"]["volumes"][0]["name"]
    )
    # The body must also be a valid TrainJob for the kubernetes client's serialiser (plain JSON types).
    assert json.loads(json.dumps(body)) == body


def test_body_without_overrides_and_bad_inputs() -> None:
    body = trainjob_body(_cfg(node_selector={}, tolerations=[], cache_pvc=None, gpus_per_node=0))
    assert "podTemplateOverrides" not in body["spec"]
    assert body["spec"]["trainer"]["resourcesPerNode"]["limits"] == {}
    with pytest.raises(ValueError, match="RFC 1035"):
        _cfg(name="Lemon_Train")
    broken = trainjob_body(_cfg())
    broken["spec"]["trainer"]["numNodes"] = 0
    broken["spec"]["trainer"]["env"].append({"name": "X"})
    with pytest.raises(TrainJobError, match="numNodes.*env entry"):
        validate_body(broken)


def test_trainjob_name_is_always_valid() -> None:
    for raw in ["Run_ID 42", "9abc", "x" * 200, "---"]:
        name = trainjob_name("lemon-train", raw)
        TrainJobConfig(name=name, image="i")  # validates
    assert trainjob_name("lemon-train", "Run_ID 42") == "lemon-train-run-id-42"


def test_job_state() -> None:
    assert job_state({}) == ("Running", "")
    assert job_state({"status": _cond("Complete")})[0] == "Complete"
    assert job_state(
        {
            "status": {
                "conditions": [
                    {"type": "Complete", "status": "False"},
                    {"type": "Failed", "status": "True", "message": "OOM"},
                ]
            }
        }
    ) == ("Failed", "OOM")


def test_create_and_wait_until_complete(fake_k8s: Any) -> None:
    fake = fake_k8s([{}, {"http": 500}, _cond("Created"), _cond("Complete", "done")])
    states: list[str] = []
    obj = run_trainjob(
        _cfg(),
        api_client=fake.api_client(),
        poll_s=0.01,
        timeout_s=10,
        on_state=lambda s, m: states.append(s),
    )
    assert obj["status"]["conditions"][0]["type"] == "Complete"
    method, path, body = fake.requests[0]
    assert (method, path) == ("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs")
    assert body == trainjob_body(_cfg())
    assert [m for m, _, _ in fake.requests[1:]] == ["GET"] * 4, (
        "a 500 is retried, then polling stops at Complete"
    )
    assert states == ["Running", "Complete"]


def test_retry_reattaches_to_existing_job(fake_k8s: Any) -> None:
    fake = fake_k8s([_cond("Complete")])
    run_trainjob(_cfg(), api_client=fake.api_client(), poll_s=0.01, timeout_s=10)
    run_trainjob(_cfg(), api_client=fake.api_client(), poll_s=0.01, timeout_s=10)
    assert [m for m, _, _ in fake.requests].count("POST") == 2 and len(fake.objects) == 1


def test_failed_job_raises_with_message(fake_k8s: Any) -> None:
    fake = fake_k8s([{}, _cond("Failed", "pod node-0 OOMKilled")])
    with pytest.raises(TrainJobError, match="OOMKilled"):
        run_trainjob(_cfg(), api_client=fake.api_client(), poll_s=0.01, timeout_s=10)


def test_timeout_and_forbidden(fake_k8s: Any) -> None:
    fake = fake_k8s([{}])
    with pytest.raises(TrainJobError, match="not finished after"):
        run_trainjob(_cfg(), api_client=fake.api_client(), poll_s=0.01, timeout_s=0.1)
    denied = fake_k8s([{}], create_status=403)
    with pytest.raises(TrainJobError, match="service account"):
        run_trainjob(_cfg(), api_client=denied.api_client(), poll_s=0.01, timeout_s=1)
