"""Components: their kfp interfaces, that they install nothing at runtime, and that their functions
do the real work when called directly (prepare on the real benchmark files; train's multi-node path
building a TrainJob; report + publish gate on real summaries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components import evaluate, prepare_dataset, publish, rollout, sft, train
from lemon_core.stages import ORCHESTRATOR, PipelineConfig, load_config, should_publish, stage_publish

IMAGE = "ghcr.io/example/lemon:test"


def _inputs(comp: Any) -> set[str]:
    return set(comp.component_spec.inputs or {})


def _outputs(comp: Any) -> set[str]:
    return set(comp.component_spec.outputs or {})


def test_component_interfaces() -> None:
    expected = {
        prepare_dataset.make: ({"config_json", "run_id"}, {"manifest_uri", "train_shards"}),
        sft.make: ({"config_json", "manifest_uri"}, {"Output"}),
        rollout.make: (
            {"config_json", "manifest_uri", "shard_index", "iteration", "checkpoint_uri"},
            {"Output"},
        ),
        train.make: (
            {
                "config_json",
                "records_uris",
                "iteration",
                "checkpoint_uri",
                "reference_uri",
                "run_id",
            },
            {"Output"},
        ),
        evaluate.make: (
            {"config_json", "manifest_uri", "method", "benchmark", "checkpoint_uri", "sft_uri"}, {"Output"}
        ),
        evaluate.make_report: (
            {"config_json", "summary_uris"},
            {"html", "markdown", "metrics", "publish", "candidate", "served", "report_uri"},
        ),
        publish.make: ({"config_json", "checkpoint_uri", "summary_uris"}, {"Output"}),
    }
    for make, (ins, outs) in expected.items():
        comp = make(IMAGE)
        assert _inputs(comp) == ins, make
        assert _outputs(comp) == outs, make
        container = comp.component_spec.implementation.container
        assert container.image == IMAGE
        assert "pip install" not in " ".join(container.command), "components must not install at runtime"


def _tiny(tmp_path: Path, **update: Any) -> PipelineConfig:
    cfg = load_config("local-tiny")
    return cfg.model_copy(update={"artifacts": str(tmp_path / "run"), **update})


def test_prepare_component_on_real_files(tmp_path: Path) -> None:
    cfg = _tiny(tmp_path)
    out = prepare_dataset.prepare_dataset(cfg.model_dump_json(), "kfp-run-1")
    assert out.manifest_uri == f"{cfg.artifacts}/kfp-run-1/tasks/manifest.json"  # each run its own root
    manifest = json.loads(Path(out.manifest_uri).read_text())
    assert manifest["splits"]["test"]["counts"] == {"multiarith": 2}
    assert out.train_shards == manifest["splits"]["train"]["shards"][:1]
    first = json.loads(Path(out.train_shards[0]).read_text().splitlines()[0])
    assert first["benchmark"] == "multiarith" and first["example"]["question"]


def test_train_component_creates_trainjob_when_multinode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lemon_core.trainjob as tj

    seen: dict[str, Any] = {}

    def fake_run(cfg: tj.TrainJobConfig, **kw: Any) -> dict[str, Any]:
        seen["body"] = tj.trainjob_body(cfg)
        seen["timeout"] = kw["timeout_s"]
        return {}

    monkeypatch.setattr(tj, "run_trainjob", fake_run)
    cfg = _tiny(tmp_path)
    cfg.kubernetes.train_nodes = 4
    records = ["s3://b/run-7/iter-002/rollouts/r0.jsonl", "s3://b/run-7/iter-002/rollouts/r1.jsonl"]
    uri = train.train(cfg.model_dump_json(), records, 2, "s3://b/ckpt-1", "s3://b/sft", "Run-UUID-7")
    assert uri == "s3://b/run-7/iter-002/checkpoint"  # the run root the records live under
    body = seen["body"]
    tj.validate_body(body)
    t = body["spec"]["trainer"]
    assert t["numNodes"] == 4 and t["image"] == cfg.kubernetes.gpu_image
    assert t["command"] == ["torchrun", "--no-python", "lemon", "train-step"]
    args = t["args"]
    assert args[args.index("--records") + 1] == records[0] and args.count("--records") == 2
    assert args[args.index("--checkpoint") + 1] == "s3://b/ckpt-1"
    assert json.loads(args[args.index("--config") + 1])["kubernetes"]["train_nodes"] == 4
    assert body["metadata"]["name"] == "lemon-2-run-uuid-7"


def _summary(tmp_path: Path, method: str, acc: float) -> str:
    p = tmp_path / f"{method}.json"
    p.write_text(
        json.dumps(
            {
                "benchmark": "multiarith",
                "method": method,
                "split": "test",
                "n": 4,
                "accuracy": acc,
                "mean_tokens": 10.0,
                "mean_cost_usd": 1e-6,
                "mean_latency_s": 0.1,
                "agent_calls": 4,
                "failures": 0,
                "wall_s": 1.0,
            }
        )
    )
    return str(p)


def test_publish_gate_and_model_card(tmp_path: Path) -> None:
    cfg = _tiny(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (ckpt / "training_state.pt").write_bytes(b"optimizer")
    first = [_summary(tmp_path, ORCHESTRATOR, 0.5), _summary(tmp_path, "cot", 0.25)]
    assert should_publish(cfg, first) == (True, 0.5, None), "nothing served yet"
    serving = Path(stage_publish(cfg, str(ckpt), first))
    assert (serving / "model" / "model.safetensors").read_bytes() == b"weights"
    assert not (serving / "model" / "training_state.pt").exists(), "optimizer state is not served"
    card = json.loads((serving / "model_card.json").read_text())
    assert card["metrics"] == {"accuracy": 0.5} and card["baselines"][0]["method"] == "cot"
    assert "| multiarith | lemon |" in (serving / "MODEL_CARD.md").read_text()
    worse = [_summary(tmp_path, ORCHESTRATOR, 0.5)]
    assert should_publish(cfg, worse) == (False, 0.5, 0.5), "equal is not better"
