"""Both pipelines compile to IR YAML whose structure matches the config; the tiny config runs end to
end with kfp.local (slow: real CPU models, needs `lemon models pull`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lemon_core.stages import StageError, load_config
from pipelines.run import compile_pipeline


def _load_ir(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    ir, platform = yaml.safe_load_all(path.read_text())
    return ir, platform


def _tasks(dag: dict[str, Any]) -> dict[str, Any]:
    return dag["dag"]["tasks"]


@pytest.mark.parametrize("iterations", [1, 3])
def test_train_pipeline_unrolls_iterations(tmp_path: Path, iterations: int) -> None:
    cfg = load_config("local-tiny").model_copy(update={"n_iterations": iterations})
    ir, platform = _load_ir(compile_pipeline(cfg, "train", tmp_path / "train.yaml"))
    assert ir["pipelineInfo"]["name"] == "lemon-train"
    root = _tasks(ir["root"])
    names = set(root)
    assert {"prepare-dataset", "sft", "train", "evaluation-report", "eval-matrix"} <= names
    # one rollout fan-out sub-pipeline per iteration, each holding a ParallelFor; one for the eval matrix
    assert sum(n.startswith("rollout-shards") for n in names) == iterations
    loops = [
        n for n, c in ir["components"].items()
        if "dag" in c and any(t.startswith("for-loop") for t in c["dag"]["tasks"])
    ]
    assert len(loops) == iterations + 1, loops
    # each GRPO step trains on the records its iteration's fan-out collected
    grpo = sorted((n for n in names if n == "train" or n.startswith("train-")), key=lambda n: (len(n), n))
    for k, step in enumerate(grpo, start=1):
        producer = root[step]["inputs"]["parameters"]["records_uris"]["taskOutputParameter"]["producerTask"]
        assert producer == ("rollout-shards" if k == 1 else f"rollout-shards-{k}")
    assert len(grpo) == iterations
    # each GRPO step consumes the previous checkpoint: train reads sft's output, train-2 train's, ...
    chain = ["sft", *grpo]
    for prev, cur in zip(chain, chain[1:], strict=False):
        ckpt = root[cur]["inputs"]["parameters"]["checkpoint_uri"]["taskOutputParameter"]
        assert ckpt["producerTask"] == prev
    assert ir["root"]["inputDefinitions"]["parameters"]["config_json"]["parameterType"] == "STRING"
    default = json.loads(ir["root"]["inputDefinitions"]["parameters"]["config_json"]["defaultValue"])
    assert default["n_iterations"] == iterations
    # every task has an executor whose image is the configured one, and no runtime pip install
    executors = ir["deploymentSpec"]["executors"]
    assert len(executors) == len(ir["components"]) - sum(1 for c in ir["components"].values() if "dag" in c)
    for ex in executors.values():
        assert ex["container"]["image"] in (cfg.kubernetes.image, cfg.kubernetes.gpu_image)
        assert "pip install" not in " ".join(ex["container"]["command"])
    # the publish gate: a condition on the report's `publish` output
    cond = next(c for c in ir["components"].values() if "dag" in c and "publish" in _tasks(c))
    assert cond is not None
    assert root["publish-gate"]["inputs"]["parameters"]["publish"]["taskOutputParameter"] == {
        "outputParameterKey": "publish", "producerTask": "evaluation-report"}
    gate_dag = ir["components"]["comp-publish-gate"]["dag"]["tasks"]
    gate = next(t for t in gate_dag.values() if t.get("triggerPolicy"))
    assert "publish" in gate["triggerPolicy"]["condition"]
    # GPU placement lives in the kubernetes platform spec
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    rollout_exec = next(v for k, v in k8s.items() if k.startswith("exec-rollout"))
    assert rollout_exec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert rollout_exec["pvcMount"][0]["mountPath"] == "/cache"
    assert {m["secretName"] for m in [rollout_exec["secretAsEnv"][0]]} == {"lemon-s3"}
    gpu_exec = executors[next(k for k in executors if k.startswith("exec-rollout"))]
    assert gpu_exec["container"]["resources"]["accelerator"]["resourceCount"] == "1"


def test_eval_pipeline_matrix(tmp_path: Path) -> None:
    cfg = load_config("local-cpu")
    ir, _ = _load_ir(compile_pipeline(cfg, "eval", tmp_path / "eval.yaml"))
    assert ir["pipelineInfo"]["name"] == "lemon-eval"
    assert "eval-matrix" in _tasks(ir["root"])
    matrix = ir["components"]["comp-eval-matrix"]
    loop = next(t for n, t in _tasks(matrix).items() if n.startswith("for-loop"))
    items = json.loads(loop["parameterIterator"]["items"]["raw"])
    expected = {(m, b) for m in cfg.evaluate.methods for b in cfg.prepare.benchmarks}
    assert {(i["method"], i["benchmark"]) for i in items} == expected
    assert set(ir["root"]["inputDefinitions"]["parameters"]) == {"config_json", "checkpoint_uri"}


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("prepare: {benchmarks: [gsm8k]}\ntrain: {rollout: {group_size: 1}}\n")
    with pytest.raises(StageError, match="train"):
        load_config(str(bad))
    sim = tmp_path / "sim.yaml"
    sim.write_text("prepare: {benchmarks: [gsm8k]}\ntrain: {pool: simulated}\n")
    with pytest.raises(StageError, match="simulated_pool: true"):
        load_config(str(sim))
    with pytest.raises(StageError, match="not found"):
        load_config(str(tmp_path / "missing.yaml"))


def _models_pulled() -> bool:
    from lemon_core.models import is_pulled

    return all(is_pulled(m) for m in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"))


@pytest.mark.slow
@pytest.mark.integration
def test_tiny_pipeline_runs_end_to_end_with_kfp_local(tmp_path: Path) -> None:
    if not _models_pulled():
        pytest.skip("CPU pool models not pulled; run `lemon models pull` (.ci/run does)")
    from pipelines.run import run_local

    cfg = load_config("local-tiny")
    cfg.artifacts = str(tmp_path / "artifacts")
    cfg.run_id = "run-1"
    start = time.perf_counter()
    run_local(cfg, "train", pipeline_root=tmp_path / "kfp")
    print(f"tiny pipeline wall time: {time.perf_counter() - start:.0f} s")
    run = Path(cfg.artifacts) / "run-1"  # every run writes under its own root
    assert (run / "tasks" / "manifest.json").exists()
    assert (run / "sft" / "model" / "_lemon_manifest.json").exists()
    assert (run / "iter-001" / "checkpoint" / "trainer_state.json").exists()
    records = (run / "iter-001" / "rollouts").glob("*.jsonl")
    assert sum(len(p.read_text().splitlines()) for p in records) == cfg.train.rollout.group_size
    summaries = {p.parent.name: json.loads(p.read_text()) for p in (run / "eval").glob("*/summary.json")}
    assert set(summaries) == {"multiarith-lemon", "multiarith-lemon-sft", "multiarith-cot@small"}
    assert all(s["n"] == 2 and "valid_rate" in s and "accuracy_ci_high" in s for s in summaries.values())
    assert all(s["mean_reward"] is not None for s in summaries.values())  # the training reward of every method
    assert summaries["multiarith-lemon"]["sampled_k"] == 1 and summaries["multiarith-lemon"]["sampled_reward"] <= 1.2
    train_row = json.loads((run / "iter-001" / "train.json").read_text())
    assert "probe/reward" in train_row and "probe/reward/multiarith" in train_row  # the probe set's curve
    from lemon_core.cli_pipeline import results_table

    table = results_table(str(run))
    assert any(" lemon-sft " in line for line in table) and any(line.split()[1] == "lemon" and " p=" in line
                                                                for line in table)
    html = (run / "report" / "report.html").read_text()
    assert "data:image/png;base64," in html and "multiarith" in html
    assert "<h2>SFT warm-up</h2>" in html and "valid-spec rate before" in html  # read from the run's sft.json
    published = "publish gate: PUBLISH" in html
    assert published or "publish gate: NOT PUBLISHED" in html, "the report says what the gate decided"
    # the served model lives beside the runs, not inside one; the gate's decision is what happened
    assert (Path(cfg.artifacts) / "serving" / "model_card.json").exists() == published
    assert (run / "iter-001" / "metrics.prom").read_text().count("lemon_train_kl") >= 1
