"""SFT warm-up: templated specs are valid, teacher files are checked, loss on completion tokens only."""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

import pytest
import torch

from lemon_core.baselines import cot
from lemon_core.config import TOPOLOGIES, SFTConfig
from lemon_core.policy import OrchestratorPolicy, spec_completion
from lemon_core.pool import load_pool
from lemon_core.roles import BASE_ROLES
from lemon_core.sft import load_teacher, sft_loss, sft_pairs, sft_train, templated_spec
from lemon_core.spec_text import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

POOL = load_pool("simulated")


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> OrchestratorPolicy:
    torch.set_num_threads(1)
    path = build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=1)
    return OrchestratorPolicy.load(str(path), include_roles=False, include_format=False)


def test_templated_specs_are_valid_and_cover_the_edit_space() -> None:
    rng, cfg = random.Random(0), SFTConfig()
    specs = [templated_spec(POOL, rng, cfg) for _ in range(200)]
    for s in specs:
        assert parse_spec(spec_completion(s), POOL).spec == s
    agents = [a for s in specs for a in s.agents]
    assert {a.capacity for a in agents} == set(POOL.level_names)
    assert any(a.duty == BASE_ROLES[a.base_role] for a in agents)  # default duties ...
    assert any(a.duty != BASE_ROLES[a.base_role] for a in agents)  # ... and customised ones
    assert any(a.depends_on for a in agents) and len({len(s.agents) for s in specs}) >= 3
    with pytest.raises(ValueError, match="unknown topology 'star'"):
        templated_spec(POOL, rng, SFTConfig(topologies=["star"]))
    assert set(TOPOLOGIES) >= {"cot", "sc", "chain"}


def test_teacher_jsonl_is_checked_line_by_line(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(
        json.dumps({"question": "q1", "spec": spec_completion(cot("medium"))})
        + "\n\n"
        + json.dumps({"question": "q2", "spec": cot("small").model_dump()})
        + "\n"
    )
    pairs = load_teacher(good, POOL)
    assert [q for q, _ in pairs] == ["q1", "q2"] and "capacity: small" in pairs[1][1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"question": "q", "spec": spec_completion(cot("medium"))})
        + "\n"
        + json.dumps({"question": "q", "spec": spec_completion(cot("huge"))})
        + "\n"
    )
    with pytest.raises(ValueError, match=r"bad.jsonl line 2: teacher spec is invalid: .*huge"):
        load_teacher(bad, POOL)
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="line 1: expected JSON"):
        load_teacher(bad, POOL)
    pairs = sft_pairs(["a", "b"], POOL, SFTConfig(pairs_per_task=2, teacher_jsonl=str(good)), seed=0)
    assert len(pairs) == 6


def test_sft_loss_is_the_mean_nll_of_completion_tokens_only(policy: OrchestratorPolicy) -> None:
    batch = [
        ("What is 1 + 1?", spec_completion(cot("small"))),
        ("Add 3 and 4.", spec_completion(cot("large"))),
    ]
    loss = sft_loss(policy, batch, POOL).item()
    lps = [policy.logprobs([policy.prompt_ids(q, POOL)], [policy.completion_ids(c)])[0] for q, c in batch]
    assert loss == pytest.approx(-statistics.fmean(x for row in lps for x in row), rel=1e-4)
    assert policy.completion_ids("abc")[-1] == policy.eos_ids[0]


def test_sft_lowers_the_loss(policy: OrchestratorPolicy) -> None:
    pairs = sft_pairs(
        [f"What is {i} + 1?" for i in range(4)], POOL, SFTConfig(topologies=["cot"], vary_text=False), seed=0
    )
    losses = sft_train(policy, pairs, POOL, SFTConfig(steps=8, batch_size=4, lr=3e-3))
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0]


def test_a_budget_below_the_targets_95th_percentile_is_refused(policy: OrchestratorPolicy) -> None:
    from lemon_core.errors import ConfigError
    from lemon_core.sft import check_token_budget

    pool = load_pool("cpu")
    targets = [c for _, c in sft_pairs([f"q{i}" for i in range(40)], pool, SFTConfig(), seed=0)]
    lengths = sorted(len(policy.completion_ids(c)) for c in targets)
    p95 = lengths[int(0.95 * len(lengths))]
    assert check_token_budget(policy, targets, p95)["p95"] == p95
    with pytest.raises(ConfigError, match=rf"rollout.max_new_tokens={p95 - 1} .*\({p95} tokens\).*at least {p95}"):
        check_token_budget(policy, targets, p95 - 1)


