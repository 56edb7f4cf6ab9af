"""Runs never share artifacts: each pipeline run writes under its own root, and the shared download
cache (LEMON_CACHE_DIR, the PVC on a cluster) is keyed by content, so a retrain with the same config on
the same cache cannot load the previous run's checkpoint. Real S3 on loopback (moto's server mode)."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from lemon_core import storage
from lemon_core.stages import load_config, local_dir, run_root, stage_prepare


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory: pytest.TempPathFactory):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    env = {"LEMON_S3_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "LEMON_S3_ADDRESSING_STYLE": "path", "AWS_DEFAULT_REGION": "us-east-1"}
    bucket = f"lemon-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    yield env, bucket
    server.stop()


def test_two_runs_of_one_config_get_their_own_roots(tmp_path: Path) -> None:
    cfg = load_config("local-tiny").model_copy(update={"artifacts": str(tmp_path)})
    first, _ = stage_prepare(cfg, run_id="")
    second, _ = stage_prepare(cfg, run_id="")
    assert run_root(first) != run_root(second) and Path(first).exists() and Path(second).exists()
    named, _ = stage_prepare(cfg, run_id="kfp-run-7")
    assert run_root(named) == f"{tmp_path}/kfp-run-7"


def test_a_retrain_on_the_same_cache_never_loads_the_previous_checkpoint(
    s3_env: tuple[dict[str, str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, bucket = s3_env
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("LEMON_CACHE_DIR", str(tmp_path / "pvc"))
    storage.s3_client.cache_clear() if hasattr(storage.s3_client, "cache_clear") else None

    def checkpoint(run: str, weights: bytes) -> str:
        folder = tmp_path / f"ckpt-{run}-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weights)
        uri = f"s3://{bucket}/runs/{run}/iter-001/checkpoint"
        storage.upload_dir(folder, uri)
        return uri

    week1 = local_dir(checkpoint("week-1", b"old weights"))
    week2 = local_dir(checkpoint("week-2", b"new weights"))
    assert (week1 / "model.safetensors").read_bytes() == b"old weights"
    assert (week2 / "model.safetensors").read_bytes() == b"new weights" and week1 != week2
    # even an object rewritten at the *same* URI (the old layout) is never served stale from the cache
    same = checkpoint("week-1", b"retrained weights")
    assert (local_dir(same) / "model.safetensors").read_bytes() == b"retrained weights"


def test_stages_share_agent_answers_only_within_one_run_on_local_disk(tmp_path: Path) -> None:
    from lemon_core.pool import load_pool
    from lemon_core.stages import remember_answers

    cfg = load_config("local-tiny").model_copy(update={"artifacts": str(tmp_path)})
    first, _ = stage_prepare(cfg, run_id="run-a")
    pool = load_pool("simulated")
    remember_answers(cfg, pool, first)
    assert pool.answer_cache_dir == tmp_path / "run-a" / "node-cache" / pool.identity()
    capped = load_pool("simulated")
    capped.levels = [lv.model_copy(update={"max_tokens": 7}) for lv in capped.levels]
    assert capped.identity() != pool.identity()  # other caps, other answers: never mixed
    off, on_s3 = load_pool("simulated"), load_pool("simulated")
    remember_answers(cfg.model_copy(update={"node_cache": False}), off, first)
    remember_answers(cfg, on_s3, "s3://bucket/runs/run-b/tasks/manifest.json")  # pods share no folder
    assert off.answer_cache_dir is None and on_s3.answer_cache_dir is None
