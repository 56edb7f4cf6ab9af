"""The FSDP strategy of the trainer (``distributed.strategy: fsdp``), for real: 2 gloo ranks, tiny model.

One ``torchrun --nproc-per-node 2`` launch runs this file as a worker (``__main__`` below); the test
compares what the ranks wrote against single-process runs in the test itself:

* one ``grpo_update`` on FSDP-sharded policy + reference equals the single-process update on the whole
  batch (SGD, so a factor-2 gradient error - FSDP's default averaging over ranks - shows), with
  uneven shards, uneven micro-batch counts (the short rank pads), a rank with no records at all, with
  gradient clipping active (the norm is a DTensor over shards) and without resharding after forward;
* sampling from the sharded policy (lockstep, weights gathered or not) gives exactly the samples of
  the unsharded model, and leaves the weights sharded again;
* ``train()`` under FSDP runs end to end (nothing hangs: the launch has a timeout), only rank 0 writes,
  its checkpoint is a plain HF folder (``Qwen2ForCausalLM``, loads without torch.distributed) holding
  exactly the weights the ranks hold, and it trains like the replicate strategy: same step-1 rollouts,
  same eval, weights equal to float tolerance;
* ``--resume`` from an FSDP checkpoint (optimizer state scattered back to the shards) continues
  exactly as an uninterrupted FSDP run;
* ``stage_train`` (the Kubeflow TrainJob path) with ``train.distributed.strategy: fsdp`` writes the
  checkpoint and optimizer state that a single process writes.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_train_distributed import _batch, _spy_on_train, _tasks, _train_cfg  # noqa: E402
from test_train_distributed import _torchrun as _torchrun_script  # noqa: E402
from tiny_models import build_tiny_chat_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LR = 0.05


# --- shared by the test process and the workers ---------------------------------------------------
def _full_weights(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter in full: gathered from all ranks when sharded (a collective), else a copy."""
    from lemon_core import fsdp

    if fsdp.is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _update(
    model_dir: Path, records: list[Any], *, sharded: bool, max_grad_norm: float = 1e9, reshard: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(weight change per parameter, metrics) of one grpo_update with SGD; ``sharded``: under FSDP
    (``reshard``: distributed.fsdp_reshard_after_forward)."""
    from lemon_core.config import TrainConfig
    from lemon_core.dist import make_strategy
    from lemon_core.policy import OrchestratorPolicy
    from lemon_core.update import grpo_update

    cfg = TrainConfig(
        model=str(model_dir),
        grpo=dict(kl_coef=0.04, cf_coef=1.0),
        optim=dict(micro_batch_size=2, max_grad_norm=max_grad_norm),
        distributed=dict(strategy="fsdp", fsdp_reshard_after_forward=reshard),
    )
    policy = OrchestratorPolicy.load(str(model_dir))
    ref = OrchestratorPolicy.load(str(model_dir)).model.eval().requires_grad_(False)
    before = _full_weights(policy.model)
    if sharded:
        make_strategy(cfg, 2).prepare(policy, ref)
    optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    metrics = grpo_update(policy, ref, records, optimizer, scheduler, cfg)
    after = _full_weights(policy.model)
    return {k: after[k] - w for k, w in before.items()}, metrics


def _prompts(rank: int) -> list[list[int]]:
    rng = random.Random(100 + rank)
    return [[rng.randrange(3, 300) for _ in range(rng.randrange(4, 12))] for _ in range(3)]


def _samples(policy: Any, rank: int) -> list[list[int]]:
    """Completion ids of 2 samples for each of 3 prompts (2 generate batches of 4 on every rank).

    The random tiny model almost never says end-of-turn, so a band of common tokens ends a completion
    too: sequences (and whole batches) then stop at different steps on each rank.
    """
    policy.eos_ids = sorted({*policy.eos_ids, *range(3, 40)})
    groups = policy.sample(_prompts(rank), 2, max_new_tokens=24, temperature=1.0, seed=7, batch_size=4)
    return [s.completion_ids for g in groups for s in g]


def _pipeline_cfg(model_dir: Path, artifacts: Path, strategy: str) -> Any:
    from lemon_core.config import PrepareConfig
    from lemon_core.stages import PipelineConfig

    train = dict(model=str(model_dir), pool="simulated", grpo=dict(kl_coef=0.04, cf_coef=1.0),
                 optim=dict(lr=1e-3, micro_batch_size=2), distributed=dict(strategy=strategy))  # fmt: skip
    return PipelineConfig(name="fsdp-test", artifacts=str(artifacts), simulated_pool=True,
                          prepare=PrepareConfig(benchmarks=["multiarith"]), train=train)  # fmt: skip


# --- the worker (one per rank, started by torchrun) -----------------------------------------------
def _worker(work: Path) -> None:
    import lemon_core.dist as dist_mod
    import lemon_core.train as train_mod
    import lemon_core.update as update_mod
    from lemon_core import fsdp
    from lemon_core.policy import OrchestratorPolicy
    from lemon_core.rollout import read_records
    from lemon_core.stages import stage_train

    torch.set_num_threads(1)
    rank, world_size = train_mod.world("cpu")
    model_dir = work / "tiny"
    records = read_records(str(work / "batch.jsonl"))

    # (1) grpo_update under FSDP; count micro-batch passes (the short rank must pad)
    passes: list[int] = []
    micro = update_mod.micro_batch_loss

    def count(*a: Any, **k: Any) -> Any:
        passes[-1] += 1
        return micro(*a, **k)

    update_mod.micro_batch_loss = count
    updates = {}
    for name, batch, clip, reshard in [("full", records, 1e9, True), ("three_groups", records[:6], 0.05, False),
                                       ("one_group", records[:2], 1e9, True)]:  # fmt: skip
        passes.append(0)
        mine = dist_mod.shard_by_group(batch, rank, world_size)
        delta, metrics = _update(model_dir, mine, sharded=True, max_grad_norm=clip, reshard=reshard)
        updates[name] = {"delta": delta, "metrics": metrics, "records": len(mine), "passes": passes[-1]}
    update_mod.micro_batch_loss = micro
    torch.save(updates, work / f"update-rank{rank}.pt")

    # (2) sampling: sharded (lockstep, weights gathered or not) vs this rank's unsharded model
    plain = _samples(OrchestratorPolicy.load(str(model_dir)), rank)
    sampled = {}
    for keep in (True, False):
        policy = OrchestratorPolicy.load(str(model_dir))
        fsdp.shard_policy(policy, "cpu")
        with fsdp.gathered_for_sampling(policy.model, keep_gathered=keep, reshard_after_forward=True):
            sampled[keep] = _samples(policy, rank)
        resharded = all(type(p).__name__ == "DTensor" for p in policy.model.parameters())
        sampled[f"resharded-{keep}"] = resharded
    torch.save({"plain": plain, **sampled}, work / f"sample-rank{rank}.pt")

    # (3) train() under FSDP, recording who writes model folders and what the ranks hold
    writes, captured = _spy_on_train(train_mod)
    tasks = _tasks()
    examples = (tasks[:6], tasks[6:])

    def run(out: str, iterations: int, strategy: str = "fsdp", resume: bool = False) -> dict[str, Any]:
        cfg = _train_cfg(model_dir, work / out)
        cfg = cfg.model_copy(update={"iterations": iterations, "distributed": {"strategy": strategy}})
        cfg = train_mod.TrainConfig.model_validate(cfg.model_dump())
        result = train_mod.train(cfg, resume=resume, examples=examples)
        return {"metrics": result.metrics, "weights": _full_weights(captured["policy"].model),
                "sharded": fsdp.is_sharded(captured["policy"].model)}  # fmt: skip

    t0 = time.perf_counter()
    two = run("fsdp", 2)
    two["writes"], two["seconds"] = list(writes), time.perf_counter() - t0
    resumed = run("fsdp", 3, resume=True)
    straight = run("straight", 3)
    replicate = run("replicate", 2, strategy="replicate")
    torch.save({"two": two, "resumed": resumed, "straight": straight, "replicate": replicate},
               work / f"train-rank{rank}.pt")  # fmt: skip

    # (4) the pipeline's train step (TrainJob path) under FSDP
    cfg = _pipeline_cfg(model_dir, work / "pipe-fsdp", "fsdp")
    uri = stage_train(cfg, [str(work / "batch.jsonl")], 1, str(model_dir), str(model_dir))
    (work / f"stage-rank{rank}.txt").write_text(uri)
    torch.distributed.destroy_process_group()


# --- the test -------------------------------------------------------------------------------------
def _torchrun(work: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return _torchrun_script(work, timeout, script=__file__)


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], scale: float) -> None:
    assert got.keys() == want.keys()
    for name, d in want.items():
        assert torch.allclose(got[name], d, rtol=1e-4, atol=1e-5 * scale), name


@pytest.mark.slow
def test_fsdp_matches_single_process_and_checkpoints_plain_hf(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from lemon_core.checkpoint import latest_checkpoint
    from lemon_core.policy import OrchestratorPolicy
    from lemon_core.rollout import write_records
    from lemon_core.stages import stage_train

    torch.set_num_threads(1)
    model_dir = build_tiny_chat_model(tmp_path / "tiny", seed=0)
    records = _batch(model_dir)
    write_records(records, str(tmp_path / "batch.jsonl"))
    t0 = time.perf_counter()
    proc = _torchrun(tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    print(f"torchrun 2 FSDP ranks: {time.perf_counter() - t0:.1f} s")

    # (1) the FSDP update is the single-process update on the whole batch
    ranks = [torch.load(tmp_path / f"update-rank{r}.pt") for r in (0, 1)]
    single, single_metrics = _update(model_dir, records, sharded=False)
    scale = max(float(d.abs().max()) for d in single.values())
    assert scale > 1e-4
    for rank in ranks:
        _assert_close(rank["full"]["delta"], single, scale)
    for key in ("loss", "kl", "grad_norm", "advantage/mean"):
        assert ranks[0]["full"]["metrics"][key] == pytest.approx(single_metrics[key], rel=1e-4, abs=1e-7), key
    # averaging instead of summing over ranks would halve the step: the check can fail
    assert max(float((d / 2 - single[k]).abs().max()) for k, d in ranks[0]["full"]["delta"].items()) > 0.1 * scale
    # three groups: rank 0 has 4 records (2 micro-batches), rank 1 has 2 (1 + 1 padding); clipping on;
    # layers stay gathered from forward to backward (fsdp_reshard_after_forward: false)
    three, three_metrics = _update(model_dir, records[:6], sharded=False, max_grad_norm=0.05)
    assert three_metrics["grad_norm"] > 0.05 * 2  # clipping really scales this step
    assert [r["three_groups"]["records"] for r in ranks] == [4, 2]
    assert [r["three_groups"]["passes"] for r in ranks] == [2, 2]
    for rank in ranks:
        _assert_close(rank["three_groups"]["delta"], three, scale)
        assert rank["three_groups"]["metrics"]["grad_norm"] == pytest.approx(three_metrics["grad_norm"], rel=1e-4)
    # one group: rank 1 has no records, runs one all-padding micro-batch, and gets the same step
    one, _ = _update(model_dir, records[:2], sharded=False)
    assert [r["one_group"]["records"] for r in ranks] == [2, 0]
    assert [r["one_group"]["passes"] for r in ranks] == [1, 1]
    for rank in ranks:
        _assert_close(rank["one_group"]["delta"], one, scale)

    # (2) lockstep sampling from the sharded model = sampling from the full model
    for r in (0, 1):
        got = torch.load(tmp_path / f"sample-rank{r}.pt")
        assert got[True] == got["plain"] and got[False] == got["plain"]
        assert got["resharded-True"] and got["resharded-False"]
    # each generate batch (4 completions) runs as many steps as its longest completion: the ranks' batches
    # end at different steps, so without lockstep one rank would leave the other's all-gathers waiting
    steps = [[max(len(c) for c in torch.load(tmp_path / f"sample-rank{r}.pt")["plain"][lo : lo + 4])
              for lo in (0, 4)] for r in (0, 1)]  # fmt: skip
    print("decoding steps per generate batch, rank 0 / rank 1:", steps)
    assert steps[0] != steps[1]

    # (3) train() under FSDP: rank 0 alone writes plain HF checkpoints holding the gathered weights
    runs = [torch.load(tmp_path / f"train-rank{r}.pt") for r in (0, 1)]
    two = runs[0]["two"]
    print(f"FSDP train() 2 steps: {two['seconds']:.1f} s")
    assert two["sharded"] and not runs[0]["replicate"]["sharded"]
    assert two["writes"] == ["sft-model", "ckpt-1", "ckpt-000001", "ckpt-2", "ckpt-000002"]
    assert runs[1]["two"]["writes"] == []
    for name, w in two["weights"].items():
        assert torch.equal(w, runs[1]["two"]["weights"][name]), name
    ckpt = tmp_path / "fsdp" / "checkpoints" / "ckpt-000002"
    saved = load_file(ckpt / "model.safetensors")
    assert saved.keys() == two["weights"].keys()
    for name, w in saved.items():
        assert torch.equal(w, two["weights"][name]), name
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    loaded = OrchestratorPolicy.load(str(ckpt)).model.state_dict()  # a plain folder, no torch.distributed
    assert all(torch.equal(loaded[k], w) for k, w in two["weights"].items())
    state = torch.load(ckpt / "training_state.pt", weights_only=False)
    n_params = len(list(OrchestratorPolicy.load(str(model_dir)).model.parameters()))
    assert sorted(state["optimizer"]["state"]) == list(range(n_params))  # Optimizer.state_dict form, full
    assert state["optimizer"]["state"][0]["exp_avg"].shape == saved["model.embed_tokens.weight"].shape
    assert len(state["rng_by_rank"]) == 2
    assert all(r["grad_norm"] > 0 and r["reward/std"] > 0 for r in two["metrics"])  # real updates
    assert all("eval/valid_rate" in r for r in two["metrics"][-1:])  # every rank took part in eval

    # FSDP trains what the replicate strategy trains: the same rollouts, eval and (nearly) weights
    rep = runs[0]["replicate"]
    for a, b in zip(two["metrics"], rep["metrics"], strict=True):
        assert a["task_ids"] == b["task_ids"] and a["reward/mean"] == b["reward/mean"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-6)
    for key in ("eval/valid_rate", "eval/score", "eval/reward"):
        assert two["metrics"][-1][key] == rep["metrics"][-1][key], key
    for d in ("fsdp", "replicate"):
        assert (tmp_path / d / "rollouts" / "step-000001-rank1.jsonl").exists()
    step1 = [[json.loads(x)["completion_ids"] for x in (tmp_path / d / "rollouts" / "step-000001-rank1.jsonl")
              .read_text().splitlines()] for d in ("fsdp", "replicate")]  # fmt: skip
    assert step1[0] == step1[1]
    w_scale = max(float(w.abs().max()) for w in rep["weights"].values())
    for name, w in rep["weights"].items():
        assert torch.allclose(two["weights"][name], w, rtol=1e-4, atol=1e-5 * w_scale), name

    # (4) --resume from the FSDP checkpoint replays step 3 as an uninterrupted FSDP run
    for r in (0, 1):
        resumed, straight = runs[r]["resumed"]["weights"], runs[r]["straight"]["weights"]
        assert all(torch.equal(w, straight[k]) for k, w in resumed.items())
    out = tmp_path / "fsdp"
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert latest_checkpoint(out) == out / "checkpoints" / "ckpt-000003"

    # (5) stage_train under FSDP writes what one process writes (weights and full AdamW state)
    uris = {(tmp_path / f"stage-rank{r}.txt").read_text() for r in (0, 1)}
    assert len(uris) == 1
    want_uri = stage_train(_pipeline_cfg(model_dir, tmp_path / "pipe-single", "replicate"),
                           [str(tmp_path / "batch.jsonl")], 1, str(model_dir), str(model_dir))  # fmt: skip
    got_dir, want_dir = Path(uris.pop()), Path(want_uri)
    got_w, want_w = load_file(got_dir / "model.safetensors"), load_file(want_dir / "model.safetensors")
    moved = max(float((want_w[k] - w).abs().max()) for k, w in load_file(model_dir / "model.safetensors").items())
    assert moved > 1e-4
    _assert_close(got_w, want_w, moved)
    got_opt = torch.load(got_dir / "training_state.pt", weights_only=False)["optimizer"]
    want_opt = torch.load(want_dir / "training_state.pt", weights_only=False)["optimizer"]
    for i, s in want_opt["state"].items():
        assert torch.allclose(got_opt["state"][i]["exp_avg"], s["exp_avg"], rtol=1e-4, atol=1e-9), i
    shutil.rmtree(tmp_path / "pipe-single", ignore_errors=True)


# --- the pieces that need no second process ------------------------------------------------------
def test_strategy_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from lemon_core.config import TrainConfig
    from lemon_core.dist import uses_fsdp

    assert TrainConfig().distributed.strategy == "replicate"
    cfg = TrainConfig(distributed=dict(strategy="fsdp"))
    assert uses_fsdp(cfg, 2) and not uses_fsdp(cfg, 1)  # one process has nothing to shard
    assert not uses_fsdp(TrainConfig(), 8)
    with pytest.raises(ValidationError, match="strategy"):
        TrainConfig(distributed=dict(strategy="zero3"))
    with pytest.raises(ValidationError, match="distributed.strategy: replicate"):
        TrainConfig(distributed=dict(strategy="fsdp"), lora=dict(enabled=True))
    monkeypatch.setenv("LEMON_DISTRIBUTED__STRATEGY", "fsdp")
    assert TrainConfig.from_yaml("train-tiny").distributed.strategy == "fsdp"


def test_decoder_layers_and_optimizer_state_forms(tmp_path: Path) -> None:
    from lemon_core import fsdp
    from lemon_core.policy import OrchestratorPolicy

    model = OrchestratorPolicy.load(str(build_tiny_chat_model(tmp_path / "tiny", seed=0))).model
    layers = fsdp.decoder_layers(model)
    assert [type(m).__name__ for m in layers] == ["Qwen2DecoderLayer"] * 2
    assert layers[0] is model.model.layers[0]
    with pytest.raises(ValueError, match="strategy: replicate"):
        fsdp.decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))

    # a checkpoint's Optimizer.state_dict (integer ids) <-> the FQN form of torch.distributed.checkpoint
    model.lm_head.requires_grad_(False)  # ids count trainable parameters only
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    optimizer.step()
    by_id = optimizer.state_dict()
    names = fsdp._trainable_names(model)
    assert "lm_head.weight" not in names and len(names) == len(by_id["state"])
    by_name = fsdp.optimizer_state_by_name(by_id, names)
    assert by_name["param_groups"][0]["params"][0] == "model.embed_tokens.weight"
    assert by_name["state"]["model.norm.weight"]["exp_avg"].shape == model.model.norm.weight.shape
    back = fsdp.optimizer_state_by_id(by_name, names)
    assert back["param_groups"] == by_id["param_groups"]
    assert all(back["state"][i]["exp_avg"] is s["exp_avg"] for i, s in by_id["state"].items())


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
