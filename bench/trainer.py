"""GRPO update throughput: lemon's loss step vs TRL's GRPOTrainer loss step, same tiny model and batch.

Both sides get the same batch (prompts, sampled completions, old and reference logprobs, one
advantage per completion) and do: policy forward -> per-token logprobs -> clipped surrogate + k3 KL
-> backward -> AdamW step. TRL's step is ``GRPOTrainer.compute_loss`` (loss_type "bnpo", i.e. token
aggregation like lemon's default) on a trainer built around the same model. Reference logprobs are
precomputed for both (TRL computes them outside its loss step too). Prints completion tokens/s of
each, lemon's full ``grpo_update`` (which also runs the reference forward) for context, and last
``ratio=<lemon tokens/s / TRL tokens/s>``. Needs ``pip install trl==1.16.0``; without it, says why.

    python bench/trainer.py [--batch 16] [--tokens 64] [--reps 5]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_models import build_tiny_chat_model  # noqa: E402

from lemon_core.config import GRPOConfig  # noqa: E402
from lemon_core.grpo import grpo_loss  # noqa: E402
from lemon_core.policy import OrchestratorPolicy, pack  # noqa: E402
from lemon_core.pool import load_pool  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        policy = OrchestratorPolicy.load(
            str(build_tiny_chat_model(Path(tmp) / "m", seed=0)), include_roles=False
        )
        pool = load_pool("simulated")
        prompts = [policy.prompt_ids(f"What is {i} + {i + 3}?", pool) for i in range(args.batch // 4)]
        samples = [s for g in policy.sample(prompts, 4, max_new_tokens=args.tokens, seed=0) for s in g]
        p_ids, c_ids = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
        ref_model = copy.deepcopy(policy.model).eval()
        with torch.no_grad():
            ref_lp, mask = policy.logprob_tensor(p_ids, c_ids, model=ref_model)
        old_lp = ref_lp.clone()
        adv = torch.randn(len(samples))
        n_tokens = float(mask.sum())
        cfg = GRPOConfig(kl_coef=0.04)

        def lemon_step(opt: torch.optim.Optimizer) -> None:
            lp, m = policy.logprob_tensor(p_ids, c_ids)
            loss, _ = grpo_loss(lp, old_lp, ref_lp, adv, m, cfg)
            loss.backward()
            opt.step()
            opt.zero_grad()

        opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-6)
        lemon_step(opt)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.reps):
            lemon_step(opt)
        lemon_tps = n_tokens * args.reps / (time.perf_counter() - t0)
        print(
            f"lemon loss step: {lemon_tps:,.0f} completion tokens/s "
            f"(batch={len(samples)}, tokens={n_tokens:.0f})"
        )

        try:
            import trl
            from datasets import Dataset
            from trl import GRPOConfig as TRLConfig
            from trl import GRPOTrainer
        except ImportError as e:
            print(f"TRL not available ({e}); install trl==1.16.0 to compare")
            print("ratio=nan")
            return
        ids, attn, start = pack(p_ids, c_ids, policy.pad_id)
        inputs = {
            "prompt_ids": ids[:, :start],
            "prompt_mask": attn[:, :start],
            "completion_ids": ids[:, start:],
            "completion_mask": attn[:, start:],
            "advantages": adv,
            "old_per_token_logps": old_lp,
            "ref_per_token_logps": ref_lp,
            "num_items_in_batch": torch.tensor(n_tokens),
        }
        trl_args = TRLConfig(
            output_dir=str(Path(tmp) / "trl"),
            per_device_train_batch_size=len(samples),
            num_generations=4,
            beta=0.04,
            loss_type="bnpo",
            use_cpu=True,
            report_to=[],
            max_completion_length=args.tokens,
            learning_rate=1e-6,
            logging_steps=1000,
        )
        trainer = GRPOTrainer(
            model=policy.model,
            reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
            args=trl_args,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * 8}),
            processing_class=policy.tokenizer,
        )
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); one step here
        opt = torch.optim.AdamW(trainer.model.parameters(), lr=1e-6)

        def trl_step() -> None:
            loss = trainer.compute_loss(trainer.model, inputs)
            loss.backward()
            opt.step()
            opt.zero_grad()

        trl_step()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            trl_step()
        trl_tps = n_tokens * args.reps / (time.perf_counter() - t0)
        print(f"TRL {trl.__version__} GRPOTrainer loss step: {trl_tps:,.0f} completion tokens/s")
        with torch.no_grad():
            lp, m = policy.logprob_tensor(p_ids, c_ids)
            ours, _ = grpo_loss(lp, old_lp, ref_lp, adv, m, cfg)
            theirs = trainer.compute_loss(trainer.model, inputs)
        print(f"same batch, same weights: lemon loss={ours.item():.6f} TRL loss={theirs.item():.6f}")
        print(f"ratio={lemon_tps / trl_tps:.3f}")


if __name__ == "__main__":
    main()
