"""The torchrun path of the trainer, for real: 2 CPU ranks (gloo on loopback) on the tiny model.

One ``torchrun --nproc-per-node 2`` launch runs this file as a worker (``__main__`` below) that
(1) does one ``grpo_update`` on its share of a fixed batch and (2) runs ``train()`` end to end. The
test then checks, against a single-process run in the test itself:

* the distributed update equals the single-process update on the full batch. The optimizer here is
  SGD with clipping off, because Adam's first step (and norm clipping) is invariant to the gradient's
  scale: a factor-2 error (averaging instead of summing, or a per-rank token count) would pass
  unseen. The two ranks' shards have different token counts, so a wrong normaliser shows too;
* both ranks end ``train()`` with bitwise identical weights, equal to the checkpoint on disk;
* only rank 0 writes checkpoints and the SFT model; every rank writes its own rollout shard;
* a rank without records (fewer groups than ranks) still joins the collectives and gets the same step;
* ``--resume`` under torchrun continues exactly (per-rank RNG, sampler synced over ranks);
* nothing hangs (the launch has a timeout).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LR = 0.05

pytestmark = pytest.mark.slow


# --- shared by the test process and the workers ---------------------------------------------------
def _batch(model_dir: Path) -> list[Any]:
    """A fixed rollout batch: 4 tasks x G=2, uneven prompt/completion lengths, one counterfactual edit."""
    from lemon_core.policy import OrchestratorPolicy
    from lemon_core.reward import RewardTerms
    from lemon_core.rollout import EditResult, RolloutRecord

    policy = OrchestratorPolicy.load(str(model_dir))
    rng = random.Random(0)
    vocab = policy.tokenizer.vocab_size
    records = []
    for t, (plen, clens) in enumerate([(5, (3, 9)), (7, (4, 2)), (4, (12, 6)), (6, (5, 8))]):
        prompt = [rng.randrange(3, vocab) for _ in range(plen)]
        for j, n in enumerate(clens):
            completion = [rng.randrange(3, vocab) for _ in range(n)]
            edits = []
            if (t, j) == (2, 0):
                edits = [EditResult(family="duty_rollback", agent_id="a1", span=(4, 9), description="",
                                    reward=0.1, delta=0.6)]  # fmt: skip
            records.append(
                RolloutRecord(
                    step=1,
                    task_id=f"t{t}",
                    benchmark="b",
                    sample=j,
                    prompt_ids=prompt,
                    completion_ids=completion,
                    old_logprobs=policy.logprobs([prompt], [completion])[0],
                    offsets=[(2 * i, 2 * i + 2) for i in range(n)],
                    temperature=1.0,
                    text="x" * (2 * n),
                    valid=True,
                    reward=RewardTerms(total=[0.9, 0.1, 0.3, 0.7, 1.0, 0.0, 0.2, 0.5][2 * t + j]),
                    edits=edits,
                )
            )
    return records


def _one_update(model_dir: Path, records: list[Any]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(weight change per parameter, metrics) of one grpo_update with SGD on ``records``."""
    from lemon_core.config import TrainConfig
    from lemon_core.policy import OrchestratorPolicy
    from lemon_core.update import grpo_update

    cfg = TrainConfig(
        model=str(model_dir),
        grpo=dict(kl_coef=0.04, cf_coef=1.0),
        optim=dict(micro_batch_size=2, max_grad_norm=1e9),
    )
    policy = OrchestratorPolicy.load(str(model_dir))
    ref = OrchestratorPolicy.load(str(model_dir)).model.eval().requires_grad_(False)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    before = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
    metrics = grpo_update(policy, ref, records, optimizer, scheduler, cfg)
    delta = {k: v.detach() - before[k] for k, v in policy.model.named_parameters()}
    return delta, metrics


def _tasks() -> list[Any]:
    from lemon_core.benchmarks import Example

    return [
        Example(id=f"q{i}", benchmark="multiarith", question=f"Ann has {i + 2} pens and buys {i} more. "
                "How many?", answer=str(2 * i + 2), answer_format="Answer with a number.")
        for i in range(8)
    ]  # fmt: skip


def _train_cfg(model_dir: Path, out: Path) -> Any:
    from lemon_core.train import TrainConfig

    cfg = TrainConfig.from_yaml("train-tiny", model=str(model_dir), out=str(out), progress=False)
    return cfg.model_copy(
        update={
            "iterations": 2,
            "tasks_per_iteration": 1,
            "include_format": False,
            "rollout": cfg.rollout.model_copy(update={"max_new_tokens": 128}),
            # enough SFT that most samples parse: rewards vary, counterfactual edits happen
            "sft": cfg.sft.model_copy(update={"steps": 80, "lr": 3e-3, "batch_size": 6, "vary_text": False}),
        }
    )


