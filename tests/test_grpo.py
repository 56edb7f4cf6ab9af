"""GRPO loss math on hand-computed values (lemon_core/grpo.py)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from lemon_core.grpo import (
    GRPOConfig,
    batched_group_advantages,
    cap_span_term,
    contrast_divisors,
    counterfactual_token_advantages,
    credit_advantages,
    group_advantages,
    grpo_loss,
    k3_kl,
    replaced_span_advantages,
    span_mask_from_tokenizer,
    span_token_mask,
    token_advantages,
    uniform_success_rows,
)
from lemon_core.logprobs import offsets_from_token_ids, sequence_logprobs

# ------------------------------------------------------------------ config


def test_config_defaults_and_errors() -> None:
    cfg = GRPOConfig()
    assert (cfg.clip_eps, cfg.kl_coef, cfg.cf_coef, cfg.loss_aggregation) == (0.2, 0.04, 4.0, "token")
    assert not cfg.cf_weight_by_abs_delta  # the linear span term (bench/credit.py: the quadratic one did nothing)
    assert (cfg.cf_delta_scale, cfg.cf_clip) == ("group_std", 2.0)
    assert (cfg.std_floor, cfg.drop_uniform_success_groups, cfg.cf_max_ratio, cfg.cf_ratio_floor) == (
        0.1, False, 1.0, 0.5)  # cf_max_ratio 1 since 2026-12-07 (bench/credit.py, with capacity_reset)
    with pytest.raises(ValidationError, match="std_floor"):
        GRPOConfig(std_floor=-0.1)
    with pytest.raises(ValidationError, match="cf_max_ratio"):
        GRPOConfig(cf_max_ratio=0.0)
    with pytest.raises(ValidationError, match="cf_delta_scale"):
        GRPOConfig(cf_delta_scale="batch_std")
    with pytest.raises(ValidationError, match="cf_clip"):
        GRPOConfig(cf_clip=0.0)
    assert cfg.eps_low == cfg.eps_high == 0.2
    assert GRPOConfig(clip_eps_high=0.28).eps_high == 0.28
    with pytest.raises(ValidationError, match="clip_eps"):
        GRPOConfig(clip_eps=1.5)
    with pytest.raises(ValidationError, match="loss_aggregation"):
        GRPOConfig(loss_aggregation="mean")
    with pytest.raises(ValidationError, match="beta"):
        GRPOConfig(beta=0.1)  # unknown keys are rejected, not silently ignored


# ------------------------------------------------------------------ advantages


def test_group_advantages_population_std_by_hand() -> None:
    # mean 0.5, population std sqrt(((.5)^2 * 4) / 4) = 0.5  ->  (r - .5) / .5
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], std_eps=0.0)
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0]
    # [3, 1, 2]: mean 2, var (1 + 1 + 0) / 3, std sqrt(2/3) = 0.8165
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0]), std_eps=1e-6)
    s = math.sqrt(2 / 3) + 1e-6
    assert adv.tolist() == pytest.approx([1 / s, -1 / s, 0.0], abs=1e-6)
    assert group_advantages([3.0, 1.0, 2.0], scale=False).tolist() == [1.0, -1.0, 0.0]
    assert adv.dtype == torch.float32


def test_group_advantages_constant_group_is_zero_not_nan() -> None:
    for rewards in ([0.1, 0.1, 0.1], [0.0] * 4, [-2.5], [1e9, 1e9]):
        adv = group_advantages(rewards)
        assert torch.equal(adv, torch.zeros(len(rewards)))


def test_group_advantages_bad_input() -> None:
    with pytest.raises(ValueError, match="rewards"):
        group_advantages([])
    with pytest.raises(ValueError, match="NaN"):
        group_advantages([1.0, float("nan")])


def test_batched_group_advantages_matches_per_group() -> None:
    rewards = [1.0, 5.0, 0.0, 5.0, 0.0, 1.0, 2.0, 5.0]
    ids = ["a", "b", "a", "b", "a", "a", "c", "b"]  # b is constant, c a singleton, rows interleaved
    got = batched_group_advantages(rewards, ids)
    want = torch.zeros(8)
    for g in set(ids):
        rows = [i for i, x in enumerate(ids) if x == g]
        want[rows] = group_advantages([rewards[i] for i in rows])
    assert torch.allclose(got, want, atol=1e-6)
    assert got[[1, 3, 7]].tolist() == [0.0, 0.0, 0.0] and got[6].item() == 0.0
    assert got[[0, 2, 4, 5]].tolist() == pytest.approx([1, -1, -1, 1], abs=1e-5)
    unscaled = batched_group_advantages(rewards, torch.tensor([0, 1, 0, 1, 0, 0, 2, 1]), scale=False)
    assert unscaled[[0, 2, 4, 5]].tolist() == [0.5, -0.5, -0.5, 0.5]
    with pytest.raises(ValueError, match="group_ids"):
        batched_group_advantages([1.0, 2.0], [0])


# ------------------------------------------------------------------ span masks


def test_span_token_mask_overlap_rule() -> None:
    # text "capacity: large\n" ; tokens: "capacity" ":" " l" "arge" "\n" + a zero-width special token
    offsets = [(0, 8), (8, 9), (9, 11), (11, 15), (15, 16), (0, 0)]
    span = (10, 15)  # "large"
    assert span_token_mask(offsets, span).tolist() == [False, False, True, True, False, False]
    # span at the very start and the very end of the text
    assert span_token_mask(offsets, (0, 3)).tolist() == [True, False, False, False, False, False]
    assert span_token_mask(offsets, (15, 16)).tolist() == [False, False, False, False, True, False]
    # a span touching a token only at its boundary does not select it (end is exclusive)
    assert span_token_mask(offsets, (8, 9)).tolist() == [False, True, False, False, False, False]
    # zero-width tokens never count, even inside the span
    assert span_token_mask([(3, 3), (2, 5)], (0, 10)).tolist() == [False, True]
    assert span_token_mask([], (0, 1)).shape == (0,)


def test_span_token_mask_bad_span() -> None:
    with pytest.raises(ValueError, match="span"):
        span_token_mask([(0, 1)], (3, 3))
    with pytest.raises(ValueError, match="span"):
        span_token_mask([(0, 1)], (-1, 2))
    with pytest.raises(ValueError, match="offsets"):
        span_token_mask([0, 1, 2], (0, 1))


@pytest.fixture(scope="module")
def yaml_tokenizer():  # noqa: ANN201 - a transformers tokenizer
    """A tiny byte-level BPE trained offline on spec-like YAML, wrapped as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "agents:\n  - id: solver\n    role: arithmetic solver\n    capacity: large\n    depends_on: []\n",
        "  - id: verifier\n    capacity: small\n    depends_on: [solver]\n",
        "output: solver\n",
        "capacity: medium\n",
    ] * 5
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<pad>"]
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_span_mask_from_real_tokenizer_covers_exactly_the_value(yaml_tokenizer) -> None:  # noqa: ANN001
    text = "  - id: solver\n    capacity: large\n    depends_on: []\n"
    start = text.index("large")
    span = (start, start + len("large"))
    mask = span_mask_from_tokenizer(yaml_tokenizer, text, span)
    enc = yaml_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    assert mask.shape == (len(enc["input_ids"]),)
    picked = [i for i in range(len(offsets)) if mask[i]]
    assert picked == list(range(picked[0], picked[-1] + 1))  # one contiguous run
    covered = "".join(text[a:b] for a, b in (offsets[i] for i in picked))
    assert covered.strip() == "large"  # nothing from "capacity:" or the next line
    assert offsets[picked[0]][0] <= span[0] and offsets[picked[-1]][1] >= span[1]  # all of "large"
    before, after = offsets[picked[0] - 1], offsets[picked[-1] + 1]
    assert before[1] <= span[0] and after[0] >= span[1]
    with pytest.raises(ValueError, match="past the text"):
        span_mask_from_tokenizer(yaml_tokenizer, text, (0, len(text) + 1))


