"""A generation-only forward pass for Llama-family decoders (Llama, Qwen2), written as a dozen tensor ops a layer.

Why: after packing (``packed_linear.py``) and the reserved KV cache (``kv_cache.py``), what still separated the
CPU backend's decoding step from vLLM's CPU build was not the matrix products but everything around them
(torch profiler, Qwen2.5-Coder-0.5B fp32, batch 32, AVX-512 2-core machine: 180 of 221 ms in the linear layers,
~14 ms of Python in transformers' module calls, masks and cache bookkeeping, ~8 ms of element-wise ops). Here:

- one projection for q, k and v together, and one for gate and up together: 4 matrix products a layer instead
  of 7, each on a weight packed once for oneDNN when packing is on;
- RMSNorm weights folded into the projections after them; q and k rotated together;
- grouped-query attention without copies of the KV heads (a decoding step: two batched matrix products per
  layer; the prompt pass: SDPA's ``enable_gqa``), over the room a ``KVRoom`` reserved for the whole answer;
- no per-layer module dispatch, hooks, mask objects or cache classes.

It computes what transformers' forward computes, up to the summation order of the fused products and the norm
(fp32 logits equal to 3e-5 on Qwen2.5-Coder-0.5B, 1.2e-4 on SmolLM2-135M whose logits reach ~20; the same greedy
picks); ``tests/test_fused_decoder.py`` checks it against the model's own forward on left-padded batches, after
rows leave the batch, for both architectures. ``bench/engines.py`` has the end-to-end figures. Models it does not
cover keep transformers' forward, and ``fused_decoder_refusal`` says why: other architectures, sliding windows,
activations other than SiLU, rope types whose frequencies are not fixed at load, and projections that are not
plain ``nn.Linear`` (a LoRA adapter loaded through peft, a quantized layer: their ``.weight`` is not what they
compute, so a copy of it would silently drop the adapter or the quantization).

The decoder copies the weights when it is built: changing the model's weights afterwards is not followed (build a
new one). The screened greedy pick (``screened_argmax.py``) rescores from the model's own head weight, a reference,
so after such a change it would no longer agree with its own bf16 copy either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lemon_core.backends.packed_linear import PackedLinear
from lemon_core.backends.screened_argmax import ScreenedArgmax

# Architectures whose decoder layer is exactly: x + attn(rmsnorm(x)); x + mlp(rmsnorm(x)), with
# q/k/v/o projections (q/k/v biases optional), rotary embeddings on q and k, and a SiLU-gated MLP.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


# Rope types whose frequencies transformers fixes when the model loads (``rotary_emb.inv_freq`` and
# ``attention_scaling``); others (dynamic, longrope) change them with the sequence length.
FIXED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def fused_decoder_refusal(model: nn.Module) -> str | None:
    """Why ``FusedDecoder`` cannot run ``model`` (None when it can): the backend then keeps transformers' forward."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if hasattr(model, "peft_config") or getattr(cfg, "quantization_config", None) is not None:
        return "a peft adapter or a quantized model (merge or dequantize it first)"
    if getattr(cfg, "use_sliding_window", False) or any(
        kind != "full_attention" for kind in getattr(cfg, "layer_types", None) or []
    ):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    body = getattr(model, "model", None)
    rope = getattr(body, "rotary_emb", None)
    if rope is None or not hasattr(rope, "inv_freq"):
        return "no rotary embedding module (model.model.rotary_emb with inv_freq)"
    if getattr(rope, "rope_type", "default") not in FIXED_ROPE_TYPES:
        return f"rope type {rope.rope_type!r} is not one whose frequencies are fixed at load {FIXED_ROPE_TYPES}"
    projections = [getattr(model, "lm_head", None)]
    for layer in getattr(body, "layers", None) or [None]:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections += [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if any(type(p) is not nn.Linear for p in projections):
        return "projections that are not plain nn.Linear layers (a LoRA adapter, quantized or packed layers)"
    return None


def _projection(
    weights: list[torch.Tensor], biases: list[torch.Tensor | None], pack: bool, norm: torch.Tensor | None = None
) -> nn.Module:
    """One linear layer computing ``weights`` stacked on their output rows (q, k, v -> qkv).

    ``norm``: the weight of the RMSNorm in front of it, folded into the columns (``W @ (g * x) = (W * g) @ x``),
    so the norm itself is only the scaling by 1/rms."""
    dtype = weights[0].dtype
    weight = torch.cat([w.detach().float() for w in weights])
    if norm is not None:
        weight = weight * norm.detach().float()
    weight = weight.to(dtype)
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases, strict=True)]
    )
    dense = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")  # meta: no random init
    dense.weight = nn.Parameter(weight, requires_grad=False)
    dense.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
    return PackedLinear(dense) if pack else dense


@dataclass
class _Layer:
    qkv: nn.Module  # input RMSNorm's weight folded in
    o: nn.Module
    gate_up: nn.Module  # post-attention RMSNorm's weight folded in
    down: nn.Module


