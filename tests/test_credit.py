"""The token advantages on hand-computed values (lemon_core/credit.py): GRPO's group term and LEMON's span term."""

from __future__ import annotations

import math

import pytest
import torch

from lemon_core.config import GRPOConfig
from lemon_core.credit import (
    STD_EPS,
    cap_span_term,
    contrast_divisor,
    contrast_weight,
    credit_advantages,
    group_advantages,
    group_stats,
    pair_loss,
    span_mask_from_tokenizer,
    span_pair_tokens,
    span_term,
    span_token_mask,
)
from lemon_core.grpo import grpo_loss
from lemon_core.logprobs import offsets_from_token_ids

# ------------------------------------------------------------------ group term


def test_group_advantages_population_std_by_hand() -> None:
    # mean 0.5, population std 0.5  ->  (r - .5) / (.5 + ε)
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    # [3, 1, 2]: mean 2, population std sqrt(2/3)
    s = math.sqrt(2 / 3) + STD_EPS
    assert group_advantages(torch.tensor([3.0, 1.0, 2.0])).tolist() == pytest.approx([1 / s, -1 / s, 0.0], abs=1e-6)
    assert group_advantages([3.0, 1.0, 2.0]).dtype == torch.float32


def test_group_advantages_constant_group_is_zero_not_nan() -> None:
    for rewards in ([0.1, 0.1, 0.1], [0.0] * 4, [-2.5], [1e9, 1e9]):
        assert torch.equal(group_advantages(rewards), torch.zeros(len(rewards)))
        assert torch.equal(group_advantages(rewards, std_floor=0.1), torch.zeros(len(rewards)))


def test_group_advantages_bad_input() -> None:
    with pytest.raises(ValueError, match="rewards"):
        group_advantages([])
    with pytest.raises(ValueError, match="NaN"):
        group_advantages([1.0, float("nan")])
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages([1.0, 2.0], [0])


def test_batched_group_advantages_match_per_group() -> None:
    rewards = [1.0, 5.0, 0.0, 5.0, 0.0, 1.0, 2.0, 5.0]
    ids = ["a", "b", "a", "b", "a", "a", "c", "b"]  # b is constant, c a singleton, rows interleaved
    got = group_advantages(rewards, ids)
    want = torch.zeros(8)
    for g in set(ids):
        rows = [i for i, x in enumerate(ids) if x == g]
        want[rows] = group_advantages([rewards[i] for i in rows])
    assert torch.allclose(got, want, atol=1e-6)
    assert got[[1, 3, 7]].tolist() == [0.0, 0.0, 0.0] and got[6].item() == 0.0
    assert got[[0, 2, 4, 5]].tolist() == pytest.approx([1, -1, -1, 1], abs=1e-5)


def test_std_floor_by_hand() -> None:
    # [0.50, 0.52]: std 0.01; with floor 0.1 the advantages are ±0.01 / 0.1 = ±0.1, not ±1
    assert group_advantages([0.50, 0.52], std_floor=0.1).tolist() == pytest.approx([-0.1, 0.1], abs=1e-5)
    assert group_advantages([0.50, 0.52]).tolist() == pytest.approx([-1.0, 1.0], abs=1e-3)
    # a group that differs in success has std 0.5 > floor: unchanged
    assert group_advantages([1.0, 0.0], std_floor=0.1).tolist() == pytest.approx([1.0, -1.0], abs=1e-5)
    got = group_advantages([0.50, 1.0, 0.52, 0.0], ["p", "s", "p", "s"], std_floor=0.1)
    assert got.tolist() == pytest.approx([-0.1, 1.0, 0.1, -1.0], abs=1e-5)


def test_contrast_divisor_is_the_group_advantage_divisor_constant_group_included() -> None:
    rewards = [0.50, 0.52, 0.7, 0.7, 1.0, 0.0]  # std 0.01 (floored), constant, std 0.5
    ids = ["a", "a", "b", "b", "c", "c"]
    _, std, constant = group_stats(rewards, ids)
    got = contrast_divisor(std, constant, 0.1).tolist()
    assert got == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.5, 0.5], abs=1e-5)
    # without a floor a constant group keeps raw contrasts (divisor 1), the others use their std
    assert contrast_divisor(std, constant, 0.0).tolist() == pytest.approx([0.01, 0.01, 1.0, 1.0, 0.5, 0.5], abs=1e-5)
    # Δ / divisor == Â_i − Â(edit): the contrast is on the group advantage's scale
    adv = group_advantages(rewards, ids, std_floor=0.1)
    assert adv[4].item() - adv[5].item() == pytest.approx((1.0 - 0.0) / got[4], abs=1e-5)


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


