"""Token log-probabilities of completions under a causal LM, without a [B, T, V] float32 log_softmax.

The PPO ratio, the old-log-prob pass and the KL reference all need log π(o_t | o_<t) for the sampled
tokens only: logit[target] − logsumexp(logits). Building the full log_softmax for that costs
B × T × V floats; with the GPU config (128 samples × ~512 tokens × a 152k vocabulary) that is ~40 GB
of float32 per copy, and autograd keeps more than one. Here the same value is computed on blocks of
`chunk_tokens` tokens (the idea of TRL's ``selective_log_softmax``, written anew), so at most one block
of float32 logits exists at a time:

- ``mode="logits"``: the model's forward returns logits (in the model's dtype) for the completion
  positions only (``logits_to_keep``); log-probs are gathered block by block. Works for every HF causal
  LM, peft and FSDP-wrapped models included. The model's own logits tensor is still [B, T, V].
- ``mode="hidden"``: the decoder returns hidden states [B, T, H] and the LM head is applied block by
  block, so no [B, T, V] tensor ever exists. Needs a plain HF (or peft) causal LM whose logits are
  exactly ``lm_head(hidden)`` (``decoder_and_head`` refuses models that soft-cap or scale logits) and
  that is not FSDP-sharded (the head would be called outside the root module's forward).

With gradients: in "hidden" mode every block runs under activation checkpointing (only its hidden
states are kept; its logits are recomputed in backward), so training gets the same bound; in "logits"
mode backward writes the logits' gradient block by block (one tensor the size of the logits, no
float32 copies kept).
``rows_per_forward`` additionally runs the model on that many rows at a time (no-grad passes such as
the old-log-prob pass over a whole rollout batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

LogprobMode = Literal["logits", "hidden"]


def offsets_from_token_ids(tokenizer: Any, token_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Char offsets of each sampled token inside tokenizer.decode(token_ids).

    Sampled ids can differ from a re-tokenization of the decoded text (BPE is not unique), so the
    offsets are taken from decoding growing prefixes: token i spans [len(decode(ids[:i])),
    len(decode(ids[:i+1]))). A token that completes only part of a multi-byte character may decode to
    a placeholder; offsets are kept monotone so such a token gets a zero-width or short range.
    """
    offsets: list[tuple[int, int]] = []
    prev = 0
    for i in range(len(token_ids)):
        end = max(prev, len(tokenizer.decode(list(token_ids[: i + 1]), skip_special_tokens=False)))
        offsets.append((prev, end))
        prev = end
    return offsets