class KVRoom:
    """Keys and values of every layer in buffers of ``capacity`` positions, filled left to right in lock-step
    (prompts are left-padded, so every row's step t writes column ``filled``)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.filled = 0

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's keys/values of ``layer``; returns views of all positions filled so far.

        Keys of one row when the room holds more (a shared prompt prefix, ``FusedDecoder.prefill_shared``) are
        written to every row, and the views returned are of that one row: the pass that wrote them is batch 1."""
        rows, start, end = keys.shape[0], self.filled, self.filled + keys.shape[2]
        if end > self.keys[layer].shape[2]:
            raise ValueError(f"KVRoom holds {self.keys[layer].shape[2]} positions; this step needs {end}")
        if rows != self.keys[layer].shape[0] and not (rows == 1 and start == 0):  # only a prefix is shared
            raise ValueError(f"KVRoom holds {self.keys[layer].shape[0]} rows; this step wrote {rows} at {start}")
        self.keys[layer][:, :, start:end].copy_(keys)  # a shared prefix's one row is broadcast to every row
        self.values[layer][:, :, start:end].copy_(values)
        return self.keys[layer][:rows, :, :end], self.values[layer][:rows, :, :end]

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (finished rows leave the batch), moved to the front; only filled positions are copied.
        Named as transformers' caches name it, so the decoding loop treats both rooms alike."""
        kept = len(rows)
        for buffers in (self.keys, self.values):
            for i, buffer in enumerate(buffers):
                buffer[:kept, :, : self.filled] = buffer[rows, :, : self.filled]  # the right side is a copy
                buffers[i] = buffer[:kept]


