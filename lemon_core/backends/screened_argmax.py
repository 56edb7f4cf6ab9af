"""The greedy pick of each row without fp32 logits over the whole vocabulary: a bf16 screen, then exact rescoring.

Why: at batch 32 the output head was the second-largest product of a decoding step (Qwen2.5-Coder-0.5B fp32,
2-core AVX-512 machine: ~50 ms of a ~205 ms step for [32, 896] x [896, 151936], then ~3 ms for ``max(-1)`` over
the logits), yet a greedy row needs only the index of its largest logit. The same product in bf16 (oneDNN,
weights packed once) takes ~25 ms, and a rounding bound says which tokens it can have ranked wrongly, so only
those few are scored again in fp32 (measured on that model over 40 decoding steps of 32 chat prompts: 3.6
candidates a row on average, 14 at most; the head and pick went from 50.3 to 27.1 ms, the same picks).

Why the pick is exact. Let ``s_v = sum_i h_i b_vi`` be token v's fp32 logit (``b`` the head's rows with the final
RMSNorm's weight folded in) and ``o_v`` the bf16 screen's output. Rounding ``h`` and ``b`` to bf16 moves each
product by at most ``(2u + u^2) |h_i| |b_vi|`` (u = 2^-8, bf16's unit roundoff), oneDNN's fp32 accumulation adds
at most ``H * 2^-24`` of ``sum |h_i| |b_vi|``, and the bf16 output at most ``u |o_v|``; with Cauchy-Schwarz
(``sum |h_i| |b_vi| <= |h| |b_v|``) all of it is under ``slack = k |h| max_v |b_v|`` for the constant ``k`` below.
So the true argmax v* has ``o_v* >= s_v* - slack >= s_w - slack >= o_w - 2 slack`` for every w: every token whose
screen is within ``2 slack`` of the row's best screen is a candidate, and v* is among them. The candidates are
scored as ``(h * g) . w_v`` in fp32 from the model's own dense head weights, and the first largest wins, as
``max(-1).indices`` picks. The exact scores differ from the fp32 product's by summation order only (~1e-6), as the
fused forward's logits already differ from transformers' (``fused_decoder.py``).

Used only where every row of the batch decodes greedily with no grammar (the CPU pool's agents: ``temperature``
0 by default); sampled rows need the whole distribution and get the fp32 logits. By default only on CPUs with bf16
instructions (``bf16_products_native``), where it was measured.
"""

from __future__ import annotations

import torch

from lemon_core.backends.packed_linear import PACK_FOR_ROWS

BF16_UNIT_ROUNDOFF = 2.0**-8


def screen_slack_factor(hidden: int) -> float:
    """``k`` with ``|o_v - s_v| <= k |h| |b_v|`` (module docstring): rounding of both factors, fp32 accumulation over
    ``hidden`` terms, rounding of the output; generous in the second-order terms."""
    u = BF16_UNIT_ROUNDOFF
    return (2 * u + u * u) + hidden * 2.0**-23 + u * (1 + u) ** 3


def bf16_products_run() -> bool:
    """oneDNN computes bf16 products on this CPU, natively or emulated (AVX-512): the screen works here."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_products_native() -> bool:
    """The CPU has bf16 dot-product instructions (AVX512-BF16 or AMX), where the screen was measured faster than
    the fp32 head; elsewhere the backend leaves it off unless asked."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private in torch 2.13: absent means no
    return bf16_products_run() and any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


class ScreenedArgmax:
    """``argmax_v (h * norm) . weight[v]`` for each row of ``h`` (fp32, CPU), screened in bf16.

    ``weight`` ``[vocab, hidden]``: the output head's dense fp32 weight, kept by reference (for a tied head it is
    the embedding, already in memory); ``norm`` ``[hidden]``: the final RMSNorm's weight. Holds one bf16 copy of
    ``weight * norm`` packed for oneDNN (half the fp32 head's memory)."""

    def __init__(self, weight: torch.Tensor, norm: torch.Tensor) -> None:
        self.weight = weight.detach()
        self.norm = norm.detach().float()
        self.vocab, hidden = self.weight.shape
        screen, largest_row = torch.empty((self.vocab, hidden), dtype=torch.bfloat16), 0.0
        for start in range(0, self.vocab, 8192):  # folded in slices: no fp32 copy of the whole head at once
            folded = self.weight[start : start + 8192].float() * self.norm
            screen[start : start + 8192] = folded
            largest_row = max(largest_row, float(folded.norm(dim=1).max()))
        self.screen = torch.ops.mkldnn._reorder_linear_weight(screen, PACK_FOR_ROWS)
        self.slack_per_unit = screen_slack_factor(hidden) * largest_row
        # the screen's row maxima are taken over blocks of ``chunk`` tokens first, so only blocks that can hold a
        # candidate are read again (a power of two dividing the vocabulary; 1 at worst, still exact)
        self.chunk = next(c for c in (128, 64, 32, 16, 8, 4, 2, 1) if self.vocab % c == 0)

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """The picked token ids ``[rows]`` for hidden states ``h`` ``[rows, hidden]`` (after the final norm's scaling
        by 1/rms, before its weight)."""
        rows = h.shape[0]
        screen = torch.ops.mkldnn._linear_pointwise(h.bfloat16(), self.screen, None, "none", [], "").float()
        blocks = screen.view(rows, self.vocab // self.chunk, self.chunk)
        block_best = blocks.amax(-1)
        threshold = block_best.amax(-1) - 2 * self.slack_per_unit * h.norm(dim=-1)
        row_of, block_of = (block_best >= threshold[:, None]).nonzero(as_tuple=True)
        entry, within = (blocks[row_of, block_of] >= threshold[row_of, None]).nonzero(as_tuple=True)
        row_of, token_of = row_of[entry], block_of[entry] * self.chunk + within
        exact = ((h[row_of] * self.norm) * self.weight[token_of].float()).sum(-1)
        best = torch.full((rows,), float("-inf"), dtype=exact.dtype).scatter_reduce(0, row_of, exact, "amax")
        won = exact == best[row_of]
        picks = torch.full((rows,), self.vocab, dtype=torch.long).scatter_reduce(
            0, row_of[won], token_of[won], "amin"
        )
        unpicked = picks == self.vocab  # no candidate: a non-finite hidden state; fp32 logits decide as before
        if bool(unpicked.any()):
            logits = (h[unpicked] * self.norm) @ self.weight.float().T
            picks[unpicked] = logits.max(-1).indices
        return picks
