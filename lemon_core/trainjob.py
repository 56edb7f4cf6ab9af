"""Multi-node training through a Kubeflow Trainer ``TrainJob`` (trainer.kubeflow.org/v1alpha1).

When a pipeline's ``train_nodes > 1`` the train component does not train in its own pod: it creates
a TrainJob that references the ``torch-distributed`` ClusterTrainingRuntime, which starts
``numNodes`` pods under torchrun, each running ``lemon train ...`` with the same arguments, and then
waits for the TrainJob's ``Complete`` or ``Failed`` condition. The checkpoint lands at the URI the
arguments name (through ``lemon_core.storage``), so the component only passes that URI on.

Body shape (Kubeflow Trainer v2, ``pkg/apis/trainer/v1alpha1/trainjob_types.go``): ``spec.runtimeRef``
(name, apiGroup, kind), ``spec.trainer`` (image, command, args, env, numNodes, numProcPerNode,
resourcesPerNode) and ``spec.podTemplateOverrides`` targeting the runtime's ``node`` job for node
selectors, tolerations and the cache PVC. (Trainer releases after v2.1 move these overrides to
``spec.runtimePatches``; set ``overrides_field`` accordingly.)

Creation is idempotent: if a TrainJob of that name already exists (a retried pipeline step), we
wait on it instead of failing, so a KFP retry re-attaches rather than starting a second run.
Waiting polls ``GET`` on the object (robust to dropped watch connections) with a deadline.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lemon_core.errors import LemonError

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
KIND = "TrainJob"
NODE_CONTAINER = "node"  # the trainer job/container name in the torch-distributed runtime
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class TrainJobError(LemonError):
    """The TrainJob failed, timed out, or could not be created; the message says which and why."""


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class TrainJobConfig(BaseModel):
    """Everything that shapes the TrainJob; all of it comes from the pipeline's parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="TrainJob name: RFC 1035 DNS label, at most 63 characters")
    namespace: str = "kubeflow"
    image: str
    # The torch-distributed runtime sets PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK / PET_MASTER_*,
    # which torchrun reads; the command itself must therefore be torchrun.
    command: list[str] = Field(default_factory=lambda: ["torchrun", "--no-python", "lemon", "train"])
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, tuple[str, str]] = Field(
        default_factory=dict, description="env name -> (secret name, key), e.g. S3 credentials"
    )
    num_nodes: int = Field(default=2, ge=1)
    num_proc_per_node: int | Literal["auto"] = "auto"
    gpus_per_node: int = Field(default=1, ge=0)
    gpu_resource: str = "nvidia.com/gpu"
    cpu: str | None = None
    memory: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    cache_pvc: str | None = Field(default=None, description="PVC mounted at cache_mount_path (model cache)")
    cache_mount_path: str = "/cache"
    runtime_name: str = "torch-distributed"
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = "ClusterTrainingRuntime"
    overrides_field: Literal["podTemplateOverrides", "none"] = "podTemplateOverrides"
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if len(name) > 63 or not DNS_LABEL.match(name):
            raise ValueError(
                f"TrainJob name {name!r} must be a lowercase RFC 1035 label (a-z, 0-9, '-', "
                "starting with a letter, at most 63 chars); use trainjob_name() to derive one"
            )
        return name


def trainjob_name(prefix: str, unique: str) -> str:
    """A valid TrainJob name from free text (e.g. pipeline run id): lowercase, dashes, <= 63 chars."""
    clean = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{unique}".lower()).strip("-")
    clean = re.sub(r"^[^a-z]+", "", clean) or "lemon-train"
    return clean[:63].rstrip("-")