class FusedDecoder:
    """The forward pass of ``model`` (a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``) for generation.

    Holds its own fused copies of the projection weights (packed for oneDNN when ``pack``), with each RMSNorm's
    weight folded into the projection after it; the embedding is shared with ``model``. Call ``new_room`` once
    per batch (then ``prefill_shared`` when the prompts share a prefix), then ``logits`` (or, when every row
    decodes greedily, ``greedy_tokens``) once per step. ``screen``: pick greedy tokens through a bf16 screen of
    the output head (``screened_argmax.py``; fp32 models only) instead of from the fp32 logits."""

    def __init__(self, model: nn.Module, pack: bool, screen: bool = False) -> None:
        refusal = fused_decoder_refusal(model)
        if refusal is not None:
            raise ValueError(f"FusedDecoder cannot run this model: {refusal}")
        cfg, body = model.config, model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.embed = body.embed_tokens.weight.detach()
        self.head = _projection([model.lm_head.weight], [None], pack, norm=body.norm.weight)
        self.inv_freq = body.rotary_emb.inv_freq.detach().float()
        self.rope_scale = float(getattr(body.rotary_emb, "attention_scaling", 1.0))
        self.layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                qkv=_projection([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight],
                                [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias], pack,
                                norm=layer.input_layernorm.weight),
                o=_projection([attn.o_proj.weight], [attn.o_proj.bias], pack),
                gate_up=_projection([mlp.gate_proj.weight, mlp.up_proj.weight], [mlp.gate_proj.bias, mlp.up_proj.bias],
                                    pack, norm=layer.post_attention_layernorm.weight),
                down=_projection([mlp.down_proj.weight], [mlp.down_proj.bias], pack),
            ))
        self.dtype, self.device = self.embed.dtype, self.embed.device
        if screen and self.dtype != torch.float32:
            raise ValueError(f"the bf16 screen of the output head is for fp32 models (this one is {self.dtype})")
        self.screened_argmax = ScreenedArgmax(model.lm_head.weight, body.norm.weight) if screen else None
        projections = [self.head, *(p for lay in self.layers for p in (lay.qkv, lay.o, lay.gate_up, lay.down))]
        self.packed_layers = sum(isinstance(p, PackedLinear) for p in projections)

    def new_room(self, batch: int, capacity: int) -> KVRoom:
        """The KV buffers for one batch: ``capacity`` = padded prompt width + the most tokens any row may write."""
        return KVRoom(len(self.layers), batch, self.kv_heads, capacity, self.head_dim, self.dtype, self.device)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention: torch.Tensor, room: KVRoom) -> torch.Tensor:
        """Last-position logits ``[batch, vocab]`` after feeding ``input_ids`` ``[batch, new]`` (the whole left-padded
        prompt at the first step, or what follows its shared prefix; one token a row after). ``attention``
        ``[batch, filled + new]`` is 1 on real tokens, 0 on padding; it fixes each token's position and what it may
        attend to."""
        return self.head(self._unit_rms(self._hidden(input_ids, attention, room)[:, -1]))

    @torch.no_grad()
    def greedy_tokens(self, input_ids: torch.Tensor, attention: torch.Tensor, room: KVRoom) -> torch.Tensor:
        """Each row's greedy next token ``[batch]``: ``logits(...).max(-1).indices``, through the bf16 screen when
        the decoder has one (the same picks up to fp32 summation order, at about half the output head's time)."""
        hidden = self._unit_rms(self._hidden(input_ids, attention, room)[:, -1])
        if self.screened_argmax is None:
            return self.head(hidden).max(-1).indices
        return self.screened_argmax(hidden)

    @torch.no_grad()
    def prefill_shared(self, prefix_ids: torch.Tensor, room: KVRoom) -> None:
        """Run the prompts' shared prefix ``[1, P]`` once and write its keys and values into every row of the empty
        ``room`` (``backends/shared_prefix.py`` lays the batch out for it); ``logits`` then takes each row's own
        tokens. No logits: the prefix's last position is not where generation starts."""
        if room.filled:
            raise ValueError(f"prefill_shared needs an empty room; this one holds {room.filled} positions")
        self._hidden(prefix_ids, torch.ones_like(prefix_ids), room)

    def _hidden(self, input_ids: torch.Tensor, attention: torch.Tensor, room: KVRoom) -> torch.Tensor:
        """The last layer's output ``[batch, new, hidden]`` (before the final norm), keys and values stored."""
        new = input_ids.shape[1]
        cos, sin = self._rotary(token_positions(attention, new))
        mask = _attention_mask(attention, new).to(self.dtype)
        if new == 1:  # decoding attends per KV head (``_attention``): the mask of each [batch x kv head] pair
            mask = mask.expand(-1, self.kv_heads, -1, -1).reshape(-1, 1, attention.shape[1])
        x = F.embedding(input_ids, self.embed)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, self._unit_rms(x), cos, sin, mask, room)
            gate, up = layer.gate_up(self._unit_rms(x)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        room.filled += new
        return x

    def _unit_rms(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the next projection)."""
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)

    def _attention(self, index: int, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   mask: torch.Tensor, room: KVRoom) -> torch.Tensor:
        batch, new, _ = x.shape
        q_and_k, v = layer.qkv(x).split(
            [(self.heads + self.kv_heads) * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        # q and k rotated together: [batch, new, heads + kv_heads, head_dim] with cos/sin [batch, new, 1, head_dim]
        q_and_k = _rotate(q_and_k.view(batch, new, self.heads + self.kv_heads, self.head_dim), cos, sin)
        q, k = q_and_k.transpose(1, 2).split([self.heads, self.kv_heads], dim=1)
        v = v.view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        keys, values = room.write(index, k, v)
        if new == 1:  # decoding: the query heads of one KV head as the rows of one small product (no copies of
            # the KV heads, and two matrix products instead of SDPA's per-call overhead, which is most of its cost)
            pairs, filled = batch * self.kv_heads, keys.shape[2]
            q = q.reshape(pairs, self.heads // self.kv_heads, self.head_dim)
            keys, values = keys.reshape(pairs, filled, self.head_dim), values.reshape(pairs, filled, self.head_dim)
            scores = torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=self.head_dim**-0.5)
            out = torch.bmm(scores.softmax(-1), values)
            return layer.o(out.reshape(batch, 1, self.heads * self.head_dim))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return layer.o(out.transpose(1, 2).reshape(batch, new, self.heads * self.head_dim))

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[batch, new, 1, head_dim]`` at each token's position (rotate-half layout)."""
        angles = positions.unsqueeze(-1).float() * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1).unsqueeze(2)
        return (angles.cos() * self.rope_scale).to(self.dtype), (angles.sin() * self.rope_scale).to(self.dtype)


def token_positions(attention: torch.Tensor, new: int) -> torch.Tensor:
    """Position ids ``[batch, new]`` of the last ``new`` tokens: a row's real tokens count from 0, skipping its
    padding (left padding, or padding between a shared prefix and the row's own tokens); a padding position gets
    the position before it (0 at the left edge), which nothing reads since padding is masked."""
    return (attention.cumsum(-1) - 1).clamp(min=0)[:, -new:]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _attention_mask(attention: torch.Tensor, new: int) -> torch.Tensor:
    """Additive mask ``[batch, 1, new, filled + new]``: 0 where a token sees a key (the real tokens up to itself),
    -inf elsewhere.

    A padding position also sees itself, so its softmax is never over nothing (NaN would reach the values that
    the real tokens then multiply by zero weight, and NaN x 0 is NaN)."""
    total = attention.shape[1]
    real = attention.bool()[:, None, None, :]
    key_pos = torch.arange(total, device=attention.device)
    query_pos = torch.arange(total - new, total, device=attention.device)
    causal = key_pos[None, :] <= query_pos[:, None]
    itself = key_pos[None, :] == query_pos[:, None]
    seen = (real & causal) | itself
    return torch.zeros(seen.shape, dtype=torch.float32, device=attention.device).masked_fill_(~seen, float("-inf"))
