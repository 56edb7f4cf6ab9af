"""Peak memory of completion log-probs at a 152k vocabulary: full log_softmax vs chunked (lemon_core/logprobs.py).

Each way runs in a fresh subprocess on the CPU with a tiny-width Qwen2 (hidden 16, one layer) whose
vocabulary is Qwen2.5's 151,936 tokens, so the [B, T, V] logits dominate memory as they do on a GPU. The
peak is the growth of the process's maximum resident set (ru_maxrss) across the computation alone
(model and inputs are built before the first reading). Ways:

- ``old``: the model's full logits, then a float32 log_softmax over [B, T, V] and a gather (what
  ``grpo.sequence_logprobs`` did before issue #12);
- ``logits``: ``sequence_logprobs(mode="logits")``: the model's logits, log-probs gathered per block;
- ``hidden``: ``sequence_logprobs(mode="hidden")``: decoder hidden states, LM head applied per block.

Each is measured without gradients (the old-log-prob and reference passes) and with a backward pass
(the loss). Results are compared with ``old`` (max |difference| must be <= 1e-5). Last line:
ratio=<hidden peak / old peak>, the larger of the no-grad and backward ratios (issue #12 target <= 0.25).

    OMP_NUM_THREADS=1 python bench/logprobs.py [--batch 4] [--tokens 128] [--chunk 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

VOCAB = 151_936  # Qwen2.5's vocabulary (config.json of Qwen/Qwen2.5-7B-Instruct)
WAYS = ("old", "logits", "hidden")


def build_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


def old_sequence_logprobs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
    """The pre-#12 computation: full logits, float32 log_softmax over the vocabulary, gather."""
    n = ids.shape[1] - start
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, logits_to_keep=n + 1).logits
    logits = logits[:, -(n + 1) : -1, :].float() / 1.0
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, start:].unsqueeze(-1)).squeeze(-1)


def worker(way: str, grad: bool, batch: int, tokens: int, chunk: int, out: Path) -> None:
    """Build, read the peak RSS, compute one way, read it again; write (MiB grown, log-probs) to out."""
    from lemon_core.logprobs import sequence_logprobs

    torch.set_num_threads(1)
    model = build_model()
    gen = torch.Generator().manual_seed(1)
    start = 8
    ids = torch.randint(3, VOCAB, (batch, start + tokens), generator=gen)
    mask = torch.ones_like(ids)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.set_grad_enabled(grad):
        if way == "old":
            lp = old_sequence_logprobs(model, ids, mask, start)
        else:
            lp = sequence_logprobs(model, ids, mask, start, mode=way, chunk_tokens=chunk)
        if grad:
            lp.sum().backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.save({"peak_mib": (after - before) / 1024, "logprobs": lp.detach()}, out)


def measure(way: str, grad: bool, args: argparse.Namespace, tmp: Path) -> dict:
    out = tmp / f"{way}-{int(grad)}.pt"
    cmd = [sys.executable, __file__, "--worker", way, "--batch", str(args.batch), "--tokens", str(args.tokens),
           "--chunk", str(args.chunk), "--out", str(out)] + (["--grad"] if grad else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env)
    return torch.load(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4, help="completions")
    ap.add_argument("--tokens", type=int, default=128, help="completion tokens per row")
    ap.add_argument("--chunk", type=int, default=64, help="chunk_tokens of the chunked ways")
    ap.add_argument("--worker", choices=WAYS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--grad", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.grad, args.batch, args.tokens, args.chunk, args.out)

    full_mib = args.batch * args.tokens * VOCAB * 4 / 2**20
    print(f"V={VOCAB} B={args.batch} T={args.tokens} chunk={args.chunk}: one float32 [B,T,V] = {full_mib:.0f} MiB")
    rows, ratios = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for grad in (False, True):
            for way in WAYS:
                rows[(way, grad)] = measure(way, grad, args, Path(tmp))
            ref = rows[("old", grad)]
            for way in WAYS:
                r = rows[(way, grad)]
                diff = (r["logprobs"] - ref["logprobs"]).abs().max().item()
                ratio = r["peak_mib"] / ref["peak_mib"]
                if way == "hidden":
                    ratios.append(ratio)
                print(json.dumps({"way": way, "grad": grad, "peak_mib": round(r["peak_mib"], 1),
                                  "ratio_to_old": round(ratio, 3), "max_abs_diff": diff}), flush=True)
                if diff > 1e-5:
                    raise SystemExit(f"{way} (grad={grad}) differs from the full log_softmax by {diff:.2e} > 1e-5")
    print(f"ratio={max(ratios):.3f}")


if __name__ == "__main__":
    main()
