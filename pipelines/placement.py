"""Where tasks run on a cluster: GPU accelerator, node selectors, tolerations, S3 credentials from a
Secret, the model-cache PVC (kfp-kubernetes). For ``kfp.local`` runs (``local=True``) nothing is
applied: kfp.local ignores the Kubernetes platform config but would pass the pod's env (e.g.
``LEMON_CACHE_DIR=/cache``) to the laptop's subprocesses, so the local graph is the same DAG without it."""

from typing import Any

from kfp import kubernetes

from lemon_core.stages import KubernetesSettings


def with_storage(task: Any, k8s: KubernetesSettings, local: bool = False) -> Any:
    """Every task reads/writes S3 through lemon_core.storage: give it the credentials and the cache."""
    if local:
        return task
    if k8s.s3_secret:
        kubernetes.use_secret_as_env(
            task,
            secret_name=k8s.s3_secret,
            secret_key_to_env={key: env for env, key in k8s.s3_secret_keys.items()},
        )
    if k8s.cache_pvc:
        kubernetes.mount_pvc(task, pvc_name=k8s.cache_pvc, mount_path=k8s.cache_mount_path)
        task.set_env_variable("LEMON_CACHE_DIR", k8s.cache_mount_path)
    return task


def on_gpu(task: Any, k8s: KubernetesSettings, local: bool = False) -> Any:
    """A GPU step: accelerator type and count, node selectors, tolerations, then storage."""
    if local:
        return task
    if k8s.gpus_per_pod:
        task.set_accelerator_type(k8s.accelerator_type).set_accelerator_limit(k8s.gpus_per_pod)
    for label, value in k8s.node_selector.items():
        kubernetes.add_node_selector(task, label_key=label, label_value=value)
    for t in k8s.tolerations:
        kubernetes.add_toleration(
            task,
            key=t.get("key"),
            operator=t.get("operator", "Equal"),
            value=t.get("value"),
            effect=t.get("effect"),
        )
    return with_storage(task, k8s)
