"""TransformersBackend on a tiny random-weight Qwen2 chat model built offline (tests/tiny_models.py).

Every behaviour is checked on both forward passes the backend has: lemon's fused one (the CPU default for
Llama/Qwen2, ``fused_decoder.py``) and transformers' own (every other model)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import build_tiny_chat_model  # tests/ is on sys.path (pytest rootdir-less import)

from lemon_core.backends.base import STOPPED, BackendError, GenerationRequest
from lemon_core.backends.packed_linear import PackedLinear
from lemon_core.backends.transformers_backend import TransformersBackend

PROMPTS = [
    ("You are a solver.", "What is 12 + 30? Answer with a number. Think step by step, then answer."),
    (None, "hi"),
    ("You are a verifier.", "Check: 3 apples + 5 apples = 8 apples."),
    (None, "def add(a, b):"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


FORWARDS = {"fused": True, "transformers": False}


@pytest.fixture(scope="module", params=sorted(FORWARDS))
def forward(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def backend(model_dir: Path, forward: str) -> TransformersBackend:
    return TransformersBackend(str(model_dir), fused_forward=FORWARDS[forward])


def before_each_forward(b: TransformersBackend, call: Callable[[torch.Tensor], None]) -> Callable[[], None]:
    """Run ``call(input_ids)`` before every forward pass of ``b``'s decoding loop; returns the undo."""
    if b.decoder is not None:  # a step asks for logits, or (all rows greedy) for the picks alone
        originals = {name: getattr(b.decoder, name) for name in ("logits", "greedy_tokens")}

        def spy(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
            def spied(input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
                call(input_ids)
                return original(input_ids, *args)
            return spied

        def undo() -> None:
            for name, original in originals.items():
                setattr(b.decoder, name, original)

        for name, original in originals.items():
            setattr(b.decoder, name, spy(original))
        return undo
    hook = b.model.register_forward_pre_hook(lambda _m, _a, kwargs: call(kwargs["input_ids"]), with_kwargs=True)
    return hook.remove


def greedy(max_tokens: int = 10) -> list[GenerationRequest]:
    return [GenerationRequest.chat(s, u, max_tokens=max_tokens) for s, u in PROMPTS]


def first_greedy_token(b: TransformersBackend, r: GenerationRequest) -> int:
    with torch.no_grad():
        return int(b.model(torch.tensor([b.encode(r)])).logits[0, -1].argmax())


def test_left_padded_batch_matches_one_at_a_time(backend: TransformersBackend) -> None:
    reqs = greedy()
    lengths = {len(backend.encode(r)) for r in reqs}
    assert len(lengths) == len(reqs)  # really different lengths, so padding is exercised
    batched = backend.generate(reqs)
    alone = [backend.generate([r])[0] for r in reqs]
    assert [c.text for c in batched] == [c.text for c in alone]
    assert [c.completion_tokens for c in batched] == [c.completion_tokens for c in alone]
    assert all(c.ok and c.text for c in batched)


def test_finished_rows_leave_the_batch_and_the_others_write_the_same(backend: TransformersBackend) -> None:
    """Rows that end (end of turn or their own max_tokens) are dropped from the running batch and its KV
    cache; what every row writes is what it writes alone."""
    reqs = [GenerationRequest.chat(s, u, max_tokens=m) for (s, u), m in zip(PROMPTS, (3, 12, 0, 7), strict=True)]
    widths: list[int] = []
    undo = before_each_forward(backend, lambda input_ids: widths.append(input_ids.shape[0]))
    try:
        batched = backend.generate(reqs)
    finally:
        undo()
    alone = [backend.generate([r])[0] for r in reqs]
    assert [c.text for c in batched] == [c.text for c in alone]
    assert [c.completion_tokens for c in batched] == [c.completion_tokens for c in alone]
    assert batched[2].text == "" and batched[2].completion_tokens <= 1
    assert widths[0] == 4 and widths[1] == 3 and widths[-1] == 1  # the 0-token row goes first, then the 3
    assert widths == sorted(widths, reverse=True) and len(widths) <= 12


def test_a_stopped_row_leaves_the_batch_at_the_next_step_and_the_others_write_the_same(
        backend: TransformersBackend) -> None:
    """issue #42: a request nobody waits for (``stop`` set mid-decode, as the service does when its client
    goes away) ends at the next step with the STOPPED error; the rows beside it are untouched."""
    stop = threading.Event()
    reqs = [replace(r, stop=stop) if k == 1 else r for k, r in enumerate(greedy(max_tokens=12))]
    widths: list[int] = []

    def step(input_ids: torch.Tensor) -> None:
        widths.append(input_ids.shape[0])
        if len(widths) == 3:
            stop.set()

    undo = before_each_forward(backend, step)
    try:
        batched = backend.generate(reqs)
    finally:
        undo()
    assert batched[1].error == STOPPED and batched[1].text == "" and not batched[1].ok
    others = [r for k, r in enumerate(reqs) if k != 1]
    alone = [backend.generate([r])[0] for r in others]
    assert [c.text for k, c in enumerate(batched) if k != 1] == [c.text for c in alone]
    assert len(reqs) in widths[:3] and widths[3] < widths[2]  # it left at the step after the stop
    assert backend.generate([replace(reqs[0], stop=stop)])[0].error == STOPPED  # stopped before: not run


def test_token_counts(backend: TransformersBackend) -> None:
    reqs = greedy(max_tokens=6)
    out = backend.generate(reqs)
    for r, c in zip(reqs, out, strict=True):
        msgs = r.openai_messages()
        prompt = backend.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        assert prompt.endswith("<|im_start|>assistant\n")
        assert c.prompt_tokens == len(backend.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert 1 <= c.completion_tokens <= 6
        assert c.latency_s > 0 and c.extra["batch_size"] == len(reqs)


def test_stops_at_eos_and_counts_it(model_dir: Path, forward: str) -> None:
    b = TransformersBackend(str(model_dir), fused_forward=FORWARDS[forward])
    r = GenerationRequest.chat(None, "hi", max_tokens=10)
    free = b.generate([r])[0]
    b.eos_ids = {first_greedy_token(b, r)}  # make the model's first choice the end of turn
    [stopped] = b.generate([r])
    assert free.completion_tokens == 10 and free.text
    assert stopped.ok and stopped.text == "" and stopped.completion_tokens == 1


def test_seeded_sampling_is_reproducible_and_batch_independent(backend: TransformersBackend) -> None:
    def sample(seed: int) -> GenerationRequest:
        return GenerationRequest.chat(None, "hi", max_tokens=12, temperature=1.5, seed=seed)

    a, a_again, b = backend.generate([sample(1), sample(1), sample(2)])
    [a_alone] = backend.generate([sample(1)])
    mixed = backend.generate([*greedy(), sample(1)])[-1]  # other rows in the batch must not matter
    assert a.text == a_again.text == a_alone.text == mixed.text
    assert a.text != b.text


def test_tiny_top_p_is_greedy(backend: TransformersBackend) -> None:
    nucleus = [
        GenerationRequest.chat(s, u, max_tokens=8, temperature=1.0, top_p=1e-6, seed=3) for s, u in PROMPTS
    ]
    assert [c.text for c in backend.generate(nucleus)] == [c.text for c in backend.generate(greedy(8))]


def test_max_batch_size_chunks_give_same_results(
    model_dir: Path, forward: str, backend: TransformersBackend
) -> None:
    small = TransformersBackend(str(model_dir), max_batch_size=3, fused_forward=FORWARDS[forward])
    out = small.generate(greedy(5))
    assert [c.extra["batch_size"] for c in out] == [3, 3, 3, 1]
    assert [c.text for c in out] == [c.text for c in backend.generate(greedy(5))]


def test_failed_batch_returns_errors_not_exceptions(model_dir: Path, forward: str) -> None:
    b = TransformersBackend(str(model_dir), fused_forward=FORWARDS[forward])

    def broken(_input_ids: torch.Tensor) -> None:
        raise RuntimeError("out of memory")

    before_each_forward(b, broken)
    out = b.generate(greedy(3))
    assert len(out) == 4 and all(c.error == "RuntimeError: out of memory" for c in out)


def test_packed_linear_computes_what_the_dense_layer_computes() -> None:
    torch.manual_seed(0)
    for bias in (True, False):
        dense = torch.nn.Linear(24, 40, bias=bias)
        x = torch.randn(3, 5, 24)  # [batch, tokens, features], as a decoder layer sees it
        packed = PackedLinear(dense)
        with torch.no_grad():
            assert torch.allclose(packed(x), dense(x), atol=1e-5)
        assert packed(x).shape == (3, 5, 40)
        assert not list(packed.parameters())  # inference only: nothing an optimizer could train


def test_packed_backend_is_the_cpu_default_and_writes_what_the_dense_one_writes(
    model_dir: Path, forward: str, backend: TransformersBackend
) -> None:
    dense = TransformersBackend(str(model_dir), packed_weights=False, fused_forward=FORWARDS[forward])
    assert backend.packed_linear_layers > 0 and dense.packed_linear_layers == 0
    if forward == "fused":  # the fused forward packs its own fused projections: 4 a layer + the output head
        assert backend.packed_linear_layers == 4 * backend.model.config.num_hidden_layers + 1
    else:
        assert not any(isinstance(m, torch.nn.Linear) for m in backend.model.modules())
        assert any(isinstance(m, torch.nn.Linear) for m in dense.model.modules())
    sampled = [GenerationRequest.chat(None, "hi", max_tokens=12, temperature=1.0, seed=s) for s in (1, 2)]
    for reqs in (greedy(12), sampled):
        assert [c.text for c in backend.generate(reqs)] == [c.text for c in dense.generate(reqs)]


def test_bad_arguments_are_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
    with pytest.raises(BackendError, match="dtype='float64'"):
        TransformersBackend(str(model_dir), dtype="float64")
    with pytest.raises(BackendError, match="packed_weights=true needs an fp32 model"):
        TransformersBackend(str(model_dir), dtype="bfloat16", packed_weights=True)
    monkeypatch.setenv("LEMON_CACHE_DIR", str(tmp_path))
    with pytest.raises(BackendError, match="lemon models pull smollm2-135m-instruct"):
        TransformersBackend("smollm2-135m-instruct")
    with pytest.raises(BackendError, match="cannot load model"):
        TransformersBackend(str(tmp_path))  # exists but holds no model


def test_vllm_backend_without_vllm_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process vLLM backend is exercised for real by .ci/vllm_cpu_check.sh; here only its guard."""
    import sys

    from lemon_core.backends.vllm_backend import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(BackendError, match=r"vllm is not installed; pip install 'lemon\[gpu\]'"):
        VLLMBackend("smollm2-135m-instruct")