# ------------------------------------------------------------------ span term


def test_span_term_by_hand() -> None:
    m1 = torch.tensor([False, False, True, True, False, False])
    m2 = torch.tensor([False, False, False, True, True, False])
    # β = 0.5: edit 1, Δ = +0.4 -> 0.2 ; edit 2, Δ = -0.2 -> -0.1 ; overlapping token 3: 0.1
    term = span_term(6, [(m1, 0.4), (m2, -0.2)], cf_coef=0.5)
    assert term.tolist() == pytest.approx([0, 0, 0.2, 0.1, -0.1, 0], abs=1e-7)
    assert term[[0, 1, 5]].tolist() == [0.0, 0.0, 0.0]  # exactly zero outside every span
    assert span_term(6, [], 1.0).tolist() == [0.0] * 6


def test_span_term_scaled_and_clipped_by_hand() -> None:
    m1 = torch.tensor([False, True, True, False, False])
    m2 = torch.tensor([False, False, False, True, False])
    edits = [(m1, 0.3), (m2, -1.0)]
    # divisor 0.25: 0.3 -> 1.2 ; -1.0 -> -4 -> clipped to -2.  β 0.5: 0.6 ; -1.0
    assert span_term(5, edits, 0.5, divisor=0.25, clip=2.0).tolist() == pytest.approx([0, 0.6, 0.6, -1.0, 0])
    assert span_term(5, edits, 0.5, divisor=0.25)[3].item() == pytest.approx(-2.0)  # unclipped: 0.5 · -4
    with pytest.raises(ValueError, match="divisor"):
        span_term(5, edits, 0.5, divisor=0.0)


def test_span_term_bad_input() -> None:
    with pytest.raises(ValueError, match="edit 0: mask"):
        span_term(4, [(torch.ones(3, dtype=torch.bool), 1.0)], 1.0)
    with pytest.raises(ValueError, match="edit 0: mask"):
        span_term(2, [(torch.tensor([1, 0]), 1.0)], 1.0)
    with pytest.raises(ValueError, match="not finite"):
        span_term(1, [(torch.tensor([True]), float("inf"))], 1.0)


def test_cap_span_term_by_hand() -> None:
    span = torch.tensor([0.0, -4.0, 1.0])
    assert cap_span_term(span, 1.5, 2.0, 0.5).tolist() == [0.0, -3.0, 1.0]  # Â = 1.5, ρ = 2 -> cap 3
    assert cap_span_term(span, -0.1, 2.0, 0.5).tolist() == [0.0, -1.0, 1.0]  # |Â| < a_min -> cap 2 · 0.5
    assert cap_span_term(span, 0.0, None, 0.5).tolist() == span.tolist()


# ------------------------------------------------------------------ credit_advantages


def test_constant_group_without_floor_uses_raw_delta_not_delta_over_eps() -> None:
    """All six specs tied (std 0, Â = 0); the edit scored 0.3 more. Dividing by ε would make that -0.3 a huge
    push; without a floor the constant group keeps the raw contrast: β·(-0.3) on the span only."""
    span = torch.tensor([False, False, True, False])
    credit = credit_advantages([0.7] * 6, [0] * 6, [4] * 6, [[(span, -0.3, "capacity_reset")]] + [[]] * 5,
                               GRPOConfig(cf_coef=1.0, std_floor=0.0, cf_max_ratio=None))
    assert credit.advantages[0].tolist() == pytest.approx([0.0, 0.0, -0.3, 0.0], abs=1e-6)


