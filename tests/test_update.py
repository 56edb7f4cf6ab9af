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


def _grad_norm_after(policy: OrchestratorPolicy, records: list[RolloutRecord], mask: bool) -> float:
    cfg = TrainConfig(grpo={"kl_coef": 0.0}, rollout={"mask_truncated": mask}, optim={"max_grad_norm": 1e9})
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.0)  # lr 0: look at the gradient, keep the weights
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return grpo_update(policy, None, records, opt, sched, cfg)["grad_norm"]


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