def trainjob_body(cfg: TrainJobConfig) -> dict[str, Any]:
    """The TrainJob object to POST."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(cfg.env.items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": s, "key": key}}}
        for k, (s, key) in sorted(cfg.secret_env.items())
    ]
    limits: dict[str, str] = {}
    if cfg.gpus_per_node:
        limits[cfg.gpu_resource] = str(cfg.gpus_per_node)
    if cfg.cpu:
        limits["cpu"] = cfg.cpu
    if cfg.memory:
        limits["memory"] = cfg.memory
    trainer: dict[str, Any] = {
        "image": cfg.image,
        "command": list(cfg.command),
        "args": list(cfg.args),
        "env": env,
        "numNodes": cfg.num_nodes,
        "numProcPerNode": cfg.num_proc_per_node,
        "resourcesPerNode": {"limits": limits, "requests": dict(limits)},
    }
    spec: dict[str, Any] = {
        "runtimeRef": {"name": cfg.runtime_name, "apiGroup": GROUP, "kind": cfg.runtime_kind},
        "trainer": trainer,
    }
    pod_spec: dict[str, Any] = {}
    if cfg.node_selector:
        pod_spec["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        pod_spec["tolerations"] = [t.model_dump(exclude_none=True) for t in cfg.tolerations]
    if cfg.cache_pvc:
        pod_spec["volumes"] = [{"name": "lemon-cache", "persistentVolumeClaim": {"claimName": cfg.cache_pvc}}]
        pod_spec["containers"] = [
            {
                "name": NODE_CONTAINER,
                "volumeMounts": [{"name": "lemon-cache", "mountPath": cfg.cache_mount_path}],
            }
        ]
    if pod_spec and cfg.overrides_field == "podTemplateOverrides":
        spec["podTemplateOverrides"] = [{"targetJobs": [{"name": NODE_CONTAINER}], "spec": pod_spec}]
    labels = {"app.kubernetes.io/part-of": "lemon", **cfg.labels}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": cfg.name, "namespace": cfg.namespace, "labels": labels},
        "spec": spec,
    }


def validate_body(body: dict[str, Any]) -> None:
    """Check the shape the Trainer's CRD demands, so a bad body fails here and not in the cluster."""
    problems = []
    if body.get("apiVersion") != f"{GROUP}/{VERSION}" or body.get("kind") != KIND:
        problems.append(f"apiVersion/kind must be {GROUP}/{VERSION} {KIND}")
    name = body.get("metadata", {}).get("name", "")
    if not (isinstance(name, str) and DNS_LABEL.match(name) and len(name) <= 63):
        problems.append(f"metadata.name {name!r} is not an RFC 1035 label")
    spec = body.get("spec", {})
    if not spec.get("runtimeRef", {}).get("name"):
        problems.append("spec.runtimeRef.name is required")
    trainer = spec.get("trainer", {})
    if not isinstance(trainer.get("numNodes"), int) or trainer["numNodes"] < 1:
        problems.append("spec.trainer.numNodes must be an int >= 1")
    for key in ("command", "args"):
        if not isinstance(trainer.get(key, []), list) or not all(
            isinstance(a, str) for a in trainer.get(key, [])
        ):
            problems.append(f"spec.trainer.{key} must be a list of strings")
    for e in trainer.get("env", []):
        if "name" not in e or ("value" in e) == ("valueFrom" in e):
            problems.append(f"spec.trainer.env entry {e} needs a name and exactly one of value/valueFrom")
    for res in trainer.get("resourcesPerNode", {}).values():
        if not all(isinstance(v, str) for v in res.values()):
            problems.append("spec.trainer.resourcesPerNode quantities must be strings")
    for o in spec.get("podTemplateOverrides", []):
        if not o.get("targetJobs") or not all("name" in t for t in o["targetJobs"]):
            problems.append("each podTemplateOverrides entry needs targetJobs with names")
    if problems:
        raise TrainJobError("invalid TrainJob body: " + "; ".join(problems))


def job_state(obj: dict[str, Any]) -> tuple[str, str]:
    """("Complete" | "Failed" | "Suspended" | "Running", message) from a TrainJob's status conditions."""
    conditions = obj.get("status", {}).get("conditions", []) or []
    for kind in ("Failed", "Complete"):
        for c in conditions:
            if c.get("type") == kind and c.get("status") == "True":
                return kind, c.get("message") or c.get("reason") or ""
    for c in conditions:
        if c.get("type") == "Suspended" and c.get("status") == "True":
            return "Suspended", c.get("message") or ""
    return "Running", ""


def _custom_api(api_client: Any | None) -> Any:
    from kubernetes import client, config

    if api_client is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api_client = client.ApiClient()
    return client.CustomObjectsApi(api_client)