def test_offsets_from_sampled_ids_match_offset_mapping(yaml_tokenizer) -> None:  # noqa: ANN001
    text = "  - id: verifier\n    capacity: small\n"
    enc = yaml_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    want = [tuple(o) for o in enc["offset_mapping"]]
    assert offsets_from_token_ids(yaml_tokenizer, enc["input_ids"]) == want


# ------------------------------------------------------------------ token advantages


def test_counterfactual_token_advantages_by_hand() -> None:
    m1 = torch.tensor([False, False, True, True, False, False])
    m2 = torch.tensor([False, False, False, True, True, False])
    # beta=0.5: edit 1, delta=+0.4 -> 0.5*0.4*0.4 = 0.08 ; edit 2, delta=-0.2 -> 0.5*0.2*(-0.2) = -0.02
    adv = counterfactual_token_advantages(6, [(m1, 0.4), (m2, -0.2)], cf_coef=0.5)
    assert adv.tolist() == pytest.approx([0, 0, 0.08, 0.06, -0.02, 0], abs=1e-7)
    assert adv[[0, 1, 5]].tolist() == [0.0, 0.0, 0.0]  # exactly zero outside every span
    linear = counterfactual_token_advantages(6, [(m1, 0.4), (m2, -0.2)], 0.5, weight_by_abs_delta=False)
    assert linear.tolist() == pytest.approx([0, 0, 0.2, 0.1, -0.1, 0], abs=1e-7)
    assert counterfactual_token_advantages(6, [], 1.0).tolist() == [0.0] * 6
    full = token_advantages(-1.5, 6, adv)
    assert full.tolist() == pytest.approx([-1.5, -1.5, -1.42, -1.44, -1.52, -1.5], abs=1e-6)
    assert token_advantages(0.25, 3).tolist() == [0.25] * 3


