"""lemon's fused forward pass (``backends/fused_decoder.py``) computes what transformers' forward computes.

Checked on tiny Llama and Qwen2 models with grouped-query attention (4 query heads sharing 2 key/value heads)
and a left-padded batch of prompts of different lengths: the prompt pass, decoding steps, and steps after
rows have left the batch, with and without oneDNN-packed projections; then the backend end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_chat_model  # tests/ is on sys.path
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, MistralConfig

from lemon_core.backends import transformers_backend
from lemon_core.backends.base import BackendError, GenerationRequest
from lemon_core.backends.fused_decoder import FusedDecoder, fused_decoder_refusal
from lemon_core.backends.kv_cache import reserved_kv_cache
from lemon_core.backends.shared_prefix import MIN_SHARED_PREFIX, shared_prefix_layout, shared_prefix_length
from lemon_core.backends.transformers_backend import TransformersBackend


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch = str(request.param)
    return build_tiny_chat_model(tmp_path_factory.mktemp(arch) / "model", seed=1, arch=arch,
                                 hidden_size=256, num_layers=2, kv_heads=2)


def _randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """RMSNorm weights and biases drawn at random: a fresh model has every norm weight 1 and every bias 0, which
    would let a wrong folding of the norms or a dropped bias pass."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if "norm" in name else 0.0))
    return model


def _assert_same_logits(fused: torch.Tensor, reference: torch.Tensor) -> None:
    """Equal up to fp32 summation order: 5e-5 of the logits' scale (a wrong norm fold, bias or head is O(scale)).

    Why 5e-5 and not less: on an AMD EPYC machine (2026-12-06) one row of the shared-prefix test differed by 2.4e-5
    of the scale. Against the same model in fp64 that row is ill-conditioned for both fp32 paths: the model's own
    fp32 forward is 2.0e-4 off at the prompt pass, the fused one 0.8-2.9e-4 over three steps, the other rows
    1-4e-5, with the prefix shared or not (the same figures) and on unpacked weights too (1.9e-5-1.3e-4)."""
    assert fused.shape == reference.shape
    scale = float(reference.abs().max())
    assert float((fused - reference).abs().max()) <= 5e-5 * max(scale, 1.0), (scale, (fused - reference).abs().max())


def _decode_side_by_side(model: torch.nn.Module, prompts: list[list[int]], steps: int) -> None:
    """The prompt pass and ``steps - 1`` greedy decoding steps, fused (packed) and the model's own, logits equal."""
    decoder = FusedDecoder(model, pack=True)
    ids, attention = _left_padded(prompts, pad=0)
    capacity = ids.shape[1] + steps
    room, cache = decoder.new_room(len(prompts), capacity), reserved_kv_cache(model.config, capacity)
    for _ in range(steps):
        fused, reference = decoder.logits(ids, attention, room), _reference_logits(model, ids, attention, cache)
        _assert_same_logits(fused, reference)
        ids = reference.argmax(-1, keepdim=True)
        attention = torch.cat([attention, torch.ones_like(ids)], dim=1)


def _left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], attention[i, width - len(r):] = torch.tensor(r), 1
    return ids, attention


