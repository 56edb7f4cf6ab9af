"""Helm chart charts/lemon: rendered offline by Helm's own Go engine, every object schema-validated.

Rendering uses helm-python-sdk (libhelm_c, the Helm v4 SDK behind a C ABI, so no helm binary is
needed); each rendered manifest is validated with kubernetes-validate in strict mode (unknown fields are
errors) against Kubernetes 1.34 and the newest version it ships. ServiceMonitor is a CRD that
kubernetes-validate has no schema for, so it is checked against SERVICE_MONITOR_SCHEMA below, a subset
of monitoring.coreos.com/v1 covering every field the chart writes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from lemon_core.pool import CapacityPool

CHART = Path(__file__).resolve().parents[1] / "charts" / "lemon"
RELEASE, NAMESPACE = "demo", "ml"
KUBE_VERSIONS = ("1.34.0", kubernetes_validate.utils.latest_version())
VALUES_FILES = {
    "default": None,
    "all-on": CHART / "ci" / "all-on-values.yaml",
    "cpu": CHART / "ci" / "cpu-values.yaml",
}

# What each values file must render to: (kind, name), order-free.
EXPECTED_OBJECTS = {
    "default": {
        ("ServiceAccount", "demo-lemon"),
        ("ConfigMap", "demo-lemon-pool"),
        ("Service", "demo-lemon"),
        ("Deployment", "demo-lemon"),
    },
    "cpu": {
        ("ServiceAccount", "demo-lemon"),
        ("ConfigMap", "demo-lemon-pool"),
        ("Service", "demo-lemon"),
        ("Deployment", "demo-lemon"),
    },
    "all-on": {
        ("ServiceAccount", "demo-lemon"),
        ("ConfigMap", "demo-lemon-pool"),
        ("Service", "demo-lemon"),
        ("Deployment", "demo-lemon"),
        ("HorizontalPodAutoscaler", "demo-lemon"),
        ("PodDisruptionBudget", "demo-lemon"),
        ("ServiceMonitor", "demo-lemon"),
        ("ServiceMonitor", "demo-lemon-vllm"),
        *{(kind, f"demo-lemon-vllm-{server}")
          for kind in ("Deployment", "Service")
          for server in ("orchestrator", "small", "medium", "large")},
    },
}

_DURATION = {"type": "string", "pattern": r"^[0-9]+(ms|s|m|h)$"}
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["matchLabels"],
                    "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                   "additionalProperties": {"type": "string"}}},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}},
                                   "any": {"type": "boolean"}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                        },
                    },
                },
            },
        },
    },
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys: PyYAML keeps the last one silently, while the
    API server may reject the object or keep another, so a duplicated label would go unnoticed."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
    dupes = sorted({str(k) for k in keys if keys.count(k) > 1})
    if dupes:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {dupes}", node.start_mark)
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


# --- helpers ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _values(name: str) -> dict[str, Any]:
    path = VALUES_FILES[name]
    return {} if path is None else yaml.safe_load(path.read_text())


def _render(chart: helm.Chart, values: dict[str, Any] | None = None, release: str = RELEASE) -> list[dict]:
    """Render and parse every manifest (NOTES.txt is text, not a manifest)."""
    rendered = chart.render(values or {}, name=release, namespace=NAMESPACE, is_install=True)
    docs: list[dict] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d]
    return docs


def _notes(chart: helm.Chart, values: dict[str, Any] | None = None) -> str:
    rendered = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def _find(docs: list[dict], kind: str, name: str) -> dict:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, got {len(matches)}"
    return matches[0]


def _validate(doc: dict, version: str) -> None:
    if doc["kind"] == "ServiceMonitor":
        jsonschema.Draft202012Validator(SERVICE_MONITOR_SCHEMA).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


def _pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs if d["kind"] == "Deployment"]


def _args(container: dict) -> dict[str, str]:
    """`--flag=value` args as a dict (the chart always writes the = form)."""
    return dict(a[2:].split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)


# --- lint, render, validate ---------------------------------------------------------------------
@pytest.mark.parametrize("values_name", list(VALUES_FILES))
def test_strict_lint_is_clean(values_name: str) -> None:
    report = helm.lint(CHART, _values(values_name), strict=True, kube_version=f"v{KUBE_VERSIONS[0]}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 = warning, 3 = error
    assert report["errors"] == [] and problems == [], (report["errors"], problems)


@pytest.mark.parametrize("values_name", list(VALUES_FILES))
def test_renders_expected_objects_and_each_validates(chart: helm.Chart, values_name: str) -> None:
    values = _values(values_name)
    chart.validate_schema(values)
    docs = _render(chart, values)
    objects = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(objects) == len(set(objects)), f"duplicate objects: {objects}"
    assert set(objects) == EXPECTED_OBJECTS[values_name]
    for doc in docs:
        for version in KUBE_VERSIONS:
            _validate(doc, version)


def test_strict_validation_catches_a_wrong_field(chart: helm.Chart) -> None:
    """Guards the test above against passing vacuously: a misspelt field must fail validation."""
    deployment = copy.deepcopy(_find(_render(chart), "Deployment", "demo-lemon"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)
    monitor = copy.deepcopy(_find(_render(chart, _values("all-on")), "ServiceMonitor", "demo-lemon"))
    monitor["spec"]["endpoints"][0]["interval"] = "thirty seconds"
    with pytest.raises(jsonschema.ValidationError):
        _validate(monitor, KUBE_VERSIONS[0])


def test_long_release_name_keeps_every_name_a_dns_label(chart: helm.Chart) -> None:
    release = "a-very-long-release-name-that-is-close-to-the-limit"
    docs = _render(chart, _values("all-on"), release=release)
    for doc in docs:
        name = doc["metadata"]["name"]
        assert len(name) <= 63 and name[0].isalpha() and not name.endswith("-"), name
        for version in KUBE_VERSIONS:
            _validate(doc, version)


# --- security -----------------------------------------------------------------------------------
@pytest.mark.parametrize("values_name", list(VALUES_FILES))
def test_every_container_is_locked_down(chart: helm.Chart, values_name: str) -> None:
    pods = _pod_specs(_render(chart, _values(values_name)))
    assert pods
    for name, pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"] + pod.get("initContainers", []):
            where = f"{name}/{container['name']}"
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc.get("privileged", False) is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            # A read-only root fs needs a writable /tmp.
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts, where
            assert "resources" in container and container["resources"].get("limits"), where


def test_credentials_only_come_from_secret_references(chart: helm.Chart) -> None:
    docs = _render(chart, _values("all-on"))
    with_s3: list[str] = []
    for name, pod in _pod_specs(docs):
        for container in pod["containers"] + pod.get("initContainers", []):
            env = {e["name"]: e for e in container.get("env", [])}
            if container["name"] == "vllm":  # least privilege: vLLM reads local weights only
                assert not any(k.startswith(("AWS_", "LEMON_S3")) for k in env), name
                continue
            with_s3.append(f"{name}/{container['name']}")
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                assert key in env, f"{name}/{container['name']} lacks {key}"
                assert "value" not in env[key]
                assert env[key]["valueFrom"]["secretKeyRef"]["name"] == "lemon-s3"
            assert env["LEMON_S3_ENDPOINT_URL"]["value"] == "http://minio.minio.svc:9000"
    assert sorted(with_s3) == ["demo-lemon-vllm-large/model-sync", "demo-lemon-vllm-orchestrator/model-sync",
                               "demo-lemon-vllm-small/model-sync", "demo-lemon/lemon"]
    # Defaults carry no credentials at all (workload identity or a later secret).
    default_env = _pod_specs(_render(chart))[0][1]["containers"][0]["env"]
    assert not any(e["name"].startswith("AWS_") for e in default_env)


def test_auth_token_secret_is_mounted_where_serve_reads_it(chart: helm.Chart) -> None:
    pod = _find(_render(chart), "Deployment", "demo-lemon")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["lemon"] and container["args"][0] == "serve"
    args = _args(container)
    assert args["auth-token-file"] == "/etc/lemon/auth/tokens"
    assert args["pool"] == "/etc/lemon/pool.yaml" and args["port"] == "8080" and args["host"] == "0.0.0.0"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    auth_volume = volumes[mounts["/etc/lemon/auth"]["name"]]
    assert auth_volume["secret"]["secretName"] == "lemon-auth"
    assert auth_volume["secret"]["items"] == [{"key": "tokens", "path": "tokens"}]
    assert mounts["/etc/lemon/auth"]["readOnly"] is True
    pool_mount = mounts["/etc/lemon/pool.yaml"]
    assert volumes[pool_mount["name"]]["configMap"]["name"] == "demo-lemon-pool"
    assert pool_mount["subPath"] == "pool.yaml"


# --- service behaviour --------------------------------------------------------------------------
def test_probes_hit_healthz_and_readyz(chart: helm.Chart) -> None:
    container = _find(_render(chart), "Deployment", "demo-lemon")["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_shutdown_drain_fits_the_termination_grace_period(chart: helm.Chart,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #11: shutdown took ~70 s against the pod's 30 s; the drain is configured with the grace period
    for values, grace, drain in (({}, 30, "25"),
                                 ({"serve": {"terminationGracePeriodSeconds": 120, "shutdownGraceSeconds": 100}},
                                  120, "100")):
        pod = _find(_render(chart, values), "Deployment", "demo-lemon")["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert pod["terminationGracePeriodSeconds"] == grace
        assert env["LEMON_SHUTDOWN_GRACE_S"] == drain
    from lemon_core.serve import load_settings

    monkeypatch.setenv("LEMON_SHUTDOWN_GRACE_S", drain)
    assert load_settings().shutdown_grace_s == 100.0  # `lemon serve` reads the variable the chart sets


@pytest.mark.parametrize("values_name", list(VALUES_FILES))
def test_pool_configmap_is_a_valid_lemon_pool(chart: helm.Chart, values_name: str) -> None:
    """The ConfigMap must load with lemon's own pool model, and every in-chart URL must hit a Service."""
    values = _values(values_name)
    docs = _render(chart, values)
    pool_file = _find(docs, "ConfigMap", "demo-lemon-pool")["data"]["pool.yaml"]
    pool = CapacityPool.model_validate(yaml.safe_load(pool_file))
    expected = values.get("pool", chart.values["pool"])["levels"]
    assert pool.level_names == [lv["name"] for lv in expected]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for level in pool.levels:
        if level.backend != "openai":
            continue
        assert level.base_url == f"http://demo-lemon-vllm-{level.name}:8000/v1"
        if values_name == "all-on":
            service = services[f"demo-lemon-vllm-{level.name}"]
            assert service["spec"]["ports"][0]["port"] == 8000
            vllm = _find(docs, "Deployment", f"demo-lemon-vllm-{level.name}")["spec"]["template"]
            assert service["spec"]["selector"].items() <= vllm["metadata"]["labels"].items()
            assert _args(vllm["spec"]["containers"][0])["served-model-name"] == level.model