def test_contrast_divisors_are_the_group_std_of_the_advantage() -> None:
    # group a: [1, 0, 0, 1] std 0.5; group b: [0.3, 0.3] constant; group c: [2, 0] std 1
    rewards = [1.0, 0.0, 0.3, 0.0, 2.0, 1.0, 0.3, 0.0]
    ids = ["a", "a", "b", "a", "c", "a", "b", "c"]
    cfg = GRPOConfig(cf_delta_scale="group_std", std_eps=1e-3, std_floor=0.0)  # floor: see the next section
    got = contrast_divisors(rewards, ids, cfg)
    assert got == pytest.approx([0.501, 0.501, 1.0, 0.501, 1.001, 0.501, 1.0, 1.001], abs=1e-12)
    # the divisor is exactly the one of the group advantage: delta / divisor == A_i - A(edit)
    adv = batched_group_advantages(rewards, ids, std_eps=1e-3)
    assert adv[0].item() - (0.0 - 0.5) / 0.501 == pytest.approx((1.0 - 0.0) / got[0], abs=1e-6)
    assert contrast_divisors(rewards, ids, cfg.model_copy(update={"cf_delta_scale": "none"})) == [1.0] * 8
    assert contrast_divisors(rewards, ids, cfg.model_copy(update={"scale_rewards": False})) == [1.0] * 8


def test_scaled_and_clipped_counterfactual_by_hand() -> None:
    m1 = torch.tensor([False, True, True, False, False])
    m2 = torch.tensor([False, False, False, True, False])
    edits = [(m1, 0.3), (m2, -1.0)]
    # divisor 0.25: 0.3 -> 1.2 ; -1.0 -> -4 -> clipped to -2.  beta 0.5: 0.5*1.2*1.2 = 0.72 ; 0.5*2*(-2) = -2
    adv = counterfactual_token_advantages(5, edits, 0.5, delta_divisor=0.25, delta_clip=2.0)
    assert adv.tolist() == pytest.approx([0, 0.72, 0.72, -2.0, 0], abs=1e-6)
    linear = counterfactual_token_advantages(5, edits, 0.5, False, delta_divisor=0.25, delta_clip=2.0)
    assert linear.tolist() == pytest.approx([0, 0.6, 0.6, -1.0, 0], abs=1e-6)
    unclipped = counterfactual_token_advantages(5, edits, 0.5, delta_divisor=0.25)
    assert unclipped[3].item() == pytest.approx(-8.0)
    # tokens outside every span keep exactly the group advantage
    full = token_advantages(-0.8, 5, adv)
    assert full[[0, 4]].tolist() == [pytest.approx(-0.8)] * 2 and full[0].item() == torch.tensor(-0.8).item()
    with pytest.raises(ValueError, match="delta_divisor"):
        counterfactual_token_advantages(5, edits, 0.5, delta_divisor=0.0)