def _reference_logits(
    model: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor, cache: object
) -> torch.Tensor:
    positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                use_cache=True)
    return out.logits[:, -1]


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "dense"])
@torch.no_grad()
def test_fused_logits_equal_the_models_own_through_prefill_decoding_and_rows_leaving(
    model_dir: Path, pack: bool
) -> None:
    model = _randomised(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval())
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    decoder = FusedDecoder(model, pack=pack)
    assert decoder.packed_layers == (4 * 2 + 1 if pack else 0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in (9, 4, 6)]
    ids, attention = _left_padded(prompts, pad=0)
    room, cache = decoder.new_room(3, ids.shape[1] + 8), reserved_kv_cache(model.config, ids.shape[1] + 8)
    fused, reference = decoder.logits(ids, attention, room), _reference_logits(model, ids, attention, cache)
    assert fused.shape == (3, model.config.vocab_size)
    _assert_same_logits(fused, reference)
    for step in range(5):
        if step == 3:  # the middle row finishes: rows 0 and 2 go on, moved to the front
            keep = torch.tensor([0, 2])
            room.batch_select_indices(keep)
            cache.batch_select_indices(keep)
            attention, reference = attention[keep], reference[keep]
        ids = reference.argmax(-1, keepdim=True)
        attention = torch.cat([attention, torch.ones_like(ids)], dim=1)
        fused, reference = decoder.logits(ids, attention, room), _reference_logits(model, ids, attention, cache)
        _assert_same_logits(fused, reference)
    assert room.filled == attention.shape[1] and fused.shape[0] == 2
    # The room holds what it reserved and says so instead of writing past it.
    with pytest.raises(ValueError, match="KVRoom holds"):
        decoder.logits(torch.zeros((2, 9), dtype=torch.long), torch.ones((2, attention.shape[1] + 9)), room)


@pytest.mark.parametrize("own_lengths", [(5, 1, 3), (1, 1, 1)], ids=["padded", "identical-prompts"])
@torch.no_grad()
def test_a_shared_prefix_run_once_gives_every_row_the_logits_of_its_whole_prompt(
    model_dir: Path, own_lengths: tuple[int, ...]
) -> None:
    """``prefill_shared`` writes one pass over the prompts' common prefix into every row; each row then feeds its
    own tokens (left-padded after the prefix). Logits must equal the model's own over each whole prompt, through
    decoding and rows leaving: a prefix written to one row only, or positions that restart after the padding,
    would differ at once. One own token a row (identical prompts: the prefix is all but the last token) sends the
    prompt pass through the decoding branch of the attention."""
    model = _randomised(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval())
    decoder = FusedDecoder(model, pack=True)
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, model.config.vocab_size, (7,), generator=g).tolist()
    own = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in own_lengths]
    prompts = [prefix + o for o in own]
    ids, attention = shared_prefix_layout(prompts, len(prefix), pad_id=0)
    room = decoder.new_room(3, ids.shape[1] + 6)
    decoder.prefill_shared(ids[:1, : len(prefix)], room)
    assert room.filled == len(prefix)
    fused = decoder.logits(ids[:, len(prefix) :], attention, room)
    full_ids, full_attention = _left_padded(prompts, pad=0)  # the reference: every row's whole prompt
    cache = reserved_kv_cache(model.config, full_ids.shape[1] + 6)
    reference = _reference_logits(model, full_ids, full_attention, cache)
    _assert_same_logits(fused, reference)
    for step in range(4):
        if step == 2:  # the first row finishes
            keep = torch.tensor([1, 2])
            room.batch_select_indices(keep)
            cache.batch_select_indices(keep)
            attention, full_attention, reference = attention[keep], full_attention[keep], reference[keep]
        step_ids = reference.argmax(-1, keepdim=True)
        attention = torch.cat([attention, torch.ones_like(step_ids)], dim=1)
        full_attention = torch.cat([full_attention, torch.ones_like(step_ids)], dim=1)
        fused = decoder.logits(step_ids, attention, room)
        reference = _reference_logits(model, step_ids, full_attention, cache)
        _assert_same_logits(fused, reference)
    with pytest.raises(ValueError, match="empty room"):
        decoder.prefill_shared(ids[:1, : len(prefix)], room)
    with pytest.raises(ValueError, match="KVRoom holds 2 rows; this step wrote 1"):  # only a prefix is broadcast
        decoder.logits(step_ids[:1], attention[:1], room)