# --- the worker (one per rank, started by torchrun) -----------------------------------------------
def _spy_on_train(train_mod: Any) -> tuple[list[str], dict[str, Any]]:
    """Patch ``train_mod`` (in a worker process) to record which model folders this rank writes and to
    keep the policy of the last update: returns (writes, captured) that fill in as ``train`` runs."""
    writes: list[str] = []
    captured: dict[str, Any] = {}
    save_ckpt, save_dir, update = train_mod.save_checkpoint, train_mod.save_model_dir, train_mod.grpo_update

    def spy_ckpt(out: Path, step: int, *a: Any, **k: Any) -> Path:
        writes.append(f"ckpt-{step}")
        return save_ckpt(out, step, *a, **k)

    def spy_dir(policy: Any, final: Path, *a: Any, **k: Any) -> None:
        writes.append(final.name)
        save_dir(policy, final, *a, **k)

    def keep_policy(policy: Any, *a: Any, **k: Any) -> dict[str, float]:
        captured["policy"] = policy
        return update(policy, *a, **k)

    train_mod.save_checkpoint, train_mod.save_model_dir, train_mod.grpo_update = spy_ckpt, spy_dir, keep_policy
    import lemon_core.checkpoint as checkpoint_mod  # checkpoints write their model folder from there

    checkpoint_mod.save_model_dir = spy_dir
    return writes, captured


def _worker(work: Path) -> None:
    import lemon_core.dist as dist_mod
    import lemon_core.train as train_mod
    from lemon_core.rollout import read_records

    torch.set_num_threads(1)
    rank, world_size = train_mod.world("cpu")
    model_dir = work / "tiny"

    # (1) one update on this rank's share of the fixed batch
    records = read_records(str(work / "batch.jsonl"))
    mine = dist_mod.shard_by_group(records, rank, world_size)
    delta, metrics = _one_update(model_dir, mine)
    one_group, _ = _one_update(model_dir, dist_mod.shard_by_group(records[:2], rank, world_size))
    torch.save({"delta": delta, "metrics": metrics, "tokens": sum(len(r.completion_ids) for r in mine),
                "one_group": one_group}, work / f"update-rank{rank}.pt")  # fmt: skip

    # (2) train() end to end, recording who writes model folders
    writes, captured = _spy_on_train(train_mod)
    rollouts = train_mod.collect_rollouts

    def keep_sampler(*a: Any, **k: Any) -> Any:
        captured["sampler"] = a[5]  # (policy, examples, pool, cfg, reward_cfg, sampler)
        return rollouts(*a, **k)

    train_mod.collect_rollouts = keep_sampler
    tasks = _tasks()
    result = train_mod.train(_train_cfg(model_dir, work / "run"), examples=(tasks[:6], tasks[6:]))
    state = {k: v.detach().clone() for k, v in captured["policy"].model.state_dict().items()}
    sampler = {f.value: v for f, v in captured["sampler"].mean_abs_delta.items()}
    torch.save({"state": state, "writes": writes, "metrics": result.metrics, "sampler": sampler},
               work / f"train-rank{rank}.pt")  # fmt: skip

    # (3) resume that run for a third step, and run 3 steps uninterrupted elsewhere, to compare
    three = _train_cfg(model_dir, work / "run").model_copy(update={"iterations": 3})
    train_mod.train(three, resume=True, examples=(tasks[:6], tasks[6:]))
    resumed = {k: v.detach().clone() for k, v in captured["policy"].model.state_dict().items()}
    train_mod.train(three.model_copy(update={"out": str(work / "straight")}), examples=(tasks[:6], tasks[6:]))
    straight = {k: v.detach().clone() for k, v in captured["policy"].model.state_dict().items()}
    torch.save({"resumed": resumed, "straight": straight}, work / f"resume-rank{rank}.pt")
    torch.distributed.destroy_process_group()


# --- the test -------------------------------------------------------------------------------------
def _torchrun(work: Path, timeout: float = 120, script: str = __file__) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as 2 gloo ranks on loopback (its ``__main__`` is the worker), failing on a hang."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMON_", "PET_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "0", str(Path(script).resolve()), str(work)]  # fmt: skip
    try:
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in {timeout} s (a rank hung?):\n{(e.stderr or '')[-3000:]}")