def create_trainjob(body: dict[str, Any], api_client: Any | None = None) -> dict[str, Any]:
    """POST the TrainJob; an existing one of the same name is returned instead (idempotent retry)."""
    from kubernetes.client.exceptions import ApiException

    validate_body(body)
    api = _custom_api(api_client)
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        return api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    except ApiException as e:
        if e.status == 409:
            return api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        hint = {
            403: "the pipeline's service account needs create/get on trainjobs.trainer.kubeflow.org",
            404: "is Kubeflow Trainer installed (CRD trainjobs.trainer.kubeflow.org)?",
        }.get(e.status, "")
        raise TrainJobError(
            f"creating TrainJob {ns}/{name} failed: HTTP {e.status} {e.reason}. {hint}"
        ) from e


def wait_trainjob(
    name: str,
    namespace: str,
    *,
    api_client: Any | None = None,
    timeout_s: float = 24 * 3600,
    poll_s: float = 10.0,
    on_state: Callable[[str, str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll until the TrainJob is Complete (returns the object) or Failed / timed out (raises)."""
    from kubernetes.client.exceptions import ApiException

    api = _custom_api(api_client)
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                raise TrainJobError(
                    f"TrainJob {namespace}/{name} disappeared (deleted?) while waiting"
                ) from e
            if e.status < 500:
                raise TrainJobError(f"reading TrainJob {namespace}/{name}: HTTP {e.status} {e.reason}") from e
            obj = None  # transient API server error: keep polling until the deadline
        if obj is not None:
            state, message = job_state(obj)
            if on_state and state != last:
                on_state(state, message)
            last = state
            if state == "Complete":
                return obj
            if state == "Failed":
                raise TrainJobError(
                    f"TrainJob {namespace}/{name} failed: {message or 'no message'}; "
                    f"see `kubectl logs -n {namespace} -l jobset.sigs.k8s.io/jobset-name={name}`"
                )
        if time.monotonic() >= deadline:
            raise TrainJobError(
                f"TrainJob {namespace}/{name} not finished after {timeout_s:.0f} s (last state "
                f"{last}); raise timeout_s or check the cluster's GPU capacity"
            )
        sleep(poll_s)


def run_trainjob(
    cfg: TrainJobConfig,
    *,
    api_client: Any | None = None,
    timeout_s: float = 24 * 3600,
    poll_s: float = 10.0,
    on_state: Callable[[str, str], None] | None = None,
) -> dict[str, Any]:
    """Create (or re-attach to) the TrainJob and wait for it to finish."""
    body = trainjob_body(cfg)
    create_trainjob(body, api_client)
    return wait_trainjob(
        cfg.name, cfg.namespace, api_client=api_client, timeout_s=timeout_s, poll_s=poll_s, on_state=on_state
    )


def launch_train_step(
    cfg: Any, config_json: str, records_uris: list[str], iteration: int, checkpoint_uri: str,
    reference_uri: str, run_id: str, api_client: Any | None = None,
) -> str:
    """Run one GRPO update (``lemon train-step``) as a TrainJob of ``cfg.kubernetes.train_nodes`` nodes and
    wait for it; returns the checkpoint URI the job writes (``stages.stage_train``'s)."""
    from lemon_core import storage
    from lemon_core.stages import root_of_records

    k8s = cfg.kubernetes
    args = ["--config", config_json, "--iteration", str(iteration), "--checkpoint", checkpoint_uri,
            "--reference", reference_uri, *[a for u in records_uris for a in ("--records", u)]]
    job = TrainJobConfig(
        name=trainjob_name(f"lemon-{iteration}", run_id),
        namespace=k8s.namespace,
        image=k8s.gpu_image,
        command=["torchrun", "--no-python", "lemon", "train-step"],  # torchrun reads the PET_* env
        args=args,
        num_nodes=k8s.train_nodes,
        gpus_per_node=k8s.gpus_per_pod,
        gpu_resource=k8s.accelerator_type,
        node_selector=k8s.node_selector,
        tolerations=[Toleration(**t) for t in k8s.tolerations],
        cache_pvc=k8s.cache_pvc,
        cache_mount_path=k8s.cache_mount_path,
        secret_env={env: (k8s.s3_secret, key) for env, key in k8s.s3_secret_keys.items()} if k8s.s3_secret else {},
        labels={"lemon/run": cfg.name[:63]},
    )
    run_trainjob(job, timeout_s=k8s.trainjob_timeout_s, api_client=api_client,
                 on_state=lambda s, m: print(f"TrainJob {job.name}: {s} {m}"))
    return storage.join(root_of_records(records_uris[0]), f"iter-{iteration:03d}", "checkpoint")