def test_group_differing_only_in_price_gets_advantages_under_the_floor() -> None:
    """All six specs wrong, rewards differ by cost only (σ ≈ 0.012); a capacity edit of one span saved 0.02."""
    rewards = [-0.030, -0.045, -0.020, -0.050, -0.025, -0.040]  # mean -0.035, σ = 0.0112
    ids = ["t"] * 6
    mask = torch.tensor([False, True, False])
    edits = [[(mask, -0.02, "capacity_reset")]] + [[] for _ in range(5)]
    credit = credit_advantages(rewards, ids, [3] * 6, edits, GRPOConfig())
    group = torch.stack([a[0] for a in credit.advantages])
    centred = torch.tensor(rewards, dtype=torch.float64) - sum(rewards) / 6
    assert group.tolist() == pytest.approx((centred / (0.1 + STD_EPS)).tolist(), abs=1e-6)
    assert group.abs().max().item() < 0.16  # a right-vs-wrong group has ±1
    # span: Δ̃ = -0.02 / 0.1 = -0.2, β·Δ̃ = 4 · -0.2 = -0.8 on top of Â_0 = 0.05, capped at ρ · max(|Â|, a_min) = 0.5
    assert credit.advantages[0].tolist() == pytest.approx([0.05, 0.05 - 0.5, 0.05], abs=1e-5)
    half = credit_advantages(rewards, ids, [3] * 6, edits, GRPOConfig(cf_max_ratio=0.5))
    assert half.advantages[0].tolist() == pytest.approx([0.05, 0.05 - 0.25, 0.05], abs=1e-5)
    assert (credit.groups, credit.floored_groups, credit.capped_tokens, credit.constant_groups) == (1, 1, 1, 0)
    wide = credit_advantages(rewards, ids, [3] * 6, edits, GRPOConfig(cf_max_ratio=2.0))
    assert wide.advantages[0].tolist() == pytest.approx([0.05, 0.05 - 0.8, 0.05], abs=1e-5)  # under 2 · 0.5
    assert credit.scaled_delta_abs == {"capacity_reset": pytest.approx(0.2, abs=1e-5)}
    # without the floor the same group gets full-size advantages and a -4 span term
    old = credit_advantages(rewards, ids, [3] * 6, edits, GRPOConfig(std_floor=0.0, cf_max_ratio=None))
    assert max(abs(a[0].item()) for a in old.advantages) > 1.3 and old.advantages[0][1].item() < -2.5