def test_two_ranks_match_single_process_and_only_rank0_writes(tmp_path: Path) -> None:
    from lemon_core.checkpoint import latest_checkpoint
    from lemon_core.dist import shard_by_group
    from lemon_core.rollout import write_records

    torch.set_num_threads(1)
    model_dir = build_tiny_chat_model(tmp_path / "tiny", seed=0)
    records = _batch(model_dir)
    write_records(records, str(tmp_path / "batch.jsonl"))
    t0 = time.perf_counter()
    proc = _torchrun(tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    print(f"torchrun 2 ranks: {time.perf_counter() - t0:.1f} s")

    # (1) the distributed update is the full-batch update
    ranks = [torch.load(tmp_path / f"update-rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["tokens"] != ranks[1]["tokens"]  # uneven shards: a per-rank normaliser would show
    single, single_metrics = _one_update(model_dir, records)
    half, _ = _one_update(model_dir, shard_by_group(records, 0, 2))  # what rank 0 alone would do
    scale = max(float(d.abs().max()) for d in single.values())
    assert scale > 1e-4
    for name, d in single.items():
        assert torch.equal(ranks[0]["delta"][name], ranks[1]["delta"][name]), name
        assert torch.allclose(ranks[0]["delta"][name], d, rtol=1e-4, atol=1e-5 * scale), name
    off = max(float((half[k] - d).abs().max()) for k, d in single.items())
    assert off > 0.05 * scale  # the check can fail: rank 0's shard alone gives a different step
    for key in ("loss", "kl", "grad_norm", "advantage/mean"):
        assert ranks[0]["metrics"][key] == pytest.approx(single_metrics[key], rel=1e-4, abs=1e-7), key
    # one group, two ranks: rank 1 has no records but still joins every collective (no hang)
    one_group, _ = _one_update(model_dir, records[:2])
    for name, d in one_group.items():
        assert torch.equal(ranks[0]["one_group"][name], ranks[1]["one_group"][name]), name
        assert torch.allclose(ranks[1]["one_group"][name], d, rtol=1e-4, atol=1e-5 * scale), name

    # (2) train(): same weights on both ranks, only rank 0 writes
    runs = [torch.load(tmp_path / f"train-rank{r}.pt") for r in (0, 1)]
    assert runs[0]["state"].keys() == runs[1]["state"].keys()
    for name, w in runs[0]["state"].items():
        assert torch.equal(w, runs[1]["state"][name]), name
    assert runs[0]["writes"] == ["sft-model", "ckpt-1", "ckpt-000001", "ckpt-2", "ckpt-000002"]
    assert runs[1]["writes"] == []
    out = tmp_path / "run"
    ckpt = out / "checkpoints" / "ckpt-000002"  # (step 3 is added by the resume below)
    assert (ckpt / "trainer_state.json").exists()
    from safetensors.torch import load_file

    saved = load_file(ckpt / "model.safetensors")
    for name, w in saved.items():
        assert torch.equal(w, runs[0]["state"][name]), name
    assert len(torch.load(ckpt / "training_state.pt", weights_only=False)["rng_by_rank"]) == 2
    assert not list((out / "checkpoints").glob("*.tmp"))
    for step in (1, 2):
        for rank in (0, 1):
            assert (out / "rollouts" / f"step-{step:06d}-rank{rank}.jsonl").exists()
    assert all(len(r["task_ids"]) == 2 for r in runs[0]["metrics"])  # the step's tasks over both ranks
    assert all(r["grad_norm"] > 0 and r["reward/std"] > 0 for r in runs[0]["metrics"])  # real updates
    # the edit-family sampler learnt from both ranks' contrasts, identically, and that is what is saved
    assert runs[0]["sampler"] == runs[1]["sampler"] != {f: 1.0 for f in runs[0]["sampler"]}
    assert json.loads((ckpt / "trainer_state.json").read_text())["sampler"] == runs[0]["sampler"]
    for a, b in zip(runs[0]["metrics"], runs[1]["metrics"], strict=True):  # metrics cover both ranks
        assert (a["task_ids"], a["reward/mean"], a["loss"]) == (b["task_ids"], b["reward/mean"], b["loss"])

    # (3) --resume under torchrun replays step 3 exactly as an uninterrupted 2-rank run
    for rank in (0, 1):
        got = torch.load(tmp_path / f"resume-rank{rank}.pt")
        assert all(torch.equal(w, got["straight"][k]) for k, w in got["resumed"].items())
        shard = f"rollouts/step-000003-rank{rank}.jsonl"
        a, b = ((tmp_path / d / shard).read_text().splitlines() for d in ("run", "straight"))
        key = ("completion_ids", "edits")
        assert [[json.loads(x)[k] for k in key] for x in a] == [[json.loads(x)[k] for k in key] for x in b]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert latest_checkpoint(out) == out / "checkpoints" / "ckpt-000003"


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
