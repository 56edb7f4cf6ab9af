"""Orchestrator policy: the prompt template, padding layout, seeded sampling and its old logprobs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lemon_core import policy as policy_module
from lemon_core.backends.shared_prefix import MIN_SHARED_PREFIX, shared_prefix_layout, shared_prefix_length
from lemon_core.baselines import chain
from lemon_core.policy import OrchestratorPolicy, orchestrator_messages, pack, spec_completion
from lemon_core.pool import load_pool
from lemon_core.roles import BASE_ROLES
from lemon_core.spec_text import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> OrchestratorPolicy:
    torch.set_num_threads(1)
    path = build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return OrchestratorPolicy.load(str(path), include_roles=False, include_format=False)


def test_prompt_lists_task_levels_prices_roles_and_a_parseable_example() -> None:
    pool = load_pool("simulated")
    system, user = (m["content"] for m in orchestrator_messages("What is 2 + 3?", pool))
    assert "orchestrator" in system
    assert user.endswith("Task:\nWhat is 2 + 3?")  # last: all that comes before is shared by every task
    for lv in pool.levels:
        assert f"- {lv.name}: ${lv.price_in_per_1m:g} in / ${lv.price_out_per_1m:g} out" in user
    roles_line = next(line for line in user.splitlines() if line.startswith("Base roles"))
    assert all(name in roles_line for name in BASE_ROLES)  # names only: the prompt is paid at every sample
    example = parse_spec("```yaml\n" + user.split("```yaml\n", 1)[1], pool).spec
    # the format example spans two levels: no single cheap agent is shown as the default answer
    assert [a.capacity for a in example.agents] == [pool.level_names[0], pool.level_names[-1]]
    assert "as cheap a capacity" not in user
    short = orchestrator_messages("What is 2 + 3?", pool, include_roles=False, include_format=False)[1][
        "content"
    ]
    assert "base_role" not in short and "```yaml block" in short and len(short) < len(user) / 3


def test_spec_completion_round_trips() -> None:
    spec = chain("large", length=2)
    assert parse_spec(spec_completion(spec), load_pool("simulated")).spec == spec


def test_pack_left_pads_prompts_and_right_pads_completions() -> None:
    ids, mask, start = pack([[1, 2, 3], [4]], [[5], [6, 7]], pad_id=0)
    assert start == 3
    assert ids.tolist() == [[1, 2, 3, 5, 0], [0, 0, 4, 6, 7]]
    assert mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]


def test_prompts_of_different_tasks_share_all_but_the_task(policy: OrchestratorPolicy) -> None:
    pool = load_pool("simulated")
    full = OrchestratorPolicy(policy.model, policy.tokenizer)  # roles and format example included
    a, b = full.prompt_ids("What is 2 + 3?", pool), full.prompt_ids("A train leaves at 9. When?", pool)
    shared = shared_prefix_length([a, b])
    tail = len(full.tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]) + 12  # task + chat end
    assert len(a) - tail <= shared < len(a) and a[:shared] == b[:shared]
    assert shared_prefix_length([a]) == 0 and shared_prefix_length([a, a]) == len(a) - 1  # one token of its own
    assert shared_prefix_length([[1] * 10 + [2], [1] * 10 + [3]]) == 0  # too short to be worth a pass


def test_shared_prefix_layout_puts_the_padding_between_prefix_and_own_tokens() -> None:
    ids, mask = shared_prefix_layout([[1, 2, 3, 4], [1, 2, 5]], prefix_len=2, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4], [1, 2, 0, 5]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 1]]
    plain, plain_mask = shared_prefix_layout([[1, 2, 3, 4], [1, 2, 5]], prefix_len=0, pad_id=0)
    assert plain.tolist() == [[1, 2, 3, 4], [0, 1, 2, 5]] and plain_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]


def test_sampling_over_a_shared_prefix_writes_what_full_prompts_write(
    policy: OrchestratorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefix is run once and its cache copied to every row; the samples must not change."""
    pool = load_pool("simulated")
    prompts = [policy.prompt_ids(q, pool) for q in ("What is 2 + 3?", "Add 4 and 9, then double it.", "Hi")]
    assert shared_prefix_length(prompts) >= MIN_SHARED_PREFIX
    runs = {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(policy_module, "shared_prefix_length", lambda _prompts: 0)
        runs[shared] = [
            [s.completion_ids for g in policy.sample(prompts, 2, max_new_tokens=10, temperature=t, seed=5,
                                                     with_logprobs=False) for s in g]
            for t in (0.0, 1.0)
        ]
    assert runs[True] == runs[False]


def test_sampling_is_seeded_and_old_logprobs_match_a_fresh_forward_pass(policy: OrchestratorPolicy) -> None:
    pool = load_pool("simulated")
    prompts = [policy.prompt_ids("What is 2 + 3?", pool), policy.prompt_ids("Add 4 and 9.", pool)]
    a = policy.sample(prompts, 3, max_new_tokens=12, temperature=1.0, seed=7)
    b = policy.sample(prompts, 3, max_new_tokens=12, temperature=1.0, seed=7)
    c = policy.sample(prompts, 3, max_new_tokens=12, temperature=1.0, seed=8)
    flat = lambda groups: [s.completion_ids for g in groups for s in g]  # noqa: E731
    assert flat(a) == flat(b) and flat(a) != flat(c)
    assert [len(g) for g in a] == [3, 3] and all(
        s.prompt_ids == prompts[i] for i, g in enumerate(a) for s in g
    )
    for group in a:
        for s in group:
            assert len(s.old_logprobs) == len(s.completion_ids) == len(s.offsets)
            alone = policy.logprobs([s.prompt_ids], [s.completion_ids], temperature=1.0)[0]
            assert alone == pytest.approx(s.old_logprobs, abs=1e-4)  # batch padding does not change them
            assert all(lp <= 0 for lp in s.old_logprobs)
            if s.finished:
                assert s.completion_ids[-1] in policy.eos_ids
            body = s.completion_ids[:-1] if s.finished else s.completion_ids
            assert s.text == policy.tokenizer.decode(body, skip_special_tokens=False)
            assert s.offsets[len(body) - 1][1] == len(s.text) if body else True


def test_temperature_changes_the_logprob_convention(policy: OrchestratorPolicy) -> None:
    pool = load_pool("simulated")
    prompt = policy.prompt_ids("What is 2 + 3?", pool)
    s = policy.sample([prompt], 1, max_new_tokens=6, temperature=0.5, seed=1)[0][0]
    assert s.old_logprobs == pytest.approx(
        policy.logprobs([prompt], [s.completion_ids], temperature=0.5)[0], abs=1e-4
    )
    assert s.old_logprobs != pytest.approx(
        policy.logprobs([prompt], [s.completion_ids], temperature=1.0)[0], abs=1e-4
    )


def test_greedy_sampling_is_deterministic_across_seeds(policy: OrchestratorPolicy) -> None:
    prompt = policy.prompt_ids("What is 2 + 3?", load_pool("simulated"))
    g1 = policy.sample([prompt], 2, max_new_tokens=8, temperature=0.0, seed=1)[0]
    g2 = policy.sample([prompt], 1, max_new_tokens=8, temperature=0.0, seed=99)[0]
    assert g1[0].completion_ids == g1[1].completion_ids == g2[0].completion_ids


def test_sampling_without_logprobs_gives_the_same_text_and_skips_the_scoring_pass(
    policy: OrchestratorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluation and the valid-rate check never train on their samples: no old log-prob forward pass."""
    prompt = policy.prompt_ids("What is 2 + 3?", load_pool("simulated"))
    full = policy.sample([prompt], 2, max_new_tokens=8, temperature=1.0, seed=3)[0]
    monkeypatch.setattr(policy, "logprobs", lambda *a, **k: pytest.fail("scored samples nobody trains on"))
    bare = policy.sample([prompt], 2, max_new_tokens=8, temperature=1.0, seed=3, with_logprobs=False)[0]
    assert [s.completion_ids for s in bare] == [s.completion_ids for s in full]
    assert [s.text for s in bare] == [s.text for s in full] and all(s.old_logprobs == [] for s in bare)


def test_bad_arguments_are_named(policy: OrchestratorPolicy) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy.sample([[1, 2]], 1, max_new_tokens=0)
    with pytest.raises(ValueError, match="dtype"):
        OrchestratorPolicy.load("whatever", dtype="int8")
