"""The GRPO loss on hand-computed values (lemon_core/grpo.py), and token log-probs from a model."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from lemon_core.config import GRPOConfig
from lemon_core.credit import span_term
from lemon_core.grpo import grpo_loss, k3_kl
from lemon_core.logprobs import sequence_logprobs


def test_config_defaults_and_errors() -> None:
    cfg = GRPOConfig()
    assert (cfg.clip_eps, cfg.kl_coef, cfg.cf_coef, cfg.loss_aggregation, cfg.cf_clip) == (0.2, 0.04, 4.0, "token", 2.0)
    assert (cfg.std_floor, cfg.cf_max_ratio, cfg.cf_ratio_floor) == (0.1, 1.0, 0.5)
    for field, bad in (("std_floor", -0.1), ("cf_max_ratio", 0.0), ("cf_clip", 0.0), ("clip_eps", 1.5),
                       ("loss_aggregation", "mean")):
        with pytest.raises(ValidationError, match=field):
            GRPOConfig(**{field: bad})
    assert cfg.eps_low == cfg.eps_high == 0.2
    assert GRPOConfig(clip_eps_high=0.28).eps_high == 0.28
    for removed in ("beta", "cf_span_credit", "scale_rewards", "cf_weight_by_abs_delta"):
        with pytest.raises(ValidationError, match=removed):
            GRPOConfig(**{removed: 0.1})  # unknown (or deleted) keys are refused, not silently ignored


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
    return (group_adv + span_term(6, [(span, 0.5)], cf_coef))[None]


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
    # β·Δ = 0.5 on each span token; d(-ratio*A/T)/dlogp = -0.5/6 at ratio 1
    assert g[[2, 3]].tolist() == pytest.approx([-0.5 / 6] * 2, abs=1e-7)


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
