"""prepare_dataset: benchmark files -> seeded train/val/test task shards (``lemon prepare``)."""

from typing import Any, NamedTuple

from components.common import lightweight


def prepare_dataset(config_json: str, run_id: str) -> NamedTuple(
    "PrepareOutputs", [("manifest_uri", str), ("train_shards", list)]
):
    """Writes shards + manifest under <artifacts>/<run id>/tasks (the config's ``run_id``, else the Kubeflow
    run id); the shard list feeds the rollout ParallelFor."""
    from collections import namedtuple

    from lemon_core.stages import load_config, stage_prepare

    manifest_uri, shards = stage_prepare(load_config(config_json), run_id)
    return namedtuple("PrepareOutputs", ["manifest_uri", "train_shards"])(manifest_uri, shards)


def make(image: str) -> Any:
    return lightweight(prepare_dataset, image)
