"""OpenAIBackend against a loopback server speaking the real /v1/chat/completions wire format.

The server's behaviour is steered by ``key=value`` words in the last user message:
``sleep=0.2`` (hold the request), ``fail=503x2`` (answer the first 2 attempts with 503),
``limit=1x1`` (first attempt: 429 with ``Retry-After: 1``), ``status=400`` (always that status),
``usage=VALUE`` (report ``prompt_tokens`` as the string VALUE, or as a list for ``usage=list``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lemon_core.backends.base import STOPPED, UNAVAILABLE, BackendError, GenerationRequest
from lemon_core.backends.openai_http import OpenAIBackend


class FakeOpenAI(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.attempts: dict[str, list[float]] = defaultdict(list)  # content -> arrival times
        self.headers_seen: list[dict[str, str]] = []
        self.bodies: list[dict] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    server: FakeOpenAI

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def do_POST(self) -> None:
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = body["messages"][-1]["content"]
        opts = dict(w.split("=", 1) for w in content.split() if "=" in w)
        with srv.lock:
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            srv.attempts[content].append(time.monotonic())
            attempt = len(srv.attempts[content])
            srv.headers_seen.append(dict(self.headers))
            srv.bodies.append(body)
        try:
            time.sleep(float(opts.get("sleep", 0)))
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            if "status" in opts:
                return self._send(int(opts["status"]), {"error": {"message": "bad request"}})
            if "fail" in opts:
                code, times = opts["fail"].split("x")
                if attempt <= int(times):
                    return self._send(int(code), {"error": {"message": "overloaded"}})
            if "limit" in opts:
                wait, times = opts["limit"].split("x")
                if attempt <= int(times):
                    return self._send(429, {"error": {"message": "rate limited"}}, {"Retry-After": wait})
            reply = f"echo: {content}"
            usage = {"prompt_tokens": len(content.split()), "completion_tokens": len(reply.split()),
                     "total_tokens": len(content.split()) + len(reply.split())}
            if "usage" in opts:
                usage["prompt_tokens"] = [1] if opts["usage"] == "list" else opts["usage"]
            self._send(200, {
                "id": f"chatcmpl-{attempt}", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                             "finish_reason": "stop", "logprobs": None}],
                "usage": usage,
            })
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def _send(self, code: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass


@pytest.fixture()
def server() -> Iterator[FakeOpenAI]:
    srv = FakeOpenAI()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def backend_for(srv: FakeOpenAI, **kw: object) -> OpenAIBackend:
    kw.setdefault("backoff_s", 0.01)
    return OpenAIBackend(base_url=srv.base_url, model="tiny", **kw)  # type: ignore[arg-type]


def req(text: str, **kw: object) -> GenerationRequest:
    return GenerationRequest.chat("sys", text, **kw)  # type: ignore[arg-type]


def test_batch_order_usage_and_params(server: FakeOpenAI) -> None:
    b = backend_for(server)
    texts = [f"q{i} sleep={0.05 * (5 - i):.2f}" for i in range(5)]  # later ones finish first
    out = b.generate([req(t, max_tokens=7, temperature=0.5, top_p=0.9, seed=i) for i, t in enumerate(texts)])
    b.close()
    assert [c.text for c in out] == [f"echo: {t}" for t in texts]
    assert all(c.ok and c.prompt_tokens == 2 and c.completion_tokens == 3 for c in out)
    assert all(c.latency_s > 0 and c.extra["finish_reason"] == "stop" for c in out)
    body = next(bd for bd in server.bodies if bd["messages"][-1]["content"] == texts[3])
    assert body["model"] == "tiny" and body["max_tokens"] == 7 and body["seed"] == 3
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["messages"][0] == {"role": "system", "content": "sys"}


def test_concurrency_limit_respected(server: FakeOpenAI) -> None:
    b = backend_for(server, max_concurrency=3)
    out = b.generate([req(f"c{i} sleep=0.15") for i in range(9)])
    b.close()
    assert all(c.ok for c in out)
    assert server.max_in_flight == 3  # reached the limit but never exceeded it


def test_retries_on_503_then_succeeds(server: FakeOpenAI) -> None:
    b = backend_for(server, max_retries=3)
    [c] = b.generate([req("r fail=503x2")])
    b.close()
    assert c.ok and c.text == "echo: r fail=503x2" and c.extra["attempts"] == 3
    assert len(server.attempts["r fail=503x2"]) == 3


def test_gives_up_after_max_retries(server: FakeOpenAI) -> None:
    b = backend_for(server, max_retries=1)
    [c] = b.generate([req("g fail=500x5")])
    b.close()
    assert not c.ok and "HTTP 500" in c.error
    assert len(server.attempts["g fail=500x5"]) == 2


def test_429_waits_for_retry_after(server: FakeOpenAI) -> None:
    b = backend_for(server, backoff_s=0.001)
    [c] = b.generate([req("l limit=1x1")])
    b.close()
    assert c.ok
    first, second = server.attempts["l limit=1x1"]
    assert second - first >= 0.95  # the server's hint, not the 1 ms backoff


def test_timeout_gives_error_completion_and_others_survive(server: FakeOpenAI) -> None:
    b = backend_for(server, timeout_s=0.3)
    slow, fast = b.generate([req("s sleep=1.5"), req("f")])
    b.close()
    assert not slow.ok and "timed out" in slow.error and slow.text == ""
    assert fast.ok and fast.text == "echo: f"


def test_a_stopped_request_is_dropped_in_flight_and_not_sent_when_stopped_before(server: FakeOpenAI) -> None:
    # issue #42: the agent work of a request whose client went away must stop, not only its slot
    stop = threading.Event()
    b = backend_for(server, timeout_s=30)
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    slow, fast = b.generate([replace(req("s sleep=3"), stop=stop), req("f")])
    took = time.monotonic() - t0
    again = b.generate([replace(req("never sent"), stop=stop)])[0]
    b.close()
    assert slow.error == STOPPED and fast.ok and fast.text == "echo: f"
    assert took < 1.5, f"the stopped call was waited for {took:.1f} s"
    assert again.error == STOPPED and "never sent" not in server.attempts


def test_errors_never_name_the_credentials_of_base_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = OpenAIBackend(base_url=f"http://user:s3cret@127.0.0.1:{port}/v1", model="m", max_retries=0)
    [c] = b.generate([req("hello")])
    b.close()
    assert c.error is not None and c.error.startswith(UNAVAILABLE)
    assert "s3cret" not in c.error and f"http://***@127.0.0.1:{port}/v1" in c.error


def test_client_error_is_not_retried(server: FakeOpenAI) -> None:
    b = backend_for(server)
    [c] = b.generate([req("x status=400")])
    b.close()
    assert "HTTP 400" in c.error and len(server.attempts["x status=400"]) == 1


def test_wrong_prefix_hints_at_base_url(server: FakeOpenAI) -> None:
    b = OpenAIBackend(base_url=server.base_url.removesuffix("/v1"), model="tiny")
    [c] = b.generate([req("p")])
    b.close()
    assert "HTTP 404" in c.error and "/v1" in c.error


def test_unreachable_server_names_the_url() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = OpenAIBackend(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, backoff_s=0.01)
    [c] = b.generate([req("hello")])
    b.close()
    assert c.error is not None
    assert f"cannot reach http://127.0.0.1:{port}/v1 (is the server running? check base_url)" in c.error


def test_api_key_sent_as_bearer(server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_TEST_KEY", "sk-test-123")
    b = backend_for(server, api_key_env="LEMON_TEST_KEY")
    assert b.generate([req("k")])[0].ok
    b.close()
    assert server.headers_seen[-1]["Authorization"] == "Bearer sk-test-123"


def test_missing_api_key_env_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEMON_NO_SUCH_KEY", raising=False)
    with pytest.raises(BackendError, match="LEMON_NO_SUCH_KEY is not set"):
        OpenAIBackend(base_url="http://127.0.0.1:1/v1", model="m", api_key_env="LEMON_NO_SUCH_KEY")
    with pytest.raises(BackendError, match="base_url"):
        OpenAIBackend(base_url="127.0.0.1:8000/v1", model="m")


def test_works_inside_a_running_event_loop(server: FakeOpenAI) -> None:
    b = backend_for(server)

    async def handler() -> list[str]:  # as a FastAPI endpoint would call it
        return [c.text for c in b.generate([req("a"), req("b")])]

    assert asyncio.run(handler()) == ["echo: a", "echo: b"]
    b.close()
    with pytest.raises(BackendError, match="closed"):
        b.generate([req("after close")])


def test_non_numeric_usage_counts_zero_and_keeps_the_batch(server: FakeOpenAI) -> None:
    b = backend_for(server)
    try:
        out = b.generate([req("usage=lots a"), req("fine b"), req("usage=list c"), req("usage=12 d")])
    finally:
        b.close()
    assert [c.ok for c in out] == [True] * 4  # one bad field no longer fails the whole micro-batch
    assert [c.text for c in out] == ["echo: usage=lots a", "echo: fine b", "echo: usage=list c", "echo: usage=12 d"]
    assert out[0].prompt_tokens == 0 and "prompt_tokens='lots'" in out[0].extra["usage_problem"]
    assert out[0].completion_tokens == 3  # the good field of the same reply is kept
    assert out[1].prompt_tokens == 2 and "usage_problem" not in out[1].extra
    assert out[2].prompt_tokens == 0 and "usage_problem" in out[2].extra
    assert out[3].prompt_tokens == 12 and "usage_problem" not in out[3].extra  # a numeric string is a count