def _block_logprobs(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """log_softmax(logits / T)[targets] for one block [n, V] in float32: logit[target] − logsumexp."""
    z = logits.float() / temperature
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def _run_block(fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """fn(*args); under autograd with activation checkpointing, so its float32 logits are not kept."""
    if torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args):
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def target_logprobs(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk_tokens: int = 256, first: int = 0,
) -> Tensor:
    """log_softmax(logits[:, first + t] / temperature)[targets[:, t]], `chunk_tokens` tokens at a time.

    logits [B, ≥ first + T, V] (any dtype), targets [B, T] -> float32 [B, T]. Positions outside
    [first, first + T) are ignored, so the model's logits are passed whole (no sliced copy). With
    gradients, backward writes d/dlogits = (onehot − softmax) / temperature block by block into one
    tensor the size of logits: no float32 copy of the logits is kept for backward.
    """
    _check_chunk(chunk_tokens)
    if logits.ndim != 3 or targets.ndim != 2 or logits.shape[0] != targets.shape[0] \
            or logits.shape[1] < first + targets.shape[1]:
        raise ValueError(f"logits {tuple(logits.shape)} must cover targets {tuple(targets.shape)} from "
                         f"position {first}: [B, >= first + T, V] and [B, T] must share [B, T]")
    if torch.is_grad_enabled() and logits.requires_grad:
        return _GatherLogprobs.apply(logits, targets, temperature, chunk_tokens, first)
    return _blockwise(logits, targets, temperature, chunk_tokens, first)[0]


def _blocks(targets: Tensor, chunk_tokens: int) -> list[tuple[int, slice]]:
    """(row, time slice) blocks along each row's time axis: a block is a view, never a copy."""
    return [(b, slice(t, t + chunk_tokens)) for b in range(targets.shape[0])
            for t in range(0, targets.shape[1], chunk_tokens)]


def _blockwise(logits: Tensor, targets: Tensor, temperature: float, chunk_tokens: int,
               first: int) -> tuple[Tensor, Tensor]:
    """(log-probs, logsumexp of logits / T) per target token, float32 [B, T] each, one block at a time."""
    out = torch.empty(targets.shape, dtype=torch.float32, device=targets.device)
    lse = torch.empty_like(out)
    with torch.no_grad():
        for b, ts in _blocks(targets, chunk_tokens):
            z = logits[b, first + ts.start : first + min(ts.stop, targets.shape[1])].float() / temperature
            lse[b, ts] = torch.logsumexp(z, dim=-1)
            out[b, ts] = z.gather(-1, targets[b, ts].unsqueeze(-1)).squeeze(-1) - lse[b, ts]
    return out, lse


class _GatherLogprobs(torch.autograd.Function):
    """target_logprobs with a blockwise backward: d logp_t / d z = onehot(target) − softmax(z), z = logits / T."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, temperature: float, chunk_tokens: int,
                first: int) -> Tensor:
        out, lse = _blockwise(logits, targets, temperature, chunk_tokens, first)
        ctx.save_for_backward(logits, targets, lse)
        ctx.settings = (temperature, chunk_tokens, first)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        logits, targets, lse = ctx.saved_tensors
        temperature, chunk_tokens, first = ctx.settings
        grad = torch.zeros_like(logits)
        for b, ts in _blocks(targets, chunk_tokens):
            rows = slice(first + ts.start, first + min(ts.stop, targets.shape[1]))
            g_out = grad_out[b, ts].float().unsqueeze(-1)
            p = torch.exp(logits[b, rows].float() / temperature - lse[b, ts].unsqueeze(-1))
            g = (-p * g_out).scatter_add_(-1, targets[b, ts].unsqueeze(-1), g_out)
            grad[b, rows] = (g / temperature).to(grad.dtype)
        return grad, None, None, None, None


def head_target_logprobs(
    hidden: Tensor, head: torch.nn.Module, targets: Tensor, temperature: float = 1.0, chunk_tokens: int = 256,
) -> Tensor:
    """log_softmax(head(hidden) / temperature)[targets], computing head(hidden) one block at a time.

    hidden [B, T, H], targets [B, T] -> float32 [B, T]; peak extra memory is one [chunk_tokens, V] block.
    """
    _check_chunk(chunk_tokens)
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} must share [B, T]")

    def block(h: Tensor, tgt: Tensor) -> Tensor:
        return _block_logprobs(head(h), tgt, temperature)

    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)  # [B*T, H] is small
    blocks = [
        _run_block(block, flat_h[i : i + chunk_tokens], flat_t[i : i + chunk_tokens])
        for i in range(0, flat_t.numel(), chunk_tokens)
    ]
    return torch.cat(blocks).view(targets.shape)


def decoder_and_head(model: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder returning hidden states, LM head) of an HF causal LM or a peft model wrapping one.

    Raises ValueError when logits are not exactly head(hidden) - the hidden path would be wrong there.
    """
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = getattr(hf, "base_model_prefix", None)
    decoder = getattr(hf, prefix, None) if prefix else None
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if decoder is None or decoder is hf or head is None:
        raise ValueError(
            f"{type(hf).__name__} exposes no decoder + output embeddings (base_model_prefix, "
            "get_output_embeddings); use mode='logits'"
        )
    config = getattr(hf, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, attr, None) not in (None, 1, 1.0):
            raise ValueError(f"{type(hf).__name__} post-processes its logits ({attr}); use mode='logits'")
    return decoder, head


def sequence_logprobs(
    model: Any, input_ids: Tensor, attention_mask: Tensor, completion_start: int, temperature: float = 1.0,
    *, mode: LogprobMode = "logits", chunk_tokens: int = 256, rows_per_forward: int | None = None,
) -> Tensor:
    """log π(token_t | tokens_<t) for every completion column t >= completion_start; shape [B, L − start].

    Layout (as TRL and HF generate produce it): prompts left-padded to a common length
    completion_start, completions right-padded after it; the loss mask for the result is
    attention_mask[:, completion_start:]. The logits at position t−1 predict token t, hence the
    shift: we keep positions start−1 .. L−2 and gather the ids at columns start .. L−1.
    Position ids are taken from the attention mask (as generate does with left padding), so the
    logprobs match those recorded while sampling. Divide by the sampling temperature likewise.
    mode / chunk_tokens / rows_per_forward: see the module docstring; every setting gives the same
    values (float32, within float rounding of a full log_softmax).
    """
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask "
                         f"{tuple(attention_mask.shape)} must both be [batch, length]")
    length = input_ids.shape[1]
    if not 1 <= completion_start < length:
        raise ValueError(f"completion_start={completion_start} must be in [1, {length - 1}]: the first "
                         "completion token needs at least one token before it")
    if mode not in ("logits", "hidden"):
        raise ValueError(f"mode={mode!r}: use 'logits' (model forward) or 'hidden' (decoder + chunked head)")
    if rows_per_forward is not None and rows_per_forward < 1:
        raise ValueError(f"rows_per_forward={rows_per_forward} must be >= 1 (or None: all rows at once)")
    step = rows_per_forward or input_ids.shape[0]
    parts = [
        _rows_logprobs(model, input_ids[lo : lo + step], attention_mask[lo : lo + step], completion_start,
                       temperature, mode, chunk_tokens)
        for lo in range(0, input_ids.shape[0], step)
    ]
    return torch.cat(parts)


def _rows_logprobs(
    model: Any, input_ids: Tensor, attention_mask: Tensor, start: int, temperature: float, mode: LogprobMode,
    chunk_tokens: int,
) -> Tensor:
    n_completion = input_ids.shape[1] - start
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    targets = input_ids[:, start:]
    if mode == "hidden":
        decoder, head = decoder_and_head(model)
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        hidden = out.last_hidden_state[:, start - 1 : -1]
        return head_target_logprobs(hidden, head, targets, temperature, chunk_tokens)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   logits_to_keep=n_completion + 1).logits
    # the last n + 1 positions, of which the first n predict the completion (a model may ignore logits_to_keep)
    return target_logprobs(logits, targets, temperature, chunk_tokens, first=logits.shape[1] - n_completion - 1)


def _check_chunk(chunk_tokens: int) -> None:
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