def test_span_term_never_outweighs_the_group_term_by_more_than_the_ratio() -> None:
    gen = torch.Generator().manual_seed(0)
    cfg = GRPOConfig(cf_coef=3.0, cf_max_ratio=1.5, cf_ratio_floor=0.2)
    rewards = (torch.rand(24, generator=gen) * torch.tensor([1.0, 0.03]).repeat(12)).tolist()
    ids = [i // 6 for i in range(24)]
    edits = [[(torch.rand(8, generator=gen) < 0.4, float(torch.randn(1, generator=gen)), "duty_rollback")]
             for _ in range(24)]
    credit = credit_advantages(rewards, ids, [8] * 24, edits, cfg)
    group = group_advantages(rewards, ids, std_floor=cfg.std_floor)
    hit = 0
    for adv, a in zip(credit.advantages, group.tolist(), strict=True):
        bound = 1.5 * max(abs(a), 0.2)
        assert (adv - a).abs().max().item() <= bound + 1e-5
        hit += int(((adv - a).abs() > bound - 1e-5).sum())
    assert credit.capped_tokens > 0 and hit >= credit.capped_tokens


def test_credit_is_the_formula_of_its_pieces() -> None:
    """A_t = Â + cap(β · Σ m · clip(Δ / s, ±c)) exactly as the pieces compute it; cf_coef 0 is plain GRPO."""
    rewards, ids = [1.0, 0.0, 0.4, 0.3], ["a", "a", "b", "b"]
    m = torch.tensor([False, True, True])
    edits = [[(m, 0.5, "capacity_reset")], [], [(m, -0.2, "drop_dependency")], []]
    cfg = GRPOConfig()
    credit = credit_advantages(rewards, ids, [3] * 4, edits, cfg)
    group = group_advantages(rewards, ids, std_floor=cfg.std_floor)
    _, std, constant = group_stats(rewards, ids)
    divisors = contrast_divisor(std, constant, cfg.std_floor).tolist()
    for row in range(4):
        term = span_term(3, [(e[0], e[1]) for e in edits[row]], cfg.cf_coef, divisors[row], cfg.cf_clip)
        want = group[row].item() + cap_span_term(term, group[row].item(), cfg.cf_max_ratio, cfg.cf_ratio_floor)
        assert credit.advantages[row].tolist() == pytest.approx(want.tolist())
    plain = credit_advantages(rewards, ids, [3] * 4, edits, GRPOConfig(cf_coef=0.0))
    assert [a.tolist() for a in plain.advantages] == [[g] * 3 for g in group.tolist()]
    with pytest.raises(ValueError, match="lengths has 3 entries"):
        credit_advantages(rewards, ids, [3] * 3, edits, cfg)


@pytest.mark.parametrize(("r_original", "r_edited"), [(0.71, 1.02), (1.07, 0.0)])
def test_sign_end_to_end_edit_better_pushes_span_token_down(r_original: float, r_edited: float) -> None:
    """Δ = r(original) − r(edit) < 0 (the edit was better) must lower p(original value) after a step,
    Δ > 0 must raise it; the token outside the span (group advantage 0) must not move."""
    logits = torch.zeros(2, 3, requires_grad=True)  # position 0: "capacity:", position 1: the value
    taken = torch.tensor([0, 2])  # the completion wrote value 2 ("large")
    opt = torch.optim.SGD([logits], lr=1.0)
    before = torch.log_softmax(logits.detach(), -1)[[0, 1], taken]
    logp = torch.log_softmax(logits, -1)[[0, 1], taken][None]
    span = torch.tensor([False, True])
    adv = span_term(2, [(span, r_original - r_edited)], 1.0, divisor=0.2, clip=2.0)[None]
    loss, _ = grpo_loss(logp, logp.detach(), None, adv, torch.ones(1, 2), GRPOConfig(kl_coef=0.0))
    loss.backward()
    opt.step()
    after = torch.log_softmax(logits.detach(), -1)[[0, 1], taken]
    assert after[0] == before[0]
    if r_original < r_edited:
        assert after[1] < before[1]
    else:
        assert after[1] > before[1]


def test_constant_groups_are_counted_and_get_no_group_advantage() -> None:
    """A group whose samples all got one reward (e.g. six copies of one spec with the pool's greedy answers) gives
    the group term nothing: Â = 0 on every row, and credit.constant_groups counts it, as TRL's
    frac_reward_zero_std does, so a run's log says why its loss is 0. Span terms still move such a group."""
    rewards = [0.7] * 3 + [1.0, 0.0, 1.0] + [0.2] * 3
    ids = ["copies"] * 3 + ["spread"] * 3 + ["copies-too"] * 3
    mask = torch.tensor([True, False])
    edits = [[(mask, -0.3, "capacity_downgrade")]] + [[] for _ in range(8)]
    credit = credit_advantages(rewards, ids, [2] * 9, edits, GRPOConfig())
    assert (credit.groups, credit.constant_groups) == (3, 2)
    group_term = [float(a[1]) for a in credit.advantages]  # token 1: outside the edited span
    assert group_term[:3] == [0.0] * 3 and group_term[6:] == [0.0] * 3
    assert all(abs(a) > 0.5 for a in group_term[3:6])
    assert float(credit.advantages[0][0]) < 0  # the span term still reaches a constant group's edited tokens


# --- the pairwise term ----------------------------------------------------------------------------------------
def test_pair_loss_by_hand() -> None:
    # margin = (−1 − (−2)) − (−3 − (−1)) = 1 + 2 = 3; β = 0.5: w · log(1 + e^{−1.5}) with w = 2
    loss = pair_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-3.0]), torch.tensor([-1.0]),
                     torch.tensor([2.0]), beta=0.5)
    assert loss.item() == pytest.approx(2 * math.log1p(math.exp(-1.5)), rel=1e-6)
    # at π = π_ref the margin is 0: w · log 2, whatever the values' probabilities
    same = pair_loss(torch.tensor([-9.2]), torch.tensor([-9.2]), torch.tensor([-1e-4]), torch.tensor([-1e-4]),
                     torch.tensor([0.5]), beta=0.1)
    assert same.item() == pytest.approx(0.5 * math.log(2), rel=1e-6)
    # bounded: a margin the policy already agrees with costs almost nothing; one it disagrees with grows linearly
    ones = torch.ones(1)
    assert pair_loss(ones * 50, ones * 0, ones * 0, ones * 0, ones, beta=1.0).item() < 1e-20
    assert pair_loss(ones * 0, ones * 0, ones * 50, ones * 0, ones, beta=1.0).item() == pytest.approx(50, rel=1e-6)