def test_explicit_base_url_is_kept(chart: helm.Chart) -> None:
    level = {"name": "remote", "backend": "openai", "model": "gpt-x", "base_url": "https://llm.example/v1",
             "price_in_per_1m": 1, "price_out_per_1m": 2}
    docs = _render(chart, {"pool": {"levels": [level]}})
    data = yaml.safe_load(_find(docs, "ConfigMap", "demo-lemon-pool")["data"]["pool.yaml"])
    assert data["levels"][0]["base_url"] == "https://llm.example/v1"


def test_pool_change_rolls_the_pods(chart: helm.Chart) -> None:
    def checksum(values: dict) -> str:
        deployment = _find(_render(chart, values), "Deployment", "demo-lemon")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/pool"]

    cpu = _values("cpu")
    cheaper = copy.deepcopy(cpu)
    cheaper["pool"]["levels"][0]["price_in_per_1m"] = 0.01
    assert checksum(cpu) != checksum(cheaper)
    assert checksum(cpu) == checksum(copy.deepcopy(cpu))


def test_services_and_monitors_select_the_right_pods(chart: helm.Chart) -> None:
    docs = _render(chart, _values("all-on"))
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for d in docs if d["kind"] == "Deployment"}

    def selected(selector: dict[str, str], labels_by_name: dict[str, dict]) -> set[str]:
        return {n for n, labels in labels_by_name.items() if selector.items() <= labels.items()}

    for svc in (d for d in docs if d["kind"] == "Service"):
        assert selected(svc["spec"]["selector"], pods) == {svc["metadata"]["name"]}
    services = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "Service"}
    serve_monitor = _find(docs, "ServiceMonitor", "demo-lemon")
    assert selected(serve_monitor["spec"]["selector"]["matchLabels"], services) == {"demo-lemon"}
    assert serve_monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert serve_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    vllm_monitor = _find(docs, "ServiceMonitor", "demo-lemon-vllm")
    assert selected(vllm_monitor["spec"]["selector"]["matchLabels"], services) == {
        f"demo-lemon-vllm-{s}" for s in ("orchestrator", "small", "medium", "large")}