def test_constant_group_uses_raw_delta_not_delta_over_eps() -> None:
    """All six specs chose `large` and tied (std 0, A = 0); the downgrade edit to `medium` scored 0.3 more.

    Dividing by std_eps would make that -0.3 a -3e5 push (clipped to -c for any contrast however tiny);
    instead the constant group keeps the raw contrast: beta*|-0.3|*(-0.3) = -0.09 on the span only.
    """
    rewards, ids = [0.7] * 6, [0] * 6
    cfg = GRPOConfig(cf_delta_scale="group_std", cf_clip=2.0, std_floor=0.0)  # no floor: the old rule
    (divisor, *_) = contrast_divisors(rewards, ids, cfg)
    assert divisor == 1.0
    span = torch.tensor([False, False, True, False])
    cf = counterfactual_token_advantages(4, [(span, 0.7 - 1.0)], 1.0, delta_divisor=divisor, delta_clip=cfg.cf_clip)
    adv = token_advantages(batched_group_advantages(rewards, ids)[0].item(), 4, cf)
    assert adv.tolist() == pytest.approx([0.0, 0.0, -0.09, 0.0], abs=1e-6)
    assert adv[[0, 1, 3]].tolist() == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------ calibrated credit (issue #10)


def test_std_floor_by_hand() -> None:
    # [0.50, 0.52]: std 0.01; with floor 0.1 the advantages are ±0.01 / 0.1 = ±0.1, not ±1
    assert group_advantages([0.50, 0.52], std_eps=0.0, std_floor=0.1).tolist() == pytest.approx([-0.1, 0.1])
    assert group_advantages([0.50, 0.52], std_eps=0.0).tolist() == pytest.approx([-1.0, 1.0])
    # a group that differs in success has std 0.5 > floor: unchanged
    assert group_advantages([1.0, 0.0], std_eps=0.0, std_floor=0.1).tolist() == [1.0, -1.0]
    got = batched_group_advantages([0.50, 1.0, 0.52, 0.0], ["p", "s", "p", "s"], std_eps=0.0, std_floor=0.1)
    assert got.tolist() == pytest.approx([-0.1, 1.0, 0.1, -1.0])


def test_group_differing_only_in_price_gets_advantages_under_the_floor() -> None:
    """Issue #10.4: all six specs wrong, rewards differ by cost only (σ ≈ 0.012); a downgrade of a `large`
    span saved 0.02. Before: Â = ±1.4 and the span term −β·2·2 = −4 (clipped at 2) on that span."""
    rewards = [-0.030, -0.045, -0.020, -0.050, -0.025, -0.040]  # mean -0.035, σ = 0.0112
    ids = ["t"] * 6
    mask = torch.tensor([False, True, False])
    edits = [[(mask, -0.02, "capacity_downgrade")]] + [[] for _ in range(5)]
    cfg = GRPOConfig()
    credit = credit_advantages(rewards, ids, [0.0] * 6, [3] * 6, edits, cfg)
    group = torch.stack([a[0] for a in credit.advantages])
    centred = torch.tensor(rewards, dtype=torch.float64) - sum(rewards) / 6
    assert group.tolist() == pytest.approx((centred / (0.1 + 1e-6)).tolist(), abs=1e-6)
    assert group.abs().max().item() < 0.16  # a right-vs-wrong group has ±1
    # span: Δ̃ = -0.02 / 0.1 = -0.2, β·Δ̃ = 4 · -0.2 = -0.8 on top of Â_0 = 0.005 / 0.1 = 0.05, capped at
    # ρ · max(|Â|, a_min) = 1 · 0.5 = 0.5 (0.25 at ρ = 0.5, 2026-12-06 to -07; the cap of 2 before let all of -0.8
    # through)
    assert credit.advantages[0].tolist() == pytest.approx([0.05, 0.05 - 0.5, 0.05], abs=1e-5)
    half = credit_advantages(rewards, ids, [0.0] * 6, [3] * 6, edits, GRPOConfig(cf_max_ratio=0.5))
    assert half.advantages[0].tolist() == pytest.approx([0.05, 0.05 - 0.25, 0.05], abs=1e-5)
    assert (credit.groups, credit.floored_groups, credit.dropped_groups, credit.capped_tokens) == (1, 1, 0, 1)
    wide = credit_advantages(rewards, ids, [0.0] * 6, [3] * 6, edits, GRPOConfig(cf_max_ratio=2.0))
    assert wide.advantages[0].tolist() == pytest.approx([0.05, 0.05 - 0.8, 0.05], abs=1e-5)  # under 2 · 0.5
    assert credit.constant_groups == 0  # price-only differences are still differences
    assert credit.scaled_delta_abs == {"capacity_downgrade": pytest.approx(0.2, abs=1e-5)}
    # the quadratic weight at β = 1 (the default before 2026-12-05) makes it -0.04
    quadratic = credit_advantages(rewards, ids, [0.0] * 6, [3] * 6, edits,
                                  GRPOConfig(cf_coef=1.0, cf_weight_by_abs_delta=True))
    assert quadratic.advantages[0].tolist() == pytest.approx([0.05, 0.05 - 0.04, 0.05], abs=1e-5)
    # without the floor (the old behaviour) the same group gets full-size advantages and a -4 span term
    old = credit_advantages(rewards, ids, [0.0] * 6, [3] * 6, edits,
                            GRPOConfig(std_floor=0.0, cf_max_ratio=None))
    assert max(abs(a[0].item()) for a in old.advantages) > 1.3 and old.advantages[0][1].item() < -2.5


def test_std_scaling_prefers_the_cheap_usually_right_spec_centring_the_better_one() -> None:
    """Why ``scale_rewards`` matters once price is in the reward (bench/credit.py, 2026-12-05).

    Spec A is dear and right 95% of the time, spec B cheap and right 59% (bench/credit.py's (large, small) and
    (medium, medium) pairs: expected rewards 0.638 and 0.501). In a group of 3 A + 3 B (the copies of one spec
    share their outcome, as on the simulated pool), std scaling gives every outcome an advantage of ±1, so it
    counts who wins, and B wins whenever both are right (the cheaper one). Centring keeps the size of the
    win, and its expected advantage is half the gap of the expected rewards."""
    p_a, p_b = 0.95, 0.594
    reward_a, reward_b = {True: 0.688, False: -0.312}, {True: 0.907, False: -0.093}
    expected: dict[bool, float] = {True: 0.0, False: 0.0}
    for a_right in (True, False):
        for b_right in (True, False):
            chance = (p_a if a_right else 1 - p_a) * (p_b if b_right else 1 - p_b)
            rewards = [reward_a[a_right]] * 3 + [reward_b[b_right]] * 3
            for scale in (True, False):
                adv = batched_group_advantages(rewards, [0] * 6, scale=scale, std_floor=0.1)
                expected[scale] += chance * float(adv[0])
    mean_a = p_a * reward_a[True] + (1 - p_a) * reward_a[False]
    mean_b = p_b * reward_b[True] + (1 - p_b) * reward_b[False]
    assert mean_a > mean_b  # A is the better spec ...
    assert expected[True] < -0.2  # ... but std scaling pushes A down
    assert expected[False] == pytest.approx((mean_a - mean_b) / 2, abs=1e-6)  # centring pushes it up


def test_contrast_divisor_uses_the_same_floor_constant_group_included() -> None:
    rewards = [0.50, 0.52, 0.7, 0.7, 1.0, 0.0]  # std 0.01 (floored), constant, std 0.5
    ids = ["a", "a", "b", "b", "c", "c"]
    got = contrast_divisors(rewards, ids, GRPOConfig(std_eps=1e-3))
    assert got == pytest.approx([0.101, 0.101, 0.101, 0.101, 0.501, 0.501], abs=1e-12)


def test_span_term_never_outweighs_the_group_term_by_more_than_the_ratio() -> None:
    # by hand: Â = 1.5, ρ = 2 -> cap 3; a span term of -4 becomes -3, +1 stays
    span = torch.tensor([0.0, -4.0, 1.0])
    assert cap_span_term(span, 1.5, 2.0, 0.5).tolist() == [0.0, -3.0, 1.0]
    # Â = 0.1 < a_min = 0.5 -> cap 2 * 0.5 = 1
    assert cap_span_term(span, -0.1, 2.0, 0.5).tolist() == [0.0, -1.0, 1.0]
    assert cap_span_term(span, 0.0, None, 0.5).tolist() == span.tolist()
    # end to end on random groups and edits: |A_t - Â| <= ρ · max(|Â|, a_min) on every token
    gen = torch.Generator().manual_seed(0)
    cfg = GRPOConfig(cf_coef=3.0, cf_max_ratio=1.5, cf_ratio_floor=0.2)
    rewards = (torch.rand(24, generator=gen) * torch.tensor([1.0, 0.03]).repeat(12)).tolist()
    ids = [i // 6 for i in range(24)]
    edits = [[(torch.rand(8, generator=gen) < 0.4, float(torch.randn(1, generator=gen)), "duty_rollback")]
             for _ in range(24)]
    credit = credit_advantages(rewards, ids, [r > 0.5 for r in rewards], [8] * 24, edits, cfg)
    group = batched_group_advantages(rewards, ids, cfg.std_eps, std_floor=cfg.std_floor)
    hit = 0
    for adv, a in zip(credit.advantages, group.tolist(), strict=True):
        bound = 1.5 * max(abs(a), 0.2)
        assert (adv - a).abs().max().item() <= bound + 1e-5
        hit += int(((adv - a).abs() > bound - 1e-5).sum())
    assert credit.capped_tokens > 0 and hit >= credit.capped_tokens


def test_replace_mode_gives_the_span_its_contrast_and_no_group_term() -> None:
    """cf_span_credit='replace': a right spec (Â = +1) whose checker `medium` cost 0.05 more than a `small` one
    gets -0.05/σ on the checker's tokens, not +1 - 0.1 as under 'add'; its other tokens keep Â."""
    rewards = [1.0, 0.0, 1.0, 0.0]  # σ = 0.5, Â = ±1
    ids = ["t"] * 4
    checker, solver = torch.tensor([False, True, False, False]), torch.tensor([False, False, False, True])
    edits = [[(checker, -0.05, "capacity_downgrade"), (solver, 0.9, "capacity_downgrade")], [], [], []]
    replace = credit_advantages(rewards, ids, [1.0, 0.0, 1.0, 0.0], [4] * 4, edits,
                                GRPOConfig(cf_span_credit="replace"))
    assert replace.advantages[0].tolist() == pytest.approx([1.0, -0.1, 1.0, 1.8], abs=1e-5)
    assert replace.advantages[1].tolist() == pytest.approx([-1.0] * 4, abs=1e-5)  # no edits: the group term
    added = credit_advantages(rewards, ids, [1.0, 0.0, 1.0, 0.0], [4] * 4, edits, GRPOConfig())
    # 'add': the checker keeps most of the spec's credit, 1 + 4·(-0.1) = 0.6; the solver 1 + 4·1.8, capped at 1 + ρ·1
    assert added.advantages[0].tolist() == pytest.approx([1.0, 0.6, 1.0, 2.0], abs=1e-5)
    # each contrast is clipped to ±cf_clip (3 -> 2), overlapping edits then add (2 - 0.5) and the sum is clipped
    # again; an edit that changed nothing leaves its tokens at 0
    both = torch.tensor([True, True, False])
    adv = replaced_span_advantages(-0.7, 3, [(both, 3.0), (torch.tensor([True, False, False]), -0.5),
                                             (torch.tensor([False, False, True]), 0.0)], 1.0, 2.0)
    assert adv.tolist() == pytest.approx([1.5, 2.0, 0.0])
    two = [(both, 1.5), (both, 1.5)]
    assert replaced_span_advantages(0.0, 3, two, 1.0, 2.0).tolist() == pytest.approx([2.0, 2.0, 0.0])
    assert replaced_span_advantages(-0.7, 2, [(torch.tensor([False, True]), -0.5)], 0.5, None).tolist() == \
        pytest.approx([-0.7, -1.0])
    off = credit_advantages(rewards, ids, [1.0, 0.0, 1.0, 0.0], [4] * 4, edits,
                            GRPOConfig(cf_span_credit="replace", cf_coef=0.0))
    assert off.advantages[0].tolist() == pytest.approx([1.0] * 4, abs=1e-5)  # cf_coef 0: plain GRPO in both modes
    with pytest.raises(ValidationError, match="cf_span_credit"):
        GRPOConfig(cf_span_credit="swap")


def test_drop_uniform_success_groups_zeroes_the_group_term_keeps_span_terms() -> None:
    rewards = [0.90, 0.80, 0.85, 1.0, 0.0, -1.0, 0.0]
    ids = ["u", "u", "u", "d", "d", "v", "v"]  # u: all right (prices differ); d: differs; v: invalid vs wrong
    successes = [1.0, 1.0, 1.0, 1.0, 0.0, None, 0.0]
    assert uniform_success_rows(successes, ids) == [True] * 3 + [False] * 4
    mask = torch.tensor([True, False])
    edits = [[(mask, -0.3, "capacity_upgrade")]] + [[] for _ in range(6)]
    cfg = GRPOConfig(drop_uniform_success_groups=True)
    credit = credit_advantages(rewards, ids, successes, [2] * 7, edits, cfg)
    assert (credit.groups, credit.dropped_groups) == (3, 1)
    # group u: Â = 0; its span term -0.3/σ_u (σ_u = 0.0408) -> clip -2 -> -4, capped at ρ·a_min = 1 · 0.5
    assert credit.advantages[0].tolist() == pytest.approx([-0.5, 0.0], abs=1e-6)
    assert credit.advantages[1].tolist() == [0.0, 0.0] and credit.advantages[2].tolist() == [0.0, 0.0]
    assert credit.advantages[3].tolist() == pytest.approx([1.0, 1.0], abs=1e-5)  # d is kept
    assert credit.advantages[5].tolist() == pytest.approx([-1.0, -1.0], abs=1e-5)  # invalid vs valid is learnt
    kept = credit_advantages(rewards, ids, successes, [2] * 7, edits, GRPOConfig())
    assert kept.dropped_groups == 0 and kept.advantages[1][0].item() != 0.0


def test_credit_without_calibration_equals_the_paper_formula() -> None:
    """std_floor 0, no cap, no drop: A_t = Â + Σ β·Δ̃ (or β|Δ̃|Δ̃) exactly as the pieces compute it."""
    rewards, ids = [1.0, 0.0, 0.4, 0.3], ["a", "a", "b", "b"]
    m = torch.tensor([False, True, True])
    edits = [[(m, 0.5, "capacity_downgrade")], [], [(m, -0.2, "drop_dependency")], []]
    for beta, quadratic in ((4.0, False), (1.0, True)):
        cfg = GRPOConfig(std_floor=0.0, cf_max_ratio=None, cf_coef=beta, cf_weight_by_abs_delta=quadratic)
        credit = credit_advantages(rewards, ids, [1, 0, 0, 0], [3] * 4, edits, cfg)
        group = batched_group_advantages(rewards, ids)
        divs = contrast_divisors(rewards, ids, cfg)
        for row in range(4):
            pairs = [(e[0], e[1]) for e in edits[row]]
            cf = counterfactual_token_advantages(3, pairs, beta, quadratic, divs[row], 2.0)
            want = token_advantages(group[row].item(), 3, cf).tolist()
            assert credit.advantages[row].tolist() == pytest.approx(want)
    with pytest.raises(ValueError, match="lengths has 3 entries"):
        credit_advantages(rewards, ids, [1, 0, 0, 0], [3] * 3, edits, cfg)


@pytest.mark.parametrize(("r_original", "r_edited"), [(0.71, 1.02), (1.07, 0.0)])
def test_sign_end_to_end_edit_better_pushes_span_token_down(r_original: float, r_edited: float) -> None:
    """Δ = r(original) − r(edit) < 0 (the downgrade was better) must lower p(original value) after a step,
    Δ > 0 must raise it; the token outside the span (group advantage 0) must not move."""
    logits = torch.zeros(2, 3, requires_grad=True)  # position 0: "capacity:", position 1: the value
    taken = torch.tensor([0, 2])  # the completion wrote value 2 ("large")
    opt = torch.optim.SGD([logits], lr=1.0)
    before = torch.log_softmax(logits.detach(), -1)[[0, 1], taken]
    logp = torch.log_softmax(logits, -1)[[0, 1], taken][None]
    span = torch.tensor([False, True])
    cf = counterfactual_token_advantages(2, [(span, r_original - r_edited)], 1.0, delta_divisor=0.2, delta_clip=2.0)
    adv = token_advantages(0.0, 2, cf)[None]
    loss, _ = grpo_loss(logp, logp.detach(), None, adv, torch.ones(1, 2), GRPOConfig(kl_coef=0.0))
    loss.backward()
    opt.step()
    after = torch.log_softmax(logits.detach(), -1)[[0, 1], taken]
    assert after[0] == before[0]
    if r_original < r_edited:
        assert after[1] < before[1]
    else:
        assert after[1] > before[1]


def test_counterfactual_token_advantages_bad_input() -> None:
    with pytest.raises(ValueError, match="edit 0: mask"):
        counterfactual_token_advantages(4, [(torch.ones(3, dtype=torch.bool), 1.0)], 1.0)
    with pytest.raises(ValueError, match="edit 0: mask"):
        counterfactual_token_advantages(2, [(torch.tensor([1, 0]), 1.0)], 1.0)
    with pytest.raises(ValueError, match="not finite"):
        counterfactual_token_advantages(1, [(torch.tensor([True]), float("inf"))], 1.0)
    with pytest.raises(ValueError, match="cf_adv"):
        token_advantages(0.0, 3, torch.zeros(4))


# ------------------------------------------------------------------ loss


def test_clipped_surrogate_by_hand() -> None:
    # ratios 1.5, 0.5, 1.1, 0.5 with advantages +1, -1, +2, +1 and eps 0.2:
    #   t0: min(1.5*1, 1.2*1) = 1.2          -> -1.2   (clipped above, A>0)
    #   t1: min(0.5*-1, 0.8*-1) = -0.8       -> +0.8   (clipped below, A<0)
    #   t2: min(2.2, 2.2) = 2.2              -> -2.2   (inside)
    #   t3: min(0.5, 0.8) = 0.5              -> -0.5   (outside, but unclipped side is smaller)
    old = torch.log(torch.tensor([[0.2, 0.4, 0.5, 0.6]]))
    ratio = torch.tensor([[1.5, 0.5, 1.1, 0.5]])
    logp = (old + torch.log(ratio)).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0]])
    cfg = GRPOConfig(kl_coef=0.0)
    loss, metrics = grpo_loss(logp, old, None, adv, torch.ones(1, 4), cfg)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.2 - 0.5) / 4, abs=1e-6)
    assert metrics["clip_ratio"] == pytest.approx(0.5)
    assert metrics["clip_ratio/high"] == pytest.approx(0.25)
    assert metrics["clip_ratio/low"] == pytest.approx(0.25)
    assert metrics["ratio/mean"] == pytest.approx(0.9, abs=1e-6)
    assert metrics["advantage/mean"] == pytest.approx(0.75)
    assert metrics["kl"] == 0.0
    loss.backward()
    # d/dlogp of -ratio*A/T = -ratio*A/T on unclipped tokens, 0 where the clip is active
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, -2.2 / 4, -0.5 / 4], abs=1e-6)