def test_pair_gradient_raises_the_better_value_even_at_tiny_probability() -> None:
    """One span token, vocabulary [v⁺, v⁻, other]: the policy writes v⁻ with p ≈ 1 and v⁺ with p = 1e-4.

    At π = π_ref, dL/dlog π(v⁺) = −wβ/2 and dL/dlog π(v⁻) = +wβ/2, so by d log p_j / d z_i = [i = j] − p_i the
    gradient on v⁺'s logit is −wβ/2 · (1 − p⁺) + wβ/2 · (0 − p⁺) = −wβ/2 exactly: the push does not shrink with
    p⁺. The span term's surrogate −A · log π(v⁻) on the sampled value gives v⁺'s logit only A · p⁺ = 1e-4 · A."""
    z = torch.tensor([math.log(1e-4), 0.0, -30.0], dtype=torch.float64, requires_grad=True)
    with torch.no_grad():  # make p(v⁺) exactly 1e-4: z0 = log(1e-4 · Σ_{j≠0} e^{z_j} / (1 − 1e-4))
        z[0] = math.log(1e-4 / (1 - 1e-4) * (math.exp(0.0) + math.exp(-30.0)))
    logp = torch.log_softmax(z, dim=0)
    assert logp[0].exp().item() == pytest.approx(1e-4, rel=1e-9)
    w, beta = 1.0, 0.1
    ref = logp.detach()
    loss = pair_loss(logp[:1], ref[:1], logp[1:2], ref[1:2], torch.tensor([w], dtype=torch.float64), beta)
    loss.sum().backward()
    assert z.grad[0].item() == pytest.approx(-w * beta / 2, rel=1e-9)
    # a descent step at lr = 10 moves v⁺'s logit up by 0.5 and v⁻'s (which holds the mass) down by 0.5, so
    # log π(v⁺) rises by about 1 nat
    with torch.no_grad():
        after = torch.log_softmax(z - 10 * z.grad, dim=0)
    assert z.grad[1].item() == pytest.approx(w * beta / 2, rel=1e-3)
    assert after[0].item() - logp[0].item() == pytest.approx(1.0, rel=1e-3)

    z2 = z.detach().clone().requires_grad_(True)  # the span term alone: −A · log π(sampled v⁻) with A = −1
    (1.0 * torch.log_softmax(z2, dim=0)[1]).backward()
    assert abs(z2.grad[0].item()) == pytest.approx(1e-4, rel=1e-6)


def test_span_pair_tokens_score_both_values_from_the_same_prefix(yaml_tokenizer) -> None:  # noqa: ANN001
    text = "  - id: verifier\n    capacity: large\n    depends_on: [solver]\n"
    start = text.index("large")
    ids = yaml_tokenizer(text, add_special_tokens=False)["input_ids"]
    offsets = offsets_from_token_ids(yaml_tokenizer, ids)
    prefix, original, edited = span_pair_tokens(yaml_tokenizer, text, offsets, ids, (start, start + 5), "small")
    assert ids[prefix : prefix + len(original)] == original
    written = yaml_tokenizer.decode(ids[:prefix] + original)
    assert written.endswith("large") and text.startswith(written)
    assert yaml_tokenizer.decode(ids[:prefix] + edited) == written[: -len("large")] + "small"
    assert span_pair_tokens(yaml_tokenizer, text, offsets, ids, (start, start + 5), "large") is None  # no change


def test_contrast_weight_is_the_span_terms_scaled_and_clipped_contrast() -> None:
    assert contrast_weight(-0.05, 0.1, 2.0) == pytest.approx(0.5)
    assert contrast_weight(0.9, 0.1, 2.0) == 2.0
    assert contrast_weight(0.9, 0.1, None) == pytest.approx(9.0)
    assert GRPOConfig().cf_pair_coef == 0  # off unless asked for