def test_backend_writes_the_same_with_its_shared_prefix_run_once_as_without(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents' prompts share the chat template's system turn; the backend runs it once per batch. What each row
    writes must not change (greedy and seeded sampling, rows leaving at different steps)."""
    backend = TransformersBackend(str(model_dir))
    system = "You are a careful solver. Read the task, work it out step by step, and end with the answer."
    requests = [
        GenerationRequest.chat(system, "What is 12 + 30?", max_tokens=16),
        GenerationRequest.chat(system, "hi", max_tokens=5),
        GenerationRequest.chat(system, "Check: 3 + 5 = 8.", max_tokens=24, temperature=0.9, seed=3),
    ]
    assert shared_prefix_length([backend.encode(r) for r in requests]) >= MIN_SHARED_PREFIX
    prefixes: list[int] = []
    prefill_shared = backend.decoder.prefill_shared

    def counted_prefill_shared(ids: torch.Tensor, room: object) -> None:
        prefixes.append(ids.shape[1])
        prefill_shared(ids, room)

    monkeypatch.setattr(backend.decoder, "prefill_shared", counted_prefill_shared)
    shared = backend.generate(requests)
    assert prefixes == [shared_prefix_length([backend.encode(r) for r in requests])]  # it did run once
    monkeypatch.setattr(transformers_backend, "shared_prefix_length", lambda _prompts: 0)
    whole = backend.generate(requests)
    assert len(prefixes) == 1  # not run when turned off
    assert [c.text for c in shared] == [c.text for c in whole]
    assert [c.completion_tokens for c in shared] == [c.completion_tokens for c in whole]
    assert all(c.ok for c in shared) and shared[2].completion_tokens > 5


def test_backend_writes_the_same_with_the_fused_forward_as_with_transformers(model_dir: Path) -> None:
    fused = TransformersBackend(str(model_dir))
    reference = TransformersBackend(str(model_dir), fused_forward=False)
    assert fused.decoder is not None and reference.decoder is None  # fused: the CPU default for llama/qwen2
    assert TransformersBackend(str(model_dir), dtype="bfloat16").decoder is None  # measured and tested in fp32
    requests = [  # different prompt lengths and caps, so rows leave the batch at different steps
        GenerationRequest.chat("You are a solver.", "What is 12 + 30?", max_tokens=16),
        GenerationRequest.chat(None, "hi", max_tokens=5),
        GenerationRequest.chat(None, "Check: 3 + 5 = 8.", max_tokens=24, temperature=0.9, seed=3),
        GenerationRequest.chat("You are a verifier.", "def add(a, b):", max_tokens=12, temperature=1.3, seed=1),
    ]
    ours, theirs = fused.generate(requests), reference.generate(requests)
    assert [c.text for c in ours] == [c.text for c in theirs]
    assert [c.completion_tokens for c in ours] == [c.completion_tokens for c in theirs]
    assert all(c.ok for c in ours) and ours[2].completion_tokens > 5


def test_models_the_fused_forward_does_not_cover_keep_transformers_forward(tmp_path: Path) -> None:
    model_dir = build_tiny_chat_model(tmp_path / "model", seed=0)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    (model_dir / "config.json").write_text(json.dumps(config))
    backend = TransformersBackend(str(model_dir))
    assert fused_decoder_refusal(backend.model) == "sliding-window attention"
    assert backend.decoder is None  # the default falls back to transformers' forward, and it still writes
    assert backend.generate([GenerationRequest.chat(None, "hi", max_tokens=4)])[0].ok
    with pytest.raises(BackendError, match="fused_forward=true cannot run .*sliding-window attention"):
        TransformersBackend(str(model_dir), fused_forward=True)
    with pytest.raises(ValueError, match="FusedDecoder cannot run this model: sliding-window attention"):
        FusedDecoder(backend.model, pack=False)


ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
@torch.no_grad()
def test_fused_logits_equal_the_models_own_under_scaled_rotary_embeddings(tmp_path: Path, rope: str) -> None:
    """Rope types whose frequencies are fixed at load (the fused forward reads them from the model's own rotary
    module, with yarn's attention scaling) give the same logits; one that changes with the length is refused."""
    model_dir = build_tiny_chat_model(tmp_path / "model", seed=2, arch="llama", hidden_size=256, kv_heads=2)
    config = AutoConfig.from_pretrained(model_dir)
    config.rope_parameters = {"rope_theta": 10000.0, **ROPES[rope]}
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    assert model.model.rotary_emb.rope_type == rope
    _decode_side_by_side(model, [[5, 9, 11, 30, 7, 8, 40, 41, 3, 12, 19, 22], [6, 7, 8]], steps=4)
    config.rope_parameters = {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0}
    dynamic = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32)
    assert "rope type 'dynamic' is not one whose frequencies are fixed" in (fused_decoder_refusal(dynamic) or "")


@torch.no_grad()
def test_fused_logits_equal_the_models_own_with_biases_tied_embeddings_and_a_head_dim_of_its_own() -> None:
    """Llama with attention and MLP biases, the output head tied to the embedding, and head_dim (48) that is not
    hidden_size / heads (128 / 4): each read from where transformers reads it."""
    config = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=48, attention_bias=True,
                         mlp_bias=True, tie_word_embeddings=True, max_position_embeddings=64)
    torch.manual_seed(0)
    model = _randomised(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), seed=1)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _decode_side_by_side(model, [[5, 9, 11, 30, 7, 8], [6, 7]], steps=3)


