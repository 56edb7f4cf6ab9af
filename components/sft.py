"""sft: the SFT warm-up on the prepared train split -> the SFT model (also the KL reference)."""

from typing import Any

from components.common import lightweight


def sft(config_json: str, manifest_uri: str) -> str:
    """Returns the URI of the SFT model it wrote (``lemon_core.stages.stage_sft``)."""
    from lemon_core.stages import load_config, stage_sft

    return stage_sft(load_config(config_json), manifest_uri)


def make(image: str) -> Any:
    return lightweight(sft, image)
