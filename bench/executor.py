"""Benchmark: batched level-parallel execution vs one spec at a time, same specs, same backend.

Runs N MultiArith tasks, each with a 3-agent chain spec (solver -> verifier -> verifier), on the
in-process transformers backend with a small real model (SmolLM2-135M-Instruct by default; pull it
with `lemon models pull`). Prints agent calls/s for both ways and, as the last line, ``ratio=<x>``
(batched calls/s divided by sequential calls/s). Both runs use greedy decoding and the same
max_tokens, so they do the same work.

    python bench/executor.py            # 32 specs, 64 tokens per call
"""

from __future__ import annotations

import argparse
import time

import torch

from lemon_core.baselines import chain
from lemon_core.benchmarks import get as get_benchmark
from lemon_core.executor import execute_specs
from lemon_core.pool import CapacityLevel, CapacityPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="number of specs (tasks) executed together")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model alias, path or HF id")
    ap.add_argument("--max-tokens", type=int, default=64, help="completion tokens per agent call")
    ap.add_argument("--repeats", type=int, default=2, help="alternating rounds; the best of each is kept")
    args = ap.parse_args()

    level = CapacityLevel(name="small", backend="transformers", model=args.model, price_in_per_1m=0.0,
                          price_out_per_1m=0.0, max_tokens=args.max_tokens,
                          options={"max_batch_size": args.n})
    pool = CapacityPool(levels=[level])
    examples = get_benchmark("multiarith").load("test", limit=args.n)
    specs = [chain("small", length=3)] * args.n
    pool.backend("small").generate([])  # load the model before timing

    # Alternate the two ways and keep each one's best round, so a burst of load from another
    # process on a shared machine hits both sides alike instead of skewing the ratio.
    batched_s = sequential_s = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        batched = execute_specs(specs, examples, pool)
        batched_s = min(batched_s, time.perf_counter() - start)
        start = time.perf_counter()
        sequential = [execute_specs([s], [e], pool)[0] for s, e in zip(specs, examples, strict=True)]
        sequential_s = min(sequential_s, time.perf_counter() - start)
    batched_calls = sum(t.agent_calls for t in batched)
    sequential_calls = sum(t.agent_calls for t in sequential)

    batched_rate = batched_calls / batched_s
    sequential_rate = sequential_calls / sequential_s
    print(f"specs={args.n} agents/spec=3 model={args.model} max_tokens={args.max_tokens} "
          f"torch_threads={torch.get_num_threads()} best of {args.repeats}")
    print(f"batched:    {batched_calls} calls in {batched_s:.1f} s = {batched_rate:.2f} calls/s")
    print(f"sequential: {sequential_calls} calls in {sequential_s:.1f} s = {sequential_rate:.2f} calls/s")
    print(f"ratio={batched_rate / sequential_rate:.2f}")


if __name__ == "__main__":
    main()