def test_a_lora_checkpoint_is_served_with_its_adapter_folded_in(tmp_path: Path) -> None:
    """A LoRA checkpoint (adapter only) loads with its adapter folded into plain layers, which the backend packs
    and fuses; it writes what the same weights merged into a full checkpoint write, and not what the base writes.
    (Loaded through transformers' own peft integration instead, the packed layers broke peft's forward: every
    request failed with "'PackedLinear' object has no attribute 'weight'".) A model that still carries peft
    layers is refused by the fused forward, whose copies of ``.weight`` would drop the adapter."""
    peft = pytest.importorskip("peft")
    base_dir = build_tiny_chat_model(tmp_path / "base", seed=0)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=32, init_lora_weights=False,
                                                     target_modules=["q_proj", "v_proj", "gate_proj"]))
    adapter_dir = tmp_path / "adapter"
    lora.save_pretrained(adapter_dir)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(adapter_dir)
    assert "peft adapter" in (fused_decoder_refusal(lora) or "")
    with pytest.raises(ValueError, match="FusedDecoder cannot run this model"):
        FusedDecoder(lora, pack=True)
    adapted = TransformersBackend(str(adapter_dir))
    assert adapted.decoder is not None and adapted.packed_linear_layers > 0
    requests = [GenerationRequest.chat(None, "hi", max_tokens=8), GenerationRequest.chat(None, "2 + 2?", max_tokens=8)]
    with_adapter = adapted.generate(requests)
    assert all(c.ok for c in with_adapter)
    merged_dir = tmp_path / "merged"
    lora.merge_and_unload().save_pretrained(merged_dir)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(merged_dir)
    for fused in (True, False):
        merged = TransformersBackend(str(merged_dir), fused_forward=fused)
        assert [c.text for c in merged.generate(requests)] == [c.text for c in with_adapter]
    assert [c.text for c in with_adapter] != [c.text for c in TransformersBackend(str(base_dir)).generate(requests)]


def test_a_lora_checkpoint_without_peft_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base_dir = build_tiny_chat_model(tmp_path / "base", seed=0)
    (base_dir / "adapter_config.json").write_text("{}")  # what marks a folder as a LoRA checkpoint
    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` raise ImportError
    with pytest.raises(BackendError, match=r"is a LoRA checkpoint .*pip install peft==0.21.2"):
        TransformersBackend(str(base_dir))


def test_what_the_fused_forward_refuses_is_named() -> None:
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=64)
    cases = {
        "model_type 'mistral' is not one of": MistralConfig(**common),
        "hidden_act 'gelu'": LlamaConfig(**common, hidden_act="gelu"),
        "rope type 'longrope' is not one whose frequencies are fixed at load": LlamaConfig(
            **common, max_position_embeddings=64,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 32,
                             "long_factor": [2.0] * 32, "original_max_position_embeddings": 32},
        ),
    }
    for message, config in cases.items():
        model = AutoModelForCausalLM.from_config(config)
        assert message in (fused_decoder_refusal(model) or ""), message
        with pytest.raises(ValueError, match="FusedDecoder cannot run this model"):
            FusedDecoder(model, pack=False)
