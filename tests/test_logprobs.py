"""Chunked token log-probs (lemon_core/logprobs.py) equal a full log_softmax, with and without gradients."""

from __future__ import annotations

import pytest
import torch

from lemon_core.logprobs import (
    decoder_and_head,
    head_target_logprobs,
    sequence_logprobs,
    target_logprobs,
)


def _tiny_causal_lm(kind: str, vocab: int = 300) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if kind == "gpt2":  # learned absolute positions: wrong position ids under left padding change the result
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                          bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common)).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded prompts (width 4) and right-padded completions (width 5), as policy.pack builds them."""
    prompts = [[5, 6, 7, 8], [9, 10], [11]]
    completions = [[12, 13, 14, 15, 16], [17, 18], [19, 20, 21]]
    ids = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[b, 4 - len(p) : 4], mask[b, 4 - len(p) : 4] = torch.tensor(p), 1
        ids[b, 4 : 4 + len(c)], mask[b, 4 : 4 + len(c)] = torch.tensor(c), 1
    return ids, mask, 4


def full_log_softmax_logprobs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, start: int,
                              temperature: float = 1.0) -> torch.Tensor:
    """The way it was done before chunking: full [B, T, V] float32 log_softmax, then gather."""
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    logits = logits[:, start - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[:, start:, None]).squeeze(-1)


def test_target_logprobs_equal_full_log_softmax_for_any_chunk() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=gen) * 4
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
    for chunk in (1, 3, 7, 100):
        got = target_logprobs(logits, targets, 0.7, chunk_tokens=chunk)
        assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-5, rtol=0)
    # the model's whole logits with an offset (positions 1..7 of 9) - no sliced copy - and its gradient
    longer = (torch.randn(3, 9, 50, generator=gen) * 3).requires_grad_()
    want = torch.log_softmax(longer[:, 1:-1] / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
    got = target_logprobs(longer, targets, 0.7, chunk_tokens=2, first=1)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    weights = torch.randn(3, 7, generator=gen)
    (want_grad,) = torch.autograd.grad((want * weights).sum(), longer)
    (got_grad,) = torch.autograd.grad((got * weights).sum(), longer)
    assert torch.allclose(got_grad, want_grad, atol=1e-6) and got_grad[:, [0, 8]].abs().max() == 0
    # bf16 logits are upcast per block, as the full float32 log_softmax would be
    half = logits.bfloat16()
    want = torch.log_softmax(half.float(), -1).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(target_logprobs(half, targets, chunk_tokens=4), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("mode", ["logits", "hidden"])
def test_sequence_logprobs_chunked_equal_the_full_log_softmax(kind: str, mode: str) -> None:
    model = _tiny_causal_lm(kind)
    ids, mask, start = _batch()
    with torch.no_grad():
        want = full_log_softmax_logprobs(model, ids, mask, start, temperature=0.8)
        for chunk, rows in ((1, None), (3, 2), (256, 1)):
            got = sequence_logprobs(model, ids, mask, start, 0.8, mode=mode, chunk_tokens=chunk, rows_per_forward=rows)
            assert got.shape == (3, 5)
            assert torch.allclose(got, want, atol=1e-5, rtol=0), (chunk, rows, (got - want).abs().max())


@pytest.mark.parametrize("mode", ["logits", "hidden"])
def test_chunked_gradients_equal_the_full_log_softmax_gradients(mode: str) -> None:
    """Training uses these log-probs with autograd: checkpointed blocks must give the same gradients."""
    model = _tiny_causal_lm("llama")
    ids, mask, start = _batch()
    weights = torch.linspace(-1, 1, 15).view(3, 5)
    (full_log_softmax_logprobs(model, ids, mask, start) * weights).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (sequence_logprobs(model, ids, mask, start, mode=mode, chunk_tokens=2) * weights).sum().backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], atol=1e-5, rtol=1e-4), name


def test_head_target_logprobs_never_builds_more_than_one_block() -> None:
    seen: list[tuple[int, ...]] = []
    head = torch.nn.Linear(8, 40, bias=False)
    head.register_forward_hook(lambda _m, _i, out: seen.append(tuple(out.shape)))
    hidden, targets = torch.randn(2, 5, 8), torch.randint(0, 40, (2, 5))
    with torch.no_grad():
        got = head_target_logprobs(hidden, head, targets, chunk_tokens=4)
        want = torch.log_softmax(head(hidden), -1).gather(-1, targets[..., None]).squeeze(-1)
    assert seen[:-1] == [(4, 40), (4, 40), (2, 40)]  # 10 tokens in blocks of 4; the last call is `want`
    assert torch.allclose(got, want, atol=1e-6)


def test_bad_input_names_the_fix() -> None:
    model = _tiny_causal_lm("llama")
    ids, mask, start = _batch()
    with pytest.raises(ValueError, match="completion_start"):
        sequence_logprobs(model, ids, mask, 0)
    with pytest.raises(ValueError, match="mode='nope'"):
        sequence_logprobs(model, ids, mask, start, mode="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_tokens=0"):
        sequence_logprobs(model, ids, mask, start, chunk_tokens=0)
    with pytest.raises(ValueError, match="rows_per_forward=0"):
        sequence_logprobs(model, ids, mask, start, rows_per_forward=0)
    with pytest.raises(ValueError, match="share"):
        target_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="use mode='logits'"):
        decoder_and_head(torch.nn.Linear(2, 2))
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        decoder_and_head(model)


def test_hidden_mode_on_a_lora_model_equals_the_full_log_softmax_with_and_without_adapters() -> None:
    """train-gpu.yaml trains LoRA adapters with logprob_mode: hidden: the decoder path must run the injected
    adapters (values and adapter gradients) and honour ``disable_adapter`` (the KL reference)."""
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(_tiny_causal_lm("qwen2"), lora)
    for name, p in model.named_parameters():  # non-zero B matrices: the adapters change the output
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    ids, mask, start = _batch()
    weights = torch.linspace(-1, 1, 15).view(3, 5)
    full = full_log_softmax_logprobs(model, ids, mask, start)
    (full * weights).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    got = sequence_logprobs(model, ids, mask, start, mode="hidden", chunk_tokens=2)
    (got * weights).sum().backward()
    assert torch.allclose(got, full, atol=1e-5, rtol=0)
    assert want and all(torch.allclose(p.grad, want[n], atol=1e-5, rtol=1e-4) for n, p in model.named_parameters()
                        if p.requires_grad)
    with torch.no_grad(), model.disable_adapter():
        base = full_log_softmax_logprobs(model, ids, mask, start)
        assert (base - full).abs().max() > 1e-3  # the adapters matter here, so the next line tests something
        assert torch.allclose(sequence_logprobs(model, ids, mask, start, mode="hidden"), base, atol=1e-5, rtol=0)
