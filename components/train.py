"""train: SFT warm-up (mode=sft) or one GRPO update on rollout records (mode=grpo) -> checkpoint.

With ``kubernetes.train_nodes > 1`` the GRPO update runs as a Kubeflow Trainer TrainJob
(torch-distributed runtime) that this step creates and waits on; the checkpoint URI is the same.
"""

from typing import Any

from components.common import lightweight


def train(
    config_json: str,
    mode: str,
    manifest_uri: str,
    records_uris: list,
    iteration: int,
    checkpoint_uri: str,
    reference_uri: str,
    run_id: str,
) -> str:
    """Returns the URI of the checkpoint it wrote."""
    import json

    from lemon_core import storage
    from lemon_core.stages import load_config, stage_sft, stage_train

    cfg = load_config(config_json)
    if mode == "sft":
        return stage_sft(cfg, manifest_uri)
    if mode != "grpo":
        raise ValueError(f"mode {mode!r}: use 'sft' or 'grpo'")
    k8s = cfg.kubernetes
    if k8s.train_nodes <= 1:
        return stage_train(cfg, records_uris, iteration, checkpoint_uri, reference_uri)
    from lemon_core.trainjob import Toleration, TrainJobConfig, run_trainjob, trainjob_name

    args = [
        "--config",
        config_json,
        "--iteration",
        str(iteration),
        "--checkpoint",
        checkpoint_uri,
        "--reference",
        reference_uri,
        *[a for u in records_uris for a in ("--records", u)],
    ]
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
        secret_env={env: (k8s.s3_secret, key) for env, key in k8s.s3_secret_keys.items()}
        if k8s.s3_secret
        else {},
        labels={"lemon/run": cfg.name[:63]},
    )
    run_trainjob(
        job, timeout_s=k8s.trainjob_timeout_s, on_state=lambda s, m: print(f"TrainJob {job.name}: {s} {m}")
    )
    uri = storage.join(cfg.artifacts, f"iter-{iteration:03d}", "checkpoint")
    print(json.dumps({"checkpoint": uri}))
    return uri


def make(image: str) -> Any:
    return lightweight(train, image)