def test_asymmetric_clip_high() -> None:
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.25, 0.75]]))
    adv = torch.tensor([[1.0, -1.0]])
    # eps_low 0.2, eps_high 0.3: 1.25 is inside [0.8, 1.3] now; 0.75 < 0.8 with A<0 is clipped low
    cfg = GRPOConfig(kl_coef=0, clip_eps_high=0.3)
    loss, metrics = grpo_loss(logp, old, None, adv, torch.ones(1, 2), cfg)
    assert loss.item() == pytest.approx((-1.25 + 0.8) / 2, abs=1e-6)
    assert metrics["clip_ratio/high"] == 0.0 and metrics["clip_ratio/low"] == pytest.approx(0.5)


def test_k3_kl_by_hand_and_in_loss() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.3]]))
    ref = torch.log(torch.tensor([[0.25, 1.0, 0.3]]))
    # q = log(ref/p): log 0.5 -> 0.5 + 0.693147 - 1 = 0.193147 ; log 2 -> 2 - 0.693147 - 1 = 0.306853 ; 0 -> 0
    kl = k3_kl(logp, ref)
    assert kl.tolist()[0] == pytest.approx([0.5 + math.log(2) - 1, 2 - math.log(2) - 1, 0.0], abs=1e-6)
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    loss, metrics = grpo_loss(logp, logp.detach(), ref, adv, torch.ones(1, 3), GRPOConfig(kl_coef=0.1))
    want = (-1.0 + 2.0 - 0.5) / 3 + 0.1 * (0.193147 + 0.306853 + 0.0) / 3
    assert loss.item() == pytest.approx(want, abs=1e-5)
    assert metrics["kl"] == pytest.approx(0.5 / 3, abs=1e-5)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logp, logp, None, adv, torch.ones(1, 3), GRPOConfig())


