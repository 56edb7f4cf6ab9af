"""Where a CPU decoding step's time goes, against what its matrix-product kernel can do at all.

Why: ``bench/engines.py`` put lemon's transformers backend at parity with vLLM's CPU build at batch 32 (ratio
0.998 on 2026-12-06), vLLM's decode ~6% faster and lemon's prefill faster. (Since then greedy batches pick their
tokens through a bf16 screen of the output head, ``screened_argmax.py``: ratio 1.072. This script times the fp32
path, ``FusedDecoder.logits`` and ``max(-1)``, whose products it compares with their ceiling.)
docs/gpu_check.md traces the rest of the gap (the products equal in both engines, shape by shape; everything else
~29 ms of a ~205 ms step; what was tried); this script repeats its two central figures on any machine, to say
how much is left to win in the transformers route. It times

1. the packed oneDNN product the backend runs (``PackedLinear``'s op, weights packed as the backend packs them) at
   each projection of the model's fused decoder (qkv, o, gate_up, down, and the output head) and at 1, 32, 128 and
   1024 rows, on the decoder's own packed weights, every layer's called in turn as a step calls them (the same
   weight called again would stay in the cache);
2. the fused decoder's decoding step at batch 32 on ``bench/engines.py``'s prompts (the model's real weights),
   ``--steps`` steps after the prompt pass, the median of ``--rounds`` rounds;

and prints, per row count, a step's products as one figure (each shape weighted by its share of the step's
arithmetic), then the step split into its products (the 32-row times of step 1, summed over the layers) and the rest
(attention over the cache, norms, rotary, the greedy pick, the decoder's Python; not the backend loop's per-row
bookkeeping, ~4 ms a step in docs/gpu_check.md). Products run with their biases, as in the step.
The last line is ``ratio=<a step's products' GFLOP/s at 32 rows / theirs at the best row count>``: how close a
decoding step's products run to what the same products reach with more rows per weight read.

    python bench/decode_ceiling.py                  # Qwen2.5-Coder-0.5B from `lemon models pull`, ~2 min;
                                                    # 8bf59f6 on a 2-core VM, two runs: step 237.9 / 219.7 ms,
                                                    # products 79 / 87% of it, ratio=0.871 / 0.826 (a noisy VM:
                                                    # docs/gpu_check.md has a third run that differed)
    python bench/decode_ceiling.py --model smollm2-135m-instruct

Run it on an idle machine: a second process on the cores skews both parts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engines import PROMPTS  # noqa: E402

from lemon_core.backends.base import BackendError, GenerationRequest  # noqa: E402
from lemon_core.backends.fused_decoder import FusedDecoder  # noqa: E402
from lemon_core.backends.packed_linear import PackedLinear  # noqa: E402
from lemon_core.backends.shared_prefix import shared_prefix_layout, shared_prefix_length  # noqa: E402
from lemon_core.backends.transformers_backend import TransformersBackend  # noqa: E402

ROWS = (1, 32, 128, 1024)
DECODE_ROWS = 32


def seconds_per_pass(fn: Callable[[], object], passes: int = 3) -> float:
    """Median time of ``passes`` calls of ``fn``, after one untimed call (weights paged in, kernels chosen)."""
    fn()
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_projections(decoder: FusedDecoder) -> dict[str, list[PackedLinear]]:
    """The decoder's own packed projections, by kind, in the order a step calls them: each layer's, then the head."""
    projections = {name: [getattr(layer, name) for layer in decoder.layers] for name in ("qkv", "o", "gate_up", "down")}
    return {**projections, "head": [decoder.head]}


def product_times(projections: dict[str, list[PackedLinear]]) -> dict[str, dict[int, float]]:
    """Seconds per product, by projection kind and row count.

    Each kind is timed over every layer's weight called in turn, as a decoding step reads them: one weight called
    again and again would stay in the cache (qkv's is 4 MB) and time a product the step never runs."""
    times: dict[str, dict[int, float]] = {}
    with torch.no_grad():
        for name, layers in projections.items():
            times[name] = {}
            for rows in ROWS:
                x = torch.randn(rows, layers[0].in_features)

                def one_pass(x: torch.Tensor = x, layers: list[PackedLinear] = layers) -> None:
                    for projection in layers:
                        projection(x)

                times[name][rows] = seconds_per_pass(one_pass) / len(layers)
    return times


def decode_step_seconds(backend: TransformersBackend, steps: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean time of a greedy decoding step at batch 32 (the backend's own layout)."""
    decoder = backend.decoder
    prompts = [backend.encode(GenerationRequest.chat(None, p)) for p in PROMPTS[:DECODE_ROWS]]
    prefix = shared_prefix_length(prompts)
    ids, attention = shared_prefix_layout(prompts, prefix, backend.pad_id)

    def one_round() -> float:
        room = decoder.new_room(len(prompts), ids.shape[1] + steps + 1)
        if prefix:
            decoder.prefill_shared(ids[:1, :prefix], room)
        mask, logits = attention, decoder.logits(ids[:, prefix:], attention, room)
        t0 = time.perf_counter()
        for _ in range(steps):
            picks = logits.max(-1).indices.unsqueeze(1)  # the greedy pick from fp32 logits
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype)], 1)
            logits = decoder.logits(picks, mask, room)
        return (time.perf_counter() - t0) / steps

    one_round()  # untimed: first-touch page faults of this batch's activations
    return statistics.median(one_round() for _ in range(rounds))


