"""The pairwise credit term through the trainer's update (lemon_core/update.py) on a tiny model, and the edit's
written value it needs (counterfactual.written_value). Why: the span term cannot move a value the policy writes
with p ≈ 1; this term must raise the better value's log-prob at the same place, and do nothing when it is off."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from lemon_core.config import TrainConfig
from lemon_core.counterfactual import EditFamily, counterfactual_edits, written_value
from lemon_core.logprobs import offsets_from_token_ids
from lemon_core.policy import OrchestratorPolicy, spec_completion
from lemon_core.pool import load_pool
from lemon_core.reward import RewardTerms
from lemon_core.rollout import EditResult, RolloutRecord
from lemon_core.spec import AgentSpec, OrchestrationSpec
from lemon_core.spec_text import parse_spec
from lemon_core.update import grpo_update, record_credit, record_pairs

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

LEVEL_WORDS = (" small", " medium", " large")


def _chain(solver: str, checker: str) -> OrchestrationSpec:
    return OrchestrationSpec(agents=[
        AgentSpec(id="a1", role="Solver", base_role="solver", duty="Solve it.", capacity=solver),
        AgentSpec(id="a2", role="Checker", base_role="verifier", duty="Check it.", capacity=checker,
                  depends_on=["a1"]),
    ], output="a2")


def test_written_value_is_the_edits_value_only_where_the_text_reads_as_the_edited_spec() -> None:
    pool = load_pool("simulated")
    parsed = parse_spec(spec_completion(_chain("large", "large")), pool)
    edits = {(e.family, e.agent_id): e for e in counterfactual_edits(parsed, pool, list(EditFamily))}
    assert written_value(parsed, edits[(EditFamily.capacity_reset, "a2")], pool) == "small"
    assert written_value(parsed, edits[(EditFamily.capacity_downgrade, "a1")], pool) == "medium"
    assert written_value(parsed, edits[(EditFamily.drop_dependency, "a2")], pool) is None  # no value to write
    rollback = edits[(EditFamily.duty_rollback, "a2")]
    assert rollback.value is None and written_value(parsed, rollback, pool) is None  # capacity edits only


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "m", seed=0, whole_words=LEVEL_WORDS)


def _records(policy: OrchestratorPolicy, delta: float) -> list[RolloutRecord]:
    """A constant group of two identical (large, large) specs (Â = 0), each with the checker's capacity reset to
    `small` measured at r − r_edit = ``delta``."""
    pool = load_pool("simulated")
    text = spec_completion(_chain("large", "large"))
    parsed = parse_spec(text, pool)
    span = parsed.spans[("a2", "capacity")]
    body = list(policy.tokenizer(text, add_special_tokens=False)["input_ids"])
    completion = body + [policy.eos_ids[0]]
    prompt = policy.prompt_ids("Tom has 2 apples and gets 1 more. How many?", pool)
    offsets = offsets_from_token_ids(policy.tokenizer, body) + [(len(text), len(text))]
    return [RolloutRecord(
        step=1, task_id="t", benchmark="b", sample=j, prompt_ids=prompt, completion_ids=completion,
        old_logprobs=policy.logprobs([prompt], [completion])[0], offsets=offsets, temperature=1.0, text=text,
        valid=True, reward=RewardTerms(total=0.5),
        edits=[EditResult(family="capacity_reset", agent_id="a2", span=span, description="", reward=0.5 - delta,
                          delta=delta, value="small")],
    ) for j in range(2)]


def _value_logprob(policy: OrchestratorPolicy, record: RolloutRecord, value: str) -> float:
    """log π(the checker's capacity = value | the completion before it)."""
    start = record.text.index("capacity: large", record.text.index("a2")) + len("capacity:")
    ids = list(policy.tokenizer(record.text[:start], add_special_tokens=False)["input_ids"])
    word = policy.tokenizer(" " + value, add_special_tokens=False)["input_ids"]
    assert len(word) == 1
    return policy.logprobs([record.prompt_ids], [ids + word])[0][-1]


def _update(tiny: Path, delta: float, pair_coef: float) -> tuple[dict[str, float], float, float, float]:
    """One SGD update on the constant group; (metrics, Δ log π(small), Δ log π(large), largest weight change)."""
    torch.manual_seed(0)
    policy = OrchestratorPolicy.load(str(tiny), include_roles=False, include_format=False)
    ref = OrchestratorPolicy.load(str(tiny)).model.eval().requires_grad_(False)
    records = _records(policy, delta)
    cfg = TrainConfig(model=str(tiny), grpo=dict(kl_coef=0.04, cf_coef=0.0, cf_pair_coef=pair_coef,
                                                 cf_pair_beta=0.1),
                      optim=dict(micro_batch_size=2, max_grad_norm=1e9))
    small, large = _value_logprob(policy, records[0], "small"), _value_logprob(policy, records[0], "large")
    before = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=20.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    metrics = grpo_update(policy, ref, records, optimizer, scheduler, cfg)
    moved = max(float((v.detach() - before[k]).abs().max()) for k, v in policy.model.named_parameters())
    return (metrics, _value_logprob(policy, records[0], "small") - small,
            _value_logprob(policy, records[0], "large") - large, moved)


def test_the_pair_term_raises_the_better_value_at_the_same_place(tiny: Path) -> None:
    # the edit (small) measured better by 0.05: w = min(0.05 / (σ_min = 0.1), 2) = 0.5, so at π = π_ref the
    # pair loss is 0.5 · log 2 per pair, and no pair's margin is > 0 yet
    metrics, d_small, d_large, _ = _update(tiny, delta=-0.05, pair_coef=1.0)
    assert metrics["credit/pairs"] == 2
    assert metrics["credit/pair_loss"] == pytest.approx(0.5 * math.log(2), rel=1e-4)
    assert metrics["credit/pair_pref_acc"] == 0.0
    assert d_small > 0.05 and d_large < 0  # small gained, large lost, though the group term is 0 (constant group)

    _, d_small, d_large, _ = _update(tiny, delta=+0.05, pair_coef=1.0)  # the sampled value measured better
    assert d_large > 0 and d_small < 0


def test_the_pair_term_is_off_at_coef_zero(tiny: Path) -> None:
    metrics, d_small, d_large, moved = _update(tiny, delta=-0.05, pair_coef=0.0)
    assert "credit/pair_loss" not in metrics
    # a constant group, cf_coef 0 and π = π_ref: every advantage and the KL gradient are 0, nothing moves
    assert moved == 0.0 and d_small == 0.0 and d_large == 0.0


def test_the_pair_term_is_refused_under_fsdp(tiny: Path) -> None:
    """Its passes run over each rank's own pairs; under FSDP a forward is a collective, so ranks would hang."""
    from types import SimpleNamespace

    policy = OrchestratorPolicy.load(str(tiny), include_roles=False, include_format=False)
    cfg = TrainConfig(model=str(tiny), grpo=dict(cf_pair_coef=1.0))
    with pytest.raises(ValueError, match="not supported with distributed.strategy: fsdp"):
        grpo_update(policy, None, _records(policy, -0.05), None, None, cfg,  # type: ignore[arg-type]
                    strategy=SimpleNamespace(sharded=True))  # type: ignore[arg-type]


def test_only_capacity_edits_make_pairs(tiny: Path) -> None:
    """A duty rollback changes a span too, but its pair would push a whole sentence down against the reference: the
    edit carries no value to write there, so its measured contrast makes no pair; the capacity reset's does."""
    pool = load_pool("simulated")
    policy = OrchestratorPolicy.load(str(tiny), include_roles=False, include_format=False)
    records = _records(policy, delta=-0.05)
    parsed = parse_spec(records[0].text, pool)
    rollback = next(e for e in counterfactual_edits(parsed, pool, [EditFamily.duty_rollback]) if e.agent_id == "a2")
    for r in records:
        r.edits.append(EditResult(family="duty_rollback", agent_id="a2", span=rollback.span, description="",
                                  reward=0.6, delta=-0.1, value=written_value(parsed, rollback, pool)))
    cfg = TrainConfig(model=str(tiny), grpo=dict(cf_pair_coef=1.0)).grpo
    pairs = record_pairs(records, record_credit(records, cfg), cfg, policy.tokenizer)
    assert len(pairs) == 2  # one per record: the capacity reset's
    assert all(not p.original_better for p in pairs)  # the reset to `small` measured better
    word = policy.tokenizer(" small", add_special_tokens=False)["input_ids"]
    assert all(p.edited == word for p in pairs)
