"""train: one GRPO update on an iteration's rollout records -> checkpoint.

With ``kubernetes.train_nodes > 1`` the update runs as a Kubeflow Trainer TrainJob that this step
creates and waits on (``lemon_core.trainjob.launch_train_step``); the checkpoint URI is the same.
"""

from typing import Any

from components.common import lightweight


def train(
    config_json: str,
    records_uris: list,
    iteration: int,
    checkpoint_uri: str,
    reference_uri: str,
    run_id: str,
) -> str:
    """Returns the URI of the checkpoint it wrote."""
    from lemon_core.stages import load_config, stage_train

    cfg = load_config(config_json)
    if cfg.kubernetes.train_nodes <= 1:
        return stage_train(cfg, records_uris, iteration, checkpoint_uri, reference_uri)
    from lemon_core.trainjob import launch_train_step

    return launch_train_step(cfg, config_json, records_uris, iteration, checkpoint_uri, reference_uri, run_id)


def make(image: str) -> Any:
    return lightweight(train, image)