def test_kl_free_on_policy_loss_is_minus_mean_advantage() -> None:
    torch.manual_seed(0)
    logp = -torch.rand(3, 5) * 3
    adv = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    loss, metrics = grpo_loss(logp, logp.clone(), None, adv, mask, GRPOConfig(kl_coef=0.0))
    assert loss.item() == pytest.approx(-(adv * mask).sum().item() / 10, abs=1e-6)
    assert metrics["clip_ratio"] == 0.0 and metrics["ratio/mean"] == pytest.approx(1.0)


def test_token_vs_sequence_aggregation() -> None:
    # on-policy, no KL: per-token loss = -A. Row 0 has 1 token (A=3), row 1 has 3 tokens (A=1).
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[3.0, 9.0, 9.0], [1.0, 1.0, 1.0]])  # padded positions carry junk on purpose
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    token, _ = grpo_loss(logp, logp, None, adv, mask, GRPOConfig(kl_coef=0))
    seq, _ = grpo_loss(logp, logp, None, adv, mask, GRPOConfig(kl_coef=0, loss_aggregation="sequence"))
    assert token.item() == pytest.approx((-3 - 1 - 1 - 1) / 4)  # every token weighs the same
    assert seq.item() == pytest.approx((-3 + -1) / 2)  # every completion weighs the same
    # a whole optimizer step of 8 tokens split over micro-batches: normalise by the global count
    half, _ = grpo_loss(logp, logp, None, adv, mask, GRPOConfig(kl_coef=0), total_tokens=8)
    assert half.item() == pytest.approx(-6 / 8)
    # [B] advantages broadcast over tokens
    per_seq, _ = grpo_loss(logp, logp, None, torch.tensor([3.0, 1.0]), mask, GRPOConfig(kl_coef=0))
    assert per_seq.item() == pytest.approx(token.item())


