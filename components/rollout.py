"""rollout: one task shard -> rollout records with the current policy (GPU pod; ``lemon rollout``)."""

from typing import Any

from components.common import lightweight


def rollout(
    config_json: str, manifest_uri: str, shard_index: int, iteration: int, checkpoint_uri: str
) -> str:
    """Samples G specs per task, executes them on the pool, probes K counterfactual edits; returns the
    records URI."""
    from lemon_core.stages import load_config, stage_rollout

    return stage_rollout(load_config(config_json), manifest_uri, shard_index, iteration, checkpoint_uri)


def make(image: str) -> Any:
    return lightweight(rollout, image)
