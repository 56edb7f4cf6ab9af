"""OpenAI-compatible HTTP backend: `vllm serve`, llama.cpp's server, OpenAI itself, anything speaking
``POST {base_url}/chat/completions``.

A batch becomes concurrent requests (bounded by ``max_concurrency``, which protects the server's KV
cache and rate limits). The asyncio loop lives in a private background thread, so ``generate`` is a
plain blocking call that works the same from a script, a worker thread, or code that is itself
running inside an event loop (FastAPI) - where ``asyncio.run`` would fail.

A reply's ``usage`` is bookkeeping, not the answer: a missing, negative or non-numeric token count
(some OpenAI-compatible servers send strings or nulls) counts as 0 and is noted in
``Completion.extra["usage_problem"]``, instead of failing the whole micro-batch.

Retries: 429, 5xx and connection failures are retried with exponential backoff and jitter, honouring
``Retry-After``. Read timeouts are not retried: a request that outlived ``timeout_s`` once will most
likely do so again, and retrying would multiply the wait of the whole DAG level.

A request whose ``stop`` is set (its client went away) is not sent, and one in flight is abandoned
within ``STOP_POLL_S``: the connection is dropped, which vLLM takes as the end of that request.
Error messages name the server without any ``user:password@`` of ``base_url``, since they reach logs.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
import random
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import httpx

from lemon_core.backends.base import STOPPED, UNAVAILABLE, BackendError, Completion, GenerationRequest
from lemon_core.redact import redact

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
STOP_POLL_S = 0.1  # how often a request in flight checks whether it is still wanted


class OpenAIBackend:
    """Chat completions over HTTP. ``base_url`` includes the API prefix, e.g. ``http://vllm:8000/v1``."""

    greedy_uses_seed = False  # a greedy answer is the same for every seed (CapacityPool.greedy_uses_seed)

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        max_concurrency: int = 8,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BackendError(f"base_url={base_url!r} must start with http:// or https:// (e.g. http://vllm:8000/v1)")
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise BackendError(
                f"need max_concurrency >= 1, max_retries >= 0, timeout_s > 0; got {max_concurrency}, "
                f"{max_retries}, {timeout_s}"
            )
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.shown_url = redact(self.url)  # what error messages name
        self.model = model
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise BackendError(
                    f"api_key_env={api_key_env!r}: environment variable {api_key_env} is not set"
                )
            self.headers["Authorization"] = f"Bearer {key}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lemon-openai-http", daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    # --- public -------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if not requests:
            return []
        return self._run(self._generate_all(list(requests)))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._client is not None:
            self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            **self.extra_body,
            "model": self.model,
            "messages": request.openai_messages(),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.grammar is not None:  # vLLM >= 0.1x: `structured_outputs` (guided_* are ignored there)
            body["structured_outputs"] = request.grammar.structured_outputs
        return body

    # --- internals ----------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop.is_closed():
            coro.close()
            raise BackendError("OpenAIBackend is closed; create a new one")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _generate_all(self, requests: list[GenerationRequest]) -> list[Completion]:
        if self._client is None:  # created inside the loop thread it will be used from
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(max_connections=self.max_concurrency),
            )
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: GenerationRequest) -> Completion:
        assert self._client is not None and self._semaphore is not None
        t0 = time.perf_counter()
        async with self._semaphore:
            for attempt in range(self.max_retries + 1):
                last = attempt == self.max_retries
                if request.stopped:
                    return _failed(STOPPED, t0)
                try:
                    resp = await self._post_unless_stopped(request)
                except httpx.TimeoutException as e:
                    if isinstance(e, httpx.ConnectTimeout) and not last:
                        await asyncio.sleep(self._backoff(attempt))
                        continue
                    why = f"request to {self.shown_url} timed out after {self.timeout_s} s ({type(e).__name__})"
                    return _failed(UNAVAILABLE + why, t0)
                except httpx.TransportError as e:  # refused, DNS, reset: the server is not there
                    if not last:
                        await asyncio.sleep(self._backoff(attempt))
                        continue
                    return _failed(
                        f"{UNAVAILABLE}cannot reach {redact(self.base_url)} (is the server running? "
                        f"check base_url): {type(e).__name__}: {redact(str(e))}", t0,
                    )
                if resp is None:
                    return _failed(STOPPED, t0)
                if resp.status_code in RETRY_STATUS and not last:
                    await asyncio.sleep(self._backoff(attempt, resp.headers.get("retry-after")))
                    continue
                return _parse(resp, t0, attempts=attempt + 1)
        raise AssertionError("unreachable: the last attempt always returns")

    async def _post_unless_stopped(self, request: GenerationRequest) -> httpx.Response | None:
        """The server's response, or None once ``request.stop`` is set (the call in flight is dropped)."""
        assert self._client is not None
        post = asyncio.ensure_future(self._client.post(self.url, json=self.payload(request), headers=self.headers))
        while not post.done():
            await asyncio.wait((post,), timeout=STOP_POLL_S if request.stop is not None else None)
            if not post.done() and request.stopped:
                post.cancel()
                await asyncio.wait((post,))
                return None
        return post.result()

    def _backoff(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait: the server's Retry-After when given, else base * 2^attempt with +-50% jitter."""
        hinted = _retry_after_s(retry_after)
        if hinted is not None:
            return min(hinted, self.max_backoff_s)
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random())


def _retry_after_s(value: str | None) -> float | None:
    """Retry-After is either delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _failed(message: str, t0: float) -> Completion:
    return Completion("", latency_s=time.perf_counter() - t0, error=message)


def _parse(resp: httpx.Response, t0: float, attempts: int) -> Completion:
    latency = time.perf_counter() - t0
    if resp.status_code != 200:
        hint = " (does base_url end with the API prefix, e.g. /v1?)" if resp.status_code == 404 else ""
        why = f"HTTP {resp.status_code} from {redact(str(resp.request.url))}{hint}: {resp.text[:300]}"
        return Completion("", latency_s=latency, error=why)
    try:
        data = resp.json()
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        why = f"malformed chat completion response ({e!r}): {resp.text[:300]}"
        return Completion("", latency_s=latency, error=why)
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt_tokens, bad_prompt = _token_count(usage.get("prompt_tokens"))
    completion_tokens, bad_completion = _token_count(usage.get("completion_tokens"))
    extra: dict[str, Any] = {"finish_reason": choice.get("finish_reason"), "attempts": attempts, "id": data.get("id")}
    problems = [f"{name}={value!r}" for name, value, bad in (
        ("prompt_tokens", usage.get("prompt_tokens"), bad_prompt),
        ("completion_tokens", usage.get("completion_tokens"), bad_completion)) if bad]
    if problems:
        extra["usage_problem"] = f"unusable usage from the server ({', '.join(problems)}); counted as 0"
    return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      latency_s=latency, extra=extra)


def _token_count(value: Any) -> tuple[int, bool]:
    """(count, whether the value was unusable). None means "not reported" (0, fine); an integral number or
    numeric string is taken; anything else (text, negative, NaN, bool, a list) is 0 and flagged."""
    if value is None:
        return 0, False
    if isinstance(value, bool):
        return 0, True
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0, True
    if not math.isfinite(number) or number < 0 or number != int(number):
        return 0, True
    return int(number), False