def test_loss_shape_errors() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_logprobs"):
        grpo_loss(x, torch.zeros(2, 4), None, x, x + 1, GRPOConfig(kl_coef=0))
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(x, x, None, x, torch.ones(3, 2), GRPOConfig(kl_coef=0))
    with pytest.raises(ValueError, match="no completion tokens"):
        grpo_loss(x, x, None, x, x, GRPOConfig(kl_coef=0))


def _edit_batch(cf_coef: float, group_adv: float) -> torch.Tensor:
    span = torch.tensor([False, False, True, True, False, False])
    cf = counterfactual_token_advantages(6, [(span, 0.5)], cf_coef)
    return token_advantages(group_adv, 6, cf)[None]


def test_counterfactual_gradient_only_on_edited_tokens() -> None:
    torch.manual_seed(1)
    logp = (-torch.rand(1, 6) * 2).requires_grad_(True)
    # group advantage 0, KL to a reference equal to the policy: the only signal is the span term
    loss, _ = grpo_loss(logp, logp.detach(), logp.detach().clone(), _edit_batch(1.0, 0.0), torch.ones(1, 6),
                        GRPOConfig())
    loss.backward()
    g = logp.grad[0]
    assert torch.all(g[[0, 1, 4, 5]] == 0)
    assert torch.all(g[[2, 3]] != 0)
    # beta*|delta|*delta = 0.25 on each span token; d(-ratio*A/T)/dlogp = -0.25/6 at ratio 1
    assert g[[2, 3]].tolist() == pytest.approx([-0.25 / 6] * 2, abs=1e-7)


