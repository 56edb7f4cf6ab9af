"""The GRPO update (lemon_core/update.py): a truncated completion (budget hit before a complete, valid
spec) contributes no gradient, while its reward still counts in its group's statistics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lemon_core.config import TrainConfig
from lemon_core.policy import OrchestratorPolicy
from lemon_core.reward import RewardTerms
from lemon_core.rollout import RolloutRecord
from lemon_core.update import grpo_update, record_advantages

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> OrchestratorPolicy:
    torch.set_num_threads(1)
    return OrchestratorPolicy.load(str(build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=1)))


def _record(policy: OrchestratorPolicy, reward: float, truncated: bool, sample: int) -> RolloutRecord:
    completion = [11, 12, 13, 14, 15]
    old = policy.logprobs([[3, 4, 5]], [completion])[0]
    return RolloutRecord(step=1, task_id="t", benchmark="b", sample=sample, prompt_ids=[3, 4, 5],
                         completion_ids=completion, old_logprobs=old, offsets=[(i, i + 1) for i in range(5)],
                         temperature=1.0, text="abcde", valid=not truncated, truncated=truncated,
                         reward=RewardTerms(total=reward))


def _frozen_optimizer(policy: OrchestratorPolicy) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """SGD at lr 0: an update computes its loss and gradient and keeps the weights, so tests can share the policy."""
    opt = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=0.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def _grad_norm_after(policy: OrchestratorPolicy, records: list[RolloutRecord], mask: bool) -> float:
    cfg = TrainConfig(grpo={"kl_coef": 0.0}, rollout={"mask_truncated": mask}, optim={"max_grad_norm": 1e9})
    return grpo_update(policy, None, records, *_frozen_optimizer(policy), cfg)["grad_norm"]


def test_a_truncated_completion_contributes_no_gradient(tiny_policy: OrchestratorPolicy) -> None:
    cut = _record(tiny_policy, -1.0, truncated=True, sample=0)
    fine = _record(tiny_policy, 1.0, truncated=False, sample=1)
    # group advantages use both rewards: [-1, +1]
    adv = record_advantages([cut, fine], TrainConfig().grpo)
    assert adv[0][0].item() == pytest.approx(-1.0, abs=1e-3) and adv[1][0].item() == pytest.approx(1.0, abs=1e-3)
    assert _grad_norm_after(tiny_policy, [cut], mask=True) == 0.0
    assert _grad_norm_after(tiny_policy, [cut, fine], mask=False) > 0.0
    # the same completion twice with opposite advantages cancels exactly when both are trained;
    # masking the truncated one leaves the other's gradient
    assert _grad_norm_after(tiny_policy, [cut, fine], mask=True) > 0.0
    assert _grad_norm_after(tiny_policy, [cut, fine], mask=False) == pytest.approx(0.0, abs=1e-6)


def test_an_update_reports_each_micro_batch_and_the_stage_prints_one_line(
    tiny_policy: OrchestratorPolicy, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CPU update of a few micro-batches runs for minutes: it logs a line per micro-batch, and the
    pipeline's train stage ends with one line of the step's figures (kfp.local and pod logs)."""
    from lemon_core.stages import update_line

    records = [_record(tiny_policy, float(i % 2), truncated=False, sample=i) for i in range(5)]
    cfg = TrainConfig(grpo={"kl_coef": 0.0}, optim={"micro_batch_size": 2})
    metrics = grpo_update(tiny_policy, None, records, *_frozen_optimizer(tiny_policy), cfg, progress=True)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("grpo update")]
    assert lines[:3] == [ln for ln in lines if "micro-batch " in ln][:3] and len(lines) == 4  # 3 + "done"
    assert lines[2].startswith("grpo update micro-batch 3/3 (100%)") and lines[3].startswith("grpo update done")
    line = update_line(2, {**metrics, "reward/mean": 0.4, "valid_rate": 1.0, "time/update_s": 75.0})
    assert line.startswith("update iteration 2 done in 1m15s: reward/mean=0.4 valid_rate=1 loss=")
    assert "kl=" in line and "grad_norm=" in line
    # rewards 0, 1, 0, 1, 0 in one group: it has spread, so no constant group
    assert (metrics["credit/groups"], metrics["credit/constant_groups"]) == (1, 0)
    assert line.endswith(" constant_groups=0/1")


def test_an_update_counts_the_groups_whose_samples_all_got_one_reward(tiny_policy: OrchestratorPolicy) -> None:
    """Six copies of one spec score alike, so the group term has nothing to learn: the update's metrics and the
    stage's line say so (make run's first update printed loss=0 with no reason given)."""
    from lemon_core.stages import update_line

    copies = [_record(tiny_policy, 0.5, truncated=False, sample=i) for i in range(3)]
    spread = [_record(tiny_policy, float(i % 2), truncated=False, sample=i) for i in range(3)]
    for r in spread:
        r.task_id = "u"
    cfg = TrainConfig(grpo={"kl_coef": 0.0})
    opt, sched = _frozen_optimizer(tiny_policy)
    metrics = grpo_update(tiny_policy, None, copies + spread, opt, sched, cfg)
    assert (metrics["credit/groups"], metrics["credit/constant_groups"]) == (2, 1)
    only_copies = grpo_update(tiny_policy, None, copies, opt, sched, cfg)
    assert (only_copies["credit/constant_groups"], only_copies["loss"]) == (1, 0.0)
    line = update_line(1, {**only_copies, "reward/mean": 0.5, "valid_rate": 1.0, "time/update_s": 3.0})
    assert line.endswith(" constant_groups=1/1")
