"""The LoRA path of the trainer (peft), on the tiny model and the simulated pool.

Checked: only adapter weights train (the base stays bitwise equal); the KL reference is the
adapter-disabled model (KL exactly 0 before the first update, > 0 after, and the reference logprobs
equal the plain base model's); adapter checkpoints resume exactly; a checkpoint loads for sampling
from another working directory, with its adapter or merged into a plain model folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")

import lemon_core.train as train_mod  # noqa: E402
import lemon_core.update as update_mod  # noqa: E402
from lemon_core.benchmarks import Example  # noqa: E402
from lemon_core.checkpoint import latest_checkpoint  # noqa: E402
from lemon_core.config import TrainConfig  # noqa: E402
from lemon_core.lora import merge_lora_checkpoint  # noqa: E402
from lemon_core.policy import OrchestratorPolicy  # noqa: E402
from lemon_core.pool import load_pool  # noqa: E402
from lemon_core.train import train  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

TASKS = [
    Example(id=f"q{i}", benchmark="multiarith", question=f"Bo has {i + 1} cards and gets {i + 3} more. "
            "How many?", answer=str(2 * i + 4), answer_format="Answer with a number.")
    for i in range(8)
]  # fmt: skip


def _cfg(out: str, iterations: int) -> TrainConfig:
    """Relative model/out paths on purpose: the checkpoint must still load from another directory."""
    cfg = TrainConfig.from_yaml("train-tiny", model="tiny", out=out, progress=False)
    return cfg.model_copy(
        update={
            "iterations": iterations,
            "include_format": False,
            "rollout": cfg.rollout.model_copy(update={"max_new_tokens": 128}),
            # enough SFT that some samples parse: an all-invalid group has no advantage to learn from
            "sft": cfg.sft.model_copy(update={"steps": 80, "lr": 3e-3, "batch_size": 6, "vary_text": False}),
            "lora": cfg.lora.model_copy(update={"enabled": True, "r": 4, "alpha": 8}),
            "optim": cfg.optim.model_copy(update={"lr": 1e-2}),
        }
    )


def _params(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three LoRA GRPO steps, watching the policy at every update."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lora")
    build_tiny_chat_model(root / "tiny", seed=0)
    seen: dict[str, Any] = {"before": []}
    update = train_mod.grpo_update

    def watch(policy: OrchestratorPolicy, *a: Any, **k: Any) -> dict[str, float]:
        seen["policy"] = policy
        seen["before"].append(_params(policy.model))
        return update(policy, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setattr(train_mod, "grpo_update", watch)
        result = train(_cfg("run", 3), examples=(TASKS[:6], TASKS[6:]))
    seen.update(root=root, result=result, after=_params(seen["policy"].model))
    return seen


def test_only_adapters_train_and_base_stays_bitwise_equal(run: dict[str, Any]) -> None:
    first, last = run["before"][0], run["after"]
    trainable = {k for k, v in run["policy"].model.named_parameters() if v.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    base = [k for k in first if "lora_" not in k]
    assert base and all(torch.equal(first[k], last[k]) for k in base)
    assert all(not torch.equal(first[k], last[k]) for k in trainable)  # lora_A and lora_B both moved


def test_reference_is_the_adapter_disabled_model(run: dict[str, Any]) -> None:
    rows = run["result"].metrics
    assert rows[0]["kl"] == 0.0  # adapters start as the identity, so policy == reference exactly
    assert rows[1]["kl"] > 1e-9 and rows[2]["kl"] > 1e-9  # after an update the policy has moved
    policy = run["policy"]
    pool = load_pool("simulated")
    prompt = policy.prompt_ids(TASKS[0].question, pool)
    completion = policy.completion_ids("```yaml\nagents: []\n```")
    with torch.no_grad():
        ref = update_mod.ref_logprobs(policy, None, [prompt], [completion], 1.0)
        now = policy.logprob_tensor([prompt], [completion])[0]
    base = OrchestratorPolicy.load(str(run["root"] / "run" / "sft-model"), include_roles=False)  # the SFT model
    plain = torch.tensor(base.logprobs([prompt], [completion])[0])
    assert torch.allclose(ref[0], plain, atol=1e-5)
    assert not torch.allclose(now[0], plain, atol=1e-4)


def test_adapter_checkpoint_resumes_exactly(run: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file

    root = run["root"]
    monkeypatch.chdir(root)
    ckpt = latest_checkpoint(root / "run")
    assert ckpt is not None and ckpt.name == "ckpt-000003"
    assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    train(_cfg("split", 2), examples=(TASKS[:6], TASKS[6:]))
    resumed = train(_cfg("split", 3), resume=True, examples=(TASKS[:6], TASKS[6:]))
    assert [r["step"] for r in resumed.metrics] == [1, 2, 3]
    a = load_file(ckpt / "adapter_model.safetensors")
    b = load_file(root / "split" / "checkpoints" / "ckpt-000003" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    shard = "rollouts/step-000003-rank0.jsonl"
    ids = [[json.loads(x)["completion_ids"] for x in (root / d / shard).read_text().splitlines()]
           for d in ("run", "split")]  # fmt: skip
    assert ids[0] == ids[1]


def test_checkpoint_loads_for_sampling_with_adapter_or_merged(
    run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # elsewhere: the adapter's base path must not be relative
    ckpt = latest_checkpoint(run["root"] / "run")
    assert ckpt is not None
    pool = load_pool("simulated")
    trained = run["policy"]
    prompt = trained.prompt_ids(TASKS[7].question, pool)
    completion = trained.completion_ids("```yaml\noutput: a1\n```")
    want = torch.tensor(trained.logprobs([prompt], [completion])[0])

    with_adapter = OrchestratorPolicy.load(str(ckpt), include_roles=False)
    merged = OrchestratorPolicy.load(str(merge_lora_checkpoint(ckpt, tmp_path / "merged")), include_roles=False)
    assert (tmp_path / "merged" / "model.safetensors").exists()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    for policy in (with_adapter, merged):
        got = torch.tensor(policy.logprobs([prompt], [completion])[0])
        assert torch.allclose(got, want, atol=1e-4)
        sample = policy.sample([prompt], 2, max_new_tokens=8, seed=0)[0]
        assert len(sample) == 2 and all(s.completion_ids for s in sample)
    with pytest.raises(ValueError, match="not a LoRA checkpoint"):
        merge_lora_checkpoint(tmp_path / "merged", tmp_path / "again")
