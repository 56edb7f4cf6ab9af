"""The bf16-screened greedy pick (``backends/screened_argmax.py``) is the fp32 argmax, also where bf16 alone is wrong.

Checked on random heads (vocabularies that are and are not multiples of the screen's block), on a head built so
that bf16 rounding ties two tokens the fp32 logits tell apart, on the bound the candidates rest on, and through
the backend on tiny Llama and Qwen2 models (the same greedy texts as the fp32 logits, with rows leaving the batch)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_chat_model  # tests/ is on sys.path

from lemon_core.backends.base import BackendError, GenerationRequest
from lemon_core.backends.screened_argmax import (
    ScreenedArgmax,
    bf16_products_native,
    bf16_products_run,
    screen_slack_factor,
)
from lemon_core.backends.transformers_backend import TransformersBackend

pytestmark = pytest.mark.skipif(
    not bf16_products_run(), reason="oneDNN has no bf16 products on this CPU (no AVX-512): the screen cannot run here"
)


def _head(vocab: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, hidden, generator=g) * 0.05
    norm = torch.rand(hidden, generator=g) * 2 + 0.2
    return weight, norm


def _unit_rms(h: torch.Tensor) -> torch.Tensor:
    return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("vocab", [4096, 1000, 997])  # blocks of 128, of 8, and of 1 (a prime vocabulary)
def test_picks_equal_the_fp32_argmax(vocab: int) -> None:
    weight, norm = _head(vocab, 96, seed=vocab)
    h = _unit_rms(torch.randn(64, 96, generator=torch.Generator().manual_seed(1)) * 3)
    picks = ScreenedArgmax(weight, norm)(h)
    assert torch.equal(picks, ((h * norm) @ weight.T).max(-1).indices)


def test_a_token_that_bf16_ranks_second_is_picked_when_its_fp32_logit_is_first() -> None:
    hidden = 64
    g = torch.Generator().manual_seed(3)
    h = _unit_rms(torch.randn(1, hidden, generator=g))
    weight = torch.randn(50, hidden, generator=g) * 0.005
    weight[7] += 0.02 * h[0] / h[0].norm()  # ahead of every other token
    # A twin of token 7 whose fp32 logit is larger and whose bf16 screen is smaller: the twin's weights differ by
    # about bf16's resolution of them, so their rounding can reorder the two (the output's rounding cannot: it is
    # monotonic), and the logits are small, so the output's rounding does not tie them.
    for _ in range(5000):
        weight[30] = weight[7] + torch.randn(hidden, generator=g) * 6e-5
        screened = ScreenedArgmax(weight, torch.ones(hidden))
        exact = (h @ weight.T)[0]
        bf16 = torch.ops.mkldnn._linear_pointwise(h.bfloat16(), screened.screen, None, "none", [], "").float()[0]
        if exact[30] > exact[7] and bf16[30] < bf16[7]:
            break
    assert int(exact.argmax()) == 30 and int(bf16.argmax()) == 7
    assert screened(h).tolist() == [30]
    screened.slack_per_unit = 0.0  # without the rounding bound only the screen's own best is a candidate
    assert screened(h).tolist() == [7]


def test_ties_go_to_the_first_token_and_a_non_finite_row_falls_back_to_the_fp32_logits() -> None:
    weight, norm = _head(512, 32, seed=5)
    weight[200] = weight[100]  # an exact tie wherever these two lead
    h = torch.stack([torch.zeros(32), weight[100] * 10, torch.full((32,), float("nan"))])
    picks = ScreenedArgmax(weight, norm)(h / norm)
    assert picks[0] == 0  # every logit 0: the first token, as max(-1).indices picks
    assert picks[1] == 100
    assert picks[2] == ((h[2:] / norm * norm) @ weight.T).max(-1).indices[0]


def test_the_screen_stays_within_the_slack_its_candidates_rest_on() -> None:
    """``|bf16 screen - fp32 logit| <= k |h| |b_v|`` on heavy-tailed data (the bound the docstring derives)."""
    g = torch.Generator().manual_seed(6)
    hidden = 896
    weight = torch.randn(2048, hidden, generator=g) * torch.rand(2048, 1, generator=g) ** 3
    h = torch.randn(16, hidden, generator=g) * torch.rand(16, hidden, generator=g) ** 4 * 20
    screen = ScreenedArgmax(weight, torch.ones(hidden))
    out = torch.ops.mkldnn._linear_pointwise(h.bfloat16(), screen.screen, None, "none", [], "").float()
    exact = (h.double() @ weight.double().T)
    bound = screen_slack_factor(hidden) * h.double().norm(dim=1, keepdim=True) * weight.double().norm(dim=1)
    assert bool(((out.double() - exact).abs() <= bound).all())
    assert float((out.double() - exact).abs().max()) > 0.01 * float(bound.max())  # the screen does round


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch = str(request.param)
    return build_tiny_chat_model(tmp_path_factory.mktemp(arch) / "model", seed=2, arch=arch,
                                 hidden_size=256, num_layers=2, kv_heads=2)


def test_backend_writes_the_same_greedy_texts_with_the_screen(model_dir: Path) -> None:
    screened = TransformersBackend(str(model_dir), screened_argmax=True)
    fp32 = TransformersBackend(str(model_dir), screened_argmax=False)
    assert screened.decoder is not None and screened.decoder.screened_argmax is not None
    assert fp32.decoder is not None and fp32.decoder.screened_argmax is None
    default = TransformersBackend(str(model_dir)).decoder
    assert default is not None and (default.screened_argmax is not None) == bf16_products_native()  # where measured
    requests = [  # different caps, so rows leave the batch at different steps
        GenerationRequest.chat("You are a solver.", f"What is {a} + {b}?", max_tokens=6 + 4 * (a % 4))
        for a, b in [(12, 30), (7, 5), (3, 99), (41, 2), (8, 8)]
    ]
    ours, theirs = screened.generate(requests), fp32.generate(requests)
    assert [c.text for c in ours] == [c.text for c in theirs]
    assert [c.completion_tokens for c in ours] == [c.completion_tokens for c in theirs]
    assert all(c.ok for c in ours) and max(c.completion_tokens for c in ours) > 10


def test_screen_that_cannot_run_is_refused_by_name(model_dir: Path) -> None:
    with pytest.raises(BackendError, match="screened_argmax=true needs the fused forward"):
        TransformersBackend(str(model_dir), fused_forward=False, screened_argmax=True)
    with pytest.raises(BackendError, match=r"screened_argmax=true needs an fp32 model on CPU .*bfloat16"):
        TransformersBackend(str(model_dir), dtype="bfloat16", fused_forward=True, screened_argmax=True)
    assert TransformersBackend(str(model_dir), fused_forward=False).decoder is None  # default: off, no error