def test_hpa_owns_replicas_and_pdb_guards_the_server(chart: helm.Chart) -> None:
    docs = _render(chart, _values("all-on"))
    assert "replicas" not in _find(docs, "Deployment", "demo-lemon")["spec"]
    hpa = _find(docs, "HorizontalPodAutoscaler", "demo-lemon")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo-lemon"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 6)
    assert {m["resource"]["name"]: m["resource"]["target"]["averageUtilization"] for m in hpa["metrics"]} == {
        "cpu": 60, "memory": 80}
    pdb = _find(docs, "PodDisruptionBudget", "demo-lemon")["spec"]
    assert pdb["minAvailable"] == 1
    assert pdb["selector"]["matchLabels"]["app.kubernetes.io/component"] == "server"
    assert _find(_render(chart), "Deployment", "demo-lemon")["spec"]["replicas"] == 2
    pct = _find(_render(chart, {"podDisruptionBudget": {"enabled": True, "minAvailable": None,
                                                         "maxUnavailable": "25%"}}),
                "PodDisruptionBudget", "demo-lemon")["spec"]
    assert pct == {"maxUnavailable": "25%", "selector": pdb["selector"]}


# --- vLLM servers -------------------------------------------------------------------------------
def test_vllm_from_s3_syncs_weights_then_serves_them(chart: helm.Chart) -> None:
    docs = _render(chart, _values("all-on"))
    pod = _find(docs, "Deployment", "demo-lemon-vllm-orchestrator")["spec"]["template"]["spec"]
    (sync,) = pod["initContainers"]
    uri = "s3://lemon-artifacts/runs/2026-11-01/publish/checkpoint/"
    assert sync["command"] == ["python", "-m", "lemon_core.storage", "download", uri, "/models/orchestrator"]
    vllm = pod["containers"][0]
    assert vllm["command"] == ["vllm", "serve"] and vllm["args"][0] == "/models/orchestrator"
    assert {"--max-model-len=8192", "--gpu-memory-utilization=0.90"} <= set(vllm["args"])
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert {v["name"]: v for v in pod["volumes"]}["shm"]["emptyDir"]["medium"] == "Memory"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # The lemon service talks to it by served name and URL.
    serve = _find(docs, "Deployment", "demo-lemon")["spec"]["template"]["spec"]["containers"][0]
    assert _args(serve)["orchestrator"] == "lemon-orchestrator"
    env = {e["name"]: e.get("value") for e in serve["env"]}
    assert env["LEMON_ORCHESTRATOR_BASE_URL"] == "http://demo-lemon-vllm-orchestrator:8000/v1"