def test_counterfactual_term_adds_no_gradient_outside_span_in_general() -> None:
    """Off-policy ratios, nonzero group advantage and KL: switching the cf term on changes span grads only."""
    torch.manual_seed(2)
    base = -torch.rand(1, 6) * 2
    old = base + 0.1 * torch.randn(1, 6)
    ref = base + 0.3 * torch.randn(1, 6)
    grads = []
    for cf_coef in (0.0, 3.0):
        logp = base.clone().requires_grad_(True)
        adv = _edit_batch(cf_coef, -0.7)
        loss, _ = grpo_loss(logp, old, ref, adv, torch.ones(1, 6), GRPOConfig(clip_eps=0.5))
        loss.backward()
        grads.append(logp.grad[0].clone())
    diff = grads[1] - grads[0]
    assert torch.all(grads[0] != 0)  # group advantage and KL reach every token
    assert torch.all(diff[[0, 1, 4, 5]] == 0)
    assert torch.all(diff[[2, 3]] != 0)


# ------------------------------------------------------------------ logprobs from a model


def _tiny_causal_lm(kind: str) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "llama":  # rotary positions: only relative offsets matter
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )).eval()
    # learned absolute positions: wrong position ids under left padding would change the result
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_sequence_logprobs_match_manual_loop(kind: str) -> None:
    model = _tiny_causal_lm(kind)
    prompts = [[5, 6, 7, 8], [9, 10]]  # left-padded to 4
    completions = [[11, 12, 13], [14, 15]]  # right-padded to 3
    start, width = 4, 3
    ids = torch.zeros(2, start + width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[b, start - len(p):start], attn[b, start - len(p):start] = torch.tensor(p), 1
        ids[b, start:start + len(c)], attn[b, start:start + len(c)] = torch.tensor(c), 1

    with torch.no_grad():
        got = sequence_logprobs(model, ids, attn, completion_start=start)
        assert got.shape == (2, width)
        for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            seq = p + c
            for j in range(len(c)):
                ctx = torch.tensor([seq[: len(p) + j]])
                want = torch.log_softmax(model(input_ids=ctx).logits[0, -1], -1)[c[j]]
                assert got[b, j].item() == pytest.approx(want.item(), abs=1e-4)
        hot = sequence_logprobs(model, ids, attn, completion_start=start, temperature=2.0)
        assert not torch.allclose(hot, got)
    with pytest.raises(ValueError, match="completion_start"):
        sequence_logprobs(model, ids, attn, completion_start=0)


def test_constant_groups_are_counted_and_get_no_group_advantage() -> None:
    """A group whose samples all got one reward (e.g. six copies of one spec with the pool's greedy answers) gives
    the group term nothing: Â = 0 on every row, and credit.constant_groups counts it, as TRL's
    frac_reward_zero_std does, so a run's log says why its loss is 0. Span terms still move such a group."""
    rewards = [0.7] * 3 + [1.0, 0.0, 1.0] + [0.2] * 3
    ids = ["copies"] * 3 + ["spread"] * 3 + ["copies-too"] * 3
    mask = torch.tensor([True, False])
    edits = [[(mask, -0.3, "capacity_downgrade")]] + [[] for _ in range(8)]
    credit = credit_advantages(rewards, ids, [1.0] * 3 + [1.0, 0.0, 1.0] + [0.0] * 3, [2] * 9, edits, GRPOConfig())
    assert (credit.groups, credit.constant_groups) == (3, 2)
    group_term = [float(a[1]) for a in credit.advantages]  # token 1: outside the edited span
    assert group_term[:3] == [0.0] * 3 and group_term[6:] == [0.0] * 3
    assert all(abs(a) > 0.5 for a in group_term[3:6])
    assert float(credit.advantages[0][0]) < 0  # the span term still reaches a constant group's edited tokens