def step_products(times: dict[str, dict[int, float]], projections: dict[str, list[PackedLinear]], rows: int) -> float:
    """Seconds of one step's products at ``rows`` rows: each kind's time per product times how many a step calls."""
    return sum(len(kind) * times[name][rows] for name, kind in projections.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="a `lemon models` alias or a local path")
    ap.add_argument("--steps", type=int, default=64, help="decoding steps a round (the cache grows by one a step)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --steps; the median is reported")
    args = ap.parse_args()
    if args.steps < 1 or args.rounds < 1:
        ap.error(f"--steps and --rounds must be >= 1 (got {args.steps}, {args.rounds})")

    try:
        backend = TransformersBackend(args.model, max_batch_size=DECODE_ROWS)
    except BackendError as e:
        raise SystemExit(f"--model {args.model}: {e}") from None
    if backend.decoder is None or not backend.packed_linear_layers:
        raise SystemExit(f"{args.model}: the backend runs no fused decoder on packed weights here (fp32 on a CPU "
                         f"with oneDNN, a Llama or Qwen2 model); nothing to measure")
    projections = step_projections(backend.decoder)
    layers = len(backend.decoder.layers)
    shapes = {name: (kind[0].out_features, kind[0].in_features) for name, kind in projections.items()}
    print(f"model={args.model} layers={layers} threads={torch.get_num_threads()} shapes={shapes}", flush=True)

    times = product_times(projections)
    for name, (out_features, in_features) in shapes.items():
        cells = [f"{rows} rows {s * 1e3:7.2f} ms {2 * rows * out_features * in_features / s / 1e9:6.1f} GFLOP/s"
                 for rows, s in times[name].items()]
        print(f"{name:8s} " + " | ".join(cells), flush=True)
    # A step's products as one figure per row count, each shape weighted by its share of the step's arithmetic
    flops_per_row = 2 * sum(p.out_features * p.in_features for kind in projections.values() for p in kind)
    rates = {rows: rows * flops_per_row / step_products(times, projections, rows) / 1e9 for rows in ROWS}
    best_rows = max(rates, key=rates.__getitem__)
    print("a step's products: " + " | ".join(f"{rows} rows {rate:.1f} GFLOP/s" for rows, rate in rates.items()))

    step = decode_step_seconds(backend, args.steps, args.rounds)
    products = step_products(times, projections, DECODE_ROWS)
    print(f"decoding step, batch {DECODE_ROWS}: {step * 1e3:.1f} ms = products {products * 1e3:.1f} ms "
          f"({products / step:.0%}) + the rest {(step - products) * 1e3:.1f} ms ({1 - products / step:.0%}); "
          f"{DECODE_ROWS / step:.1f} tok/s, {DECODE_ROWS / products:.1f} tok/s with nothing but the products")
    print(f"products at {DECODE_ROWS} rows: {rates[DECODE_ROWS]:.1f} GFLOP/s; at their best ({best_rows} rows): "
          f"{rates[best_rows]:.1f} GFLOP/s")
    print(f"ratio={rates[DECODE_ROWS] / rates[best_rows]:.3f}")


if __name__ == "__main__":
    main()