def test_the_valid_spec_check_logs_a_line_per_sampled_chunk(
    policy: OrchestratorPolicy, capsys: pytest.CaptureFixture[str]
) -> None:
    """64 samples of an untrained CPU policy take minutes: the check reports every batch of 32 samples."""
    from lemon_core.sft import VALID_CHECK_BATCH, valid_spec_rate

    rate = valid_spec_rate(policy, [f"What is {i} + 1?" for i in range(16)], POOL, samples=4, max_new_tokens=6,
                           progress=True, desc="valid-spec check before SFT")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("valid-spec check before SFT")]
    assert VALID_CHECK_BATCH == 32
    assert [ln.split(",")[0] for ln in lines[:2]] == ["valid-spec check before SFT sample 32/64 (50%)",
                                                     "valid-spec check before SFT sample 64/64 (100%)"]
    assert 0.0 <= rate <= 1.0 and "valid=" in lines[1] and lines[-1].startswith("valid-spec check before SFT done")


@pytest.mark.parametrize("check_before", [True, False])
def test_the_check_before_sft_can_be_skipped(
    policy: OrchestratorPolicy, check_before: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sft.check_before: false` skips sampling the base model (1 min 44 s of the README's CPU run): the report
    says `valid_rate_before: None` and no 'before' check runs; the check after SFT still does."""
    from lemon_core.benchmarks import Example
    from lemon_core.config import TrainConfig
    from lemon_core.sft import sft_warmup

    cfg = TrainConfig.from_yaml("train-tiny", model="unused", rollout={"max_new_tokens": 8},
                                sft={"steps": 1, "batch_size": 1, "eval_tasks": 1, "check_before": check_before})
    tasks = [Example(id="t/0", benchmark="multiarith", question="What is 1 + 1?", answer="2",
                     answer_format="Answer with a number.")]
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    report = sft_warmup(policy, cfg, POOL, tasks, ["What is 2 + 2?"], progress=True)
    policy.model.load_state_dict(state)  # the module's policy stays untrained for the other tests
    err = capsys.readouterr().err
    assert ("valid-spec check before SFT" in err) is check_before
    assert (report.valid_rate_before is not None) is check_before
    assert report.valid_rate_after is not None and "valid-spec check after SFT round 1" in err


def test_the_teacher_sweep_teaches_its_best_candidate_and_logs_what_it_measured(
    policy: OrchestratorPolicy, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sft.teacher: sweep` adds one SFT pair per task with the sweep's best spec, and the stage's log names
    the taught candidate next to every close rival's solved count and interval (the choice was made from these)."""
    from lemon_core.backends.simulated import register_examples
    from lemon_core.benchmarks import Example
    from lemon_core.config import TrainConfig
    from lemon_core.rollout import benchmark_scorer
    from lemon_core.sft import teacher_pairs

    cfg = TrainConfig.from_yaml("train-tiny", model="unused", rollout={"max_new_tokens": 200, "check_budget": False},
                                sft={"teacher": "sweep", "sweep": {"topologies": ["cot"], "max_tasks": 4}})
    tasks = [Example(id=f"gsm8k/test/{i}", benchmark="gsm8k", question=f"Sam has {i} apples and buys 2. How many?",
                     answer=str(i + 2), answer_format="Answer with a number.") for i in range(4)]
    register_examples(tasks)
    pairs, report = teacher_pairs(policy, cfg, POOL, tasks, benchmark_scorer, progress=True)
    assert report is not None and sum(report["taught"].values()) == 4
    taught = next(iter(report["taught"]))
    assert report["candidates"][0]["candidate"] == taught  # the best mean reward is what is taught
    assert [q for q, _ in pairs[-4:]] == [t.question for t in tasks]
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("teacher sweep: taught"))
    assert line.startswith(f"teacher sweep: taught {taught}; measured {taught} ")
    assert all(f"cot@{level} " in line for level in POOL.level_names)  # 3 candidates, all shown, with intervals
    assert line.count("/4 [") == len(POOL.level_names)