def test_vllm_from_pvc_and_tensor_parallel(chart: helm.Chart) -> None:
    docs = _render(chart, _values("all-on"))
    medium = _find(docs, "Deployment", "demo-lemon-vllm-medium")["spec"]["template"]["spec"]
    assert "initContainers" not in medium
    models = {v["name"]: v for v in medium["volumes"]}["models"]
    assert models["persistentVolumeClaim"] == {"claimName": "lemon-models", "readOnly": True}
    assert medium["containers"][0]["args"][0] == "/models/Qwen2.5-14B-Instruct"
    large = _find(docs, "Deployment", "demo-lemon-vllm-large")["spec"]["template"]["spec"]
    assert "--tensor-parallel-size=2" in large["containers"][0]["args"]
    assert large["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert large["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_cpu_values_pull_models_before_serving(chart: helm.Chart) -> None:
    pod = _find(_render(chart, _values("cpu")), "Deployment", "demo-lemon")["spec"]["template"]["spec"]
    (pull,) = pod["initContainers"]
    assert pull["command"] == ["lemon", "models", "pull"]
    assert {m["mountPath"] for m in pull["volumeMounts"]} >= {"/var/cache/lemon"}
    assert _args(pod["containers"][0])["orchestrator"] == "qwen2.5-coder-0.5b-instruct"


def test_notes_warn_about_levels_nothing_serves(chart: helm.Chart) -> None:
    assert "vllm.servers.small.enabled is false" in _notes(chart)
    assert "WARNING" not in _notes(chart, _values("all-on"))
    assert "WARNING" not in _notes(chart, _values("cpu"))


# --- rejected values ----------------------------------------------------------------------------
_LEVEL = {"name": "small", "backend": "openai", "model": "m", "price_in_per_1m": 0.1, "price_out_per_1m": 0.1}

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("replicaCount string", {"replicaCount": "two"}, "/replicaCount"),
    ("replicaCount zero", {"replicaCount": 0}, "/replicaCount"),
    ("negative price", {"pool": {"levels": [_LEVEL | {"price_out_per_1m": -0.5}]}}, "price_out_per_1m"),
    ("level name", {"pool": {"levels": [_LEVEL | {"name": "Small_1"}]}}, "/pool/levels/0/name"),
    ("unknown level key", {"pool": {"levels": [_LEVEL | {"prize": 1}]}}, "prize"),
    ("empty pool", {"pool": {"levels": []}}, "/pool/levels"),
    ("bad backend", {"pool": {"levels": [_LEVEL | {"backend": "ollama"}]}}, "/pool/levels/0/backend"),
    ("tag not a string", {"image": {"tag": 1.2}}, "/image/tag"),
    ("tag latest", {"image": {"tag": "latest"}}, "/image/tag"),
    ("bad digest", {"image": {"digest": "sha256:abc"}}, "/image/digest"),
    ("unknown top-level key", {"replicas": 3}, "replicas"),
    ("secret in plain env", {"serve": {"env": {"AWS_SECRET_ACCESS_KEY": "x"}}}, "AWS_SECRET_ACCESS_KEY"),
    ("root allowed", {"securityContext": {"runAsNonRoot": False}}, "/securityContext/runAsNonRoot"),
    ("writable root fs", {"securityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRootFilesystem"),
    ("hpa target", {"autoscaling": {"targetCPUUtilizationPercentage": 150}}, "targetCPUUtilization"),
    ("pdb both", {"podDisruptionBudget": {"enabled": True, "maxUnavailable": 1}}, "/podDisruptionBudget"),
    ("s3 uri", {"vllm": {"servers": {"small": {"s3Uri": "https://bucket/x"}}}}, "s3Uri"),
    ("server name", {"vllm": {"servers": {"Big_GPU": {"enabled": False, "servedModelName": "m",
                                                      "source": "s3", "gpus": 1}}}}, "Big_GPU"),
    ("pvc without claim", {"vllm": {"servers": {"small": {"enabled": True, "source": "pvc"}}}}, "pvc"),
    ("gpus zero", {"vllm": {"servers": {"large": {"gpus": 0}}}}, "/vllm/servers/large/gpus"),
    ("monitor interval", {"serviceMonitor": {"interval": "30 seconds"}}, "/serviceMonitor/interval"),
]


@pytest.mark.parametrize(("values", "field"), [(v, f) for _, v, f in BAD_VALUES],
                         ids=[name for name, _, _ in BAD_VALUES])
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict, field: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=field):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError, match=field):  # install/template validate too
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    report = helm.lint(CHART, values, strict=True)
    assert any(field in m["error"] for m in report["messages"] if m["severity"] == 3)


CROSS_FIELD: list[tuple[str, dict[str, Any], str]] = [
    ("served name mismatch", {"vllm": {"servers": {"small": {"enabled": True, "servedModelName": "other"}}}},
     r"vllm.servers.small.servedModelName"),
    ("duplicate level", {"pool": {"levels": [_LEVEL, _LEVEL]}}, r"level name \"small\" appears twice"),
    ("hpa min above max", {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
     r"autoscaling.minReplicas \(5\) is above"),
    ("drain longer than the pod may live", {"serve": {"terminationGracePeriodSeconds": 30, "shutdownGraceSeconds": 28}},
     r"serve.shutdownGraceSeconds \(28\) must be at least 3 below serve.terminationGracePeriodSeconds \(30\)"),
]


@pytest.mark.parametrize(("values", "message"), [(v, m) for _, v, m in CROSS_FIELD],
                         ids=[name for name, _, _ in CROSS_FIELD])
def test_cross_field_mistakes_fail_with_the_fix(chart: helm.Chart, values: dict, message: str) -> None:
    chart.validate_schema(values)  # each value is fine alone ...
    with pytest.raises(helm.HelmRenderError, match=message):  # ... the combination is not
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
