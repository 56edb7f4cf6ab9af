"""publish: copy a checkpoint's model to the serving location and write its model card."""

from typing import Any

from components.common import lightweight


def publish(config_json: str, checkpoint_uri: str, summary_uris: list) -> str:
    """Returns the serving URI. The pipeline only runs this when the evaluation gate said so."""
    from lemon_core.stages import load_config, stage_publish

    return stage_publish(load_config(config_json), checkpoint_uri, summary_uris)


def make(image: str) -> Any:
    return lightweight(publish, image)
