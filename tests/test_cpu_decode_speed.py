"""The CPU decoding speed-ups keep every result: the reserved KV cache, the batch's one-call greedy pick,
oneDNN-packed linear layers at any row count, and glibc's kept heap pad (``bench/engines.py`` has the speed)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_chat_model  # tests/ is on sys.path
from transformers.cache_utils import DynamicCache, DynamicLayer

from lemon_core.backends import cpu_allocator, transformers_backend
from lemon_core.backends.base import GenerationRequest
from lemon_core.backends.kv_cache import ReservedKVLayer, reserved_kv_cache
from lemon_core.backends.packed_linear import PACK_FOR_ROWS, PackedLinear
from lemon_core.backends.transformers_backend import TransformersBackend, _pick_rows


def _states(batch: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, tokens, 4, generator=g), torch.randn(batch, 2, tokens, 4, generator=g)


def test_reserved_layer_returns_what_the_concatenating_layer_returns() -> None:
    """Prefill, steps past the reserved room (it grows), then rows leaving the batch, then more steps."""
    reserved, dynamic = ReservedKVLayer(capacity=6), DynamicLayer()
    steps = [(4, 5), (4, 1), (4, 1), (4, 1)]  # (batch, new tokens): 5 + 3 = 8 > 6 reserved
    for i, (batch, tokens) in enumerate(steps):
        k, v = _states(batch, tokens, seed=i)
        got, want = reserved.update(k, v), dynamic.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    keep = torch.tensor([0, 2])
    reserved.batch_select_indices(keep)
    dynamic.batch_select_indices(keep)
    k, v = _states(2, 1, seed=9)
    got, want = reserved.update(k, v), dynamic.update(k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert reserved.get_seq_length() == dynamic.get_seq_length() == 9
    reserved.batch_select_indices(torch.tensor([1, 0]))  # out of order: rows swap places in the same buffers
    dynamic.batch_select_indices(torch.tensor([1, 0]))
    k, v = _states(2, 1, seed=10)
    got, want = reserved.update(k, v), dynamic.update(k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_backend_writes_the_same_with_the_reserved_cache_as_with_transformers_cache(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = TransformersBackend(str(model_dir), fused_forward=False)  # the cache of transformers' forward
    assert all(isinstance(layer, ReservedKVLayer) for layer in reserved_kv_cache(backend.model.config, 8).layers)
    requests = [  # different prompt lengths and caps, so rows leave the batch at different steps
        GenerationRequest.chat("You are a solver.", "What is 12 + 30?", max_tokens=16),
        GenerationRequest.chat(None, "hi", max_tokens=5),
        GenerationRequest.chat(None, "Check: 3 + 5 = 8.", max_tokens=24, temperature=0.9, seed=3),
    ]
    capacities: list[int] = []

    def spy(config: object, capacity: int) -> object:
        capacities.append(capacity)
        return reserved_kv_cache(config, capacity)

    monkeypatch.setattr(transformers_backend, "reserved_kv_cache", spy)
    reserved = backend.generate(requests)
    width = max(len(backend.encode(r)) for r in requests)
    assert capacities == [width + 24]  # one cache for the batch: padded prompt + its largest max_tokens
    monkeypatch.setattr(transformers_backend, "reserved_kv_cache", lambda config, capacity: DynamicCache(config=config))
    concatenating = backend.generate(requests)
    assert [c.text for c in reserved] == [c.text for c in concatenating]
    assert [c.completion_tokens for c in reserved] == [c.completion_tokens for c in concatenating]
    assert all(c.ok for c in reserved) and reserved[0].completion_tokens > 5


def test_greedy_rows_pick_the_first_maximum_and_sampled_rows_their_own_draw() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 5.0], [0.0, 0.0, 9.0, 0.0]])
    greedy = GenerationRequest.chat(None, "q", max_tokens=4)
    sampled = GenerationRequest.chat(None, "q", max_tokens=4, temperature=1.0, seed=7)
    gens = [torch.Generator().manual_seed(s) for s in (0, 0, 7)]
    picks = _pick_rows(logits, [greedy, greedy, sampled], gens)
    assert picks[:2] == [1, 0]  # ties go to the first index, as argmax's do
    others = torch.tensor([[9.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]])  # rows 0-1 change, row 2 does not
    again = _pick_rows(torch.cat([others, logits[2:]]), [greedy, greedy, sampled],
                       [torch.Generator().manual_seed(s) for s in (5, 6, 7)])
    assert again[:2] == [0, 3] and again[2] == picks[2]  # a sampled row's draw depends on its own seed only
    silent = GenerationRequest.chat(None, "q", max_tokens=0, temperature=1.0, seed=7)
    nan_row = torch.full((1, 4), float("nan"))  # never sampled: a row that may write nothing is not picked
    assert _pick_rows(nan_row, [silent], [torch.Generator()]) == [-1]
    flat = torch.zeros(2, 50)  # uniform: a different seed draws a different token somewhere in 20 tries
    draws = {tuple(_pick_rows(flat, [sampled, sampled], [torch.Generator().manual_seed(s), torch.Generator()
                                                         .manual_seed(s + 1)])) for s in range(20)}
    assert any(a != b for a, b in draws)


@pytest.mark.parametrize("rows", [1, 7, PACK_FOR_ROWS, 3 * PACK_FOR_ROWS + 5])
def test_packed_linear_matches_the_dense_layer_at_any_row_count(rows: int) -> None:
    torch.manual_seed(rows)
    dense = torch.nn.Linear(48, 80)
    x = torch.randn(rows, 48)
    with torch.no_grad():
        assert torch.allclose(PackedLinear(dense)(x), dense(x), atol=1e-5)
        assert torch.allclose(PackedLinear(dense)(x.t().contiguous().t()), dense(x), atol=1e-5)  # strided input


def test_packed_linear_refuses_to_lose_a_gradient() -> None:
    packed = PackedLinear(torch.nn.Linear(8, 4))
    with pytest.raises(RuntimeError, match="inference-only"):
        packed(torch.randn(2, 8, requires_grad=True))


def test_heap_pad_is_set_on_glibc_and_skipped_where_there_is_no_mallopt(monkeypatch: pytest.MonkeyPatch) -> None:
    if hasattr(ctypes.CDLL(None), "mallopt"):  # glibc (CI, the images)
        assert cpu_allocator.keep_heap_pad() is True

    class NoMallopt:  # a C library without it (musl, macOS)
        def __init__(self, name: object) -> None:
            pass

    monkeypatch.setattr(cpu_allocator.ctypes, "CDLL", NoMallopt)
    assert cpu_allocator.keep_heap_pad() is False


def test_reserved_layer_refuses_what_it_does_not_implement() -> None:
    layer = ReservedKVLayer(capacity=4)
    layer.update(*_states(2, 1, seed=0))
    for call in (lambda: layer.reorder_cache(torch.tensor([1, 0])), lambda: layer.batch_repeat_interleave(2),
                 layer.offload):
        with pytest.raises(NotImplementedError):
            call()


def test_reserved_layer_crops_and_resets_like_the_concatenating_layer() -> None:
    reserved, dynamic = ReservedKVLayer(capacity=8), DynamicLayer()
    for layer in (reserved, dynamic):
        layer.update(*_states(2, 5, seed=0))
        layer.crop(-2)  # forget the last 2 positions
    assert reserved.get_seq_length() == dynamic.get_seq_length() == 3
    k, v = _states(2, 1, seed=1)
    got, want = reserved.update(k, v), dynamic.update(k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    reserved.reset()
    got = reserved.update(k, v)
    assert reserved.get_seq_length() == 1 and torch.equal(got[0], k)
