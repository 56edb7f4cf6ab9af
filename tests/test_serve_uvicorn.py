"""The service on a real uvicorn on 127.0.0.1, called with the official ``openai`` SDK.

Two set-ups: (1) the app in a server thread over TEST DOUBLES (scripted orchestrator, echo agents);
(2) ``lemon serve`` as a subprocess started exactly the way the Helm chart starts it (flags, a pool
file, LEMON_* env with LEMON_ORCHESTRATOR_BASE_URL), whose orchestrator and capacity levels are a
loopback FAKE OpenAI server (a test double speaking the real wire protocol).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI

from lemon_core.pool import CapacityLevel, CapacityPool
from lemon_core.serve import ServeSettings, create_app
from lemon_core.serve.doubles import EchoAgent, ScriptedOrchestrator, two_agent_spec

TOKEN = "uvicorn-test-token-0123456789"


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Run ``app`` on uvicorn in a thread on a free loopback port; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def serve_like_lemon_serve(app: Any) -> Iterator[tuple[str, Any]]:
    """Run ``app`` in a thread on the server ``lemon serve`` uses (read timeouts, draining shutdown)."""
    from lemon_core.cli_serve import DrainingServer, server_config

    settings = app.state.service.settings
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = DrainingServer(server_config(app, settings), app, settings.shutdown_grace_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    server.lemon_thread = thread
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def doubles_app(tmp_path: Path, gate: threading.Event | None = None, **overrides: Any) -> Any:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    pool = CapacityPool(levels=[
        CapacityLevel(name="small", backend="simulated", model="double-small", price_in_per_1m=1,
                      price_out_per_1m=2),
        CapacityLevel(name="large", backend="simulated", model="double-large", price_in_per_1m=5,
                      price_out_per_1m=9),
    ])
    pool.set_backend("small", EchoAgent("small", gate=gate))
    pool.set_backend("large", EchoAgent("large"))
    settings = ServeSettings(auth_token_file=str(tokens), **overrides)
    return create_app(settings, pool=pool, orchestrator_backend=ScriptedOrchestrator([two_agent_spec()]))


def test_openai_sdk_against_uvicorn(tmp_path: Path) -> None:
    with serve_in_thread(doubles_app(tmp_path, max_task_chars=20)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=30)
        reply = client.chat.completions.create(model="lemon", messages=[
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "What is 40 + 2?"}])
        assert reply.object == "chat.completion" and reply.model == "lemon"
        assert reply.choices[0].message.content == "[large] The answer is 42."
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage is not None and reply.usage.total_tokens == 60
        assert [m.id for m in client.models.list()] == ["lemon"]

        stream = client.chat.completions.create(
            model="lemon", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "What is 40 + 2?"}])
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "[large] The answer is 42."
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 60

        bad = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="bearer token"):
            bad.chat.completions.create(model="lemon", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.UnprocessableEntityError, match="at most 20 allowed"):
            client.chat.completions.create(model="lemon", messages=[{"role": "user", "content": "x" * 21}])

        assert httpx.get(f"{url}/readyz").status_code == 200
        # only the two admitted requests were timed (auth, model and length errors are refused earlier)
        assert "lemon_request_latency_seconds_count 2.0" in httpx.get(f"{url}/metrics").text


def test_openai_sdk_sees_429_with_retry_after(tmp_path: Path) -> None:
    gate = threading.Event()
    app = doubles_app(tmp_path, gate=gate, max_concurrent_requests=1, retry_after_s=2, batch_wait_ms=0)
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=30)
        first: list[str | None] = []
        worker = threading.Thread(target=lambda: first.append(client.chat.completions.create(
            model="lemon", messages=[{"role": "user", "content": "slow one"}]).choices[0].message.content))
        worker.start()
        service = app.state.service
        deadline = time.time() + 10
        while service.limiter.active < 1 and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="lemon", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.response.headers["retry-after"] == "2"
        gate.set()
        worker.join(timeout=10)
        assert first == ["[large] The answer is 42."]


def _task_texts(app: Any) -> list[str]:
    calls = app.state.service.orchestrator.backend.calls
    return [req.messages[-1][1].split("Task:\n", 1)[1].split("\n")[0] for batch in calls for req in batch]


def test_a_client_that_gives_up_frees_its_slot_and_is_not_run(tmp_path: Path) -> None:
    # issue #11: two clients that gave up after 4 s held both slots for ~77 s while others got 429
    gate = threading.Event()
    app = doubles_app(tmp_path, gate=gate, max_concurrent_requests=2, batch_wait_ms=0)
    service = app.state.service
    body = {"model": "lemon", "messages": [{"role": "user", "content": ""}]}
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def chat(task: str, timeout: float) -> int:
        msg = {**body, "messages": [{"role": "user", "content": task}]}
        return httpx.post(f"{url}/v1/chat/completions", json=msg, headers=auth, timeout=timeout).status_code

    with serve_in_thread(app) as url:
        codes: list[int] = []
        first = threading.Thread(target=lambda: codes.append(chat("task-first", 30)))
        first.start()  # its batch waits at the gate, holding the worker
        deadline = time.time() + 10
        while not gate_waiters(app) and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(httpx.ReadTimeout):
            chat("task-gone", 0.5)  # queued behind the first, then the client gives up
        deadline = time.time() + 5
        while service.limiter.active > 1 and time.time() < deadline:
            time.sleep(0.02)
        assert service.limiter.active == 1, "the abandoned request still holds its slot"
        second = threading.Thread(target=lambda: codes.append(chat("task-second", 30)))
        second.start()
        deadline = time.time() + 5
        while service.limiter.active < 2 and time.time() < deadline:
            time.sleep(0.02)
        gate.set()
        first.join(timeout=20)
        second.join(timeout=20)
        assert codes == [200, 200]  # the second was admitted, not refused with 429
        assert _task_texts(app) == ["task-first", "task-second"]  # the abandoned one never ran


class Records(logging.Handler):
    """Every record of the loggers it is attached to (uvicorn's do not reach pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def captured_logs(*names: str) -> Iterator[Records]:
    handler = Records()
    loggers = [logging.getLogger(n) for n in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def test_a_client_that_leaves_mid_batch_stops_its_work_without_a_traceback(tmp_path: Path) -> None:
    # issue #42: after work.cancel() the task was not cancelled yet, so work.result() raised
    # InvalidStateError: a 500 and "Exception in ASGI application"; the slot came back 5-6 s later
    gate = threading.Event()  # the agent call would never finish on its own
    app = doubles_app(tmp_path, gate=gate, max_concurrent_requests=1, batch_wait_ms=0)
    service = app.state.service
    small = service.pool.backend("small")
    try:
        with captured_logs("uvicorn.error", "lemon") as logs, serve_in_thread(app) as url:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/v1/orchestrate", json={"task": "t"}, timeout=1.0,
                           headers={"Authorization": f"Bearer {TOKEN}"})
            left = time.monotonic()
            while (service.limiter.active or service.batcher.running) and time.monotonic() - left < 5:
                time.sleep(0.01)
            freed = time.monotonic() - left
            assert service.limiter.active == 0 and not service.batcher.running
            assert freed < 1.0, f"the slot and the agent work came back {freed:.1f} s after the client left"
            assert small.stopped == 1  # the agent call ended because nobody waited, not at the gate
            assert httpx.get(f"{url}/healthz").status_code == 200
    finally:
        gate.set()
    bad = [r for r in logs.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


def gate_waiters(app: Any) -> bool:
    """True once the small agent has received a request (so the worker is busy at the gate)."""
    return bool(app.state.service.pool.backend("small").requests)


def test_slow_headers_are_cut_off(tmp_path: Path) -> None:
    app = doubles_app(tmp_path, header_timeout_s=0.5)
    with serve_like_lemon_serve(app) as (url, _), socket.create_connection(
            ("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5) as conn:
        t0 = time.monotonic()
        conn.sendall(b"POST /v1/orchestrate HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        assert conn.recv(1024) == b""  # closed by the server
        assert time.monotonic() - t0 < 3
        assert httpx.get(f"{url}/healthz").status_code == 200  # a prompt client is served


def test_slow_body_gets_408(tmp_path: Path) -> None:
    app = doubles_app(tmp_path, body_timeout_s=0.5)
    with serve_like_lemon_serve(app) as (url, _), socket.create_connection(
            ("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5) as conn:
        t0 = time.monotonic()
        conn.sendall(b"POST /v1/orchestrate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"task\"")
        reply = read_until_closed(conn)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert b"request_timeout" in reply and time.monotonic() - t0 < 3


def read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends before it closes: one ``recv`` may hold the headers without the body."""
    chunks: list[bytes] = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def test_shutdown_drains_within_the_grace_period(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()  # a batch that would never finish on its own
    app = doubles_app(tmp_path, gate=gate, shutdown_grace_s=1.0, batch_wait_ms=0)
    replies: list[httpx.Response] = []
    try:
        with serve_like_lemon_serve(app) as (url, server):
            worker = threading.Thread(target=lambda: replies.append(httpx.post(
                f"{url}/v1/orchestrate", json={"task": "t"}, headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=30)))
            worker.start()
            deadline = time.time() + 10
            while not gate_waiters(app) and time.time() < deadline:
                time.sleep(0.01)
            t0 = time.monotonic()
            server.should_exit = True  # what SIGTERM does
            server.lemon_thread.join(timeout=15)
            took = time.monotonic() - t0
            worker.join(timeout=5)
    finally:
        gate.set()
    assert not server.lemon_thread.is_alive()
    assert 1.0 <= took < 1.0 + 3.0, took  # the grace period, then out (the chart gives 30 s for 25 s)
    assert replies and replies[0].status_code == 503
    assert replies[0].json()["error"]["type"] == "shutting_down"
    assert not [r for r in caplog.records if r.exc_info], "tracebacks were logged during shutdown"


# --- `lemon serve` started like the Helm chart starts it ----------------------------------------------
def fake_openai_server(spec_text: str, stall: threading.Event | None = None) -> FastAPI:
    """TEST DOUBLE of a vLLM OpenAI server: the orchestrator model writes ``spec_text``, others answer 42
    (after ``stall`` is set, when given: a level server that hangs)."""
    fake = FastAPI()
    fake.state.models = []

    @fake.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "lemon-orchestrator", "object": "model"}]}

    @fake.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> dict[str, Any]:
        fake.state.models.append(body["model"])
        if stall is not None and body["model"] != "lemon-orchestrator":
            stall.wait(timeout=60)
        text = spec_text if body["model"] == "lemon-orchestrator" else f"({body['model']}) The answer is 42."
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}

    return fake


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lemon_serve(tmp_path: Path, fake_url: str, large_url: str | None = None,
                      **env: str) -> tuple[subprocess.Popen[str], str]:
    """``lemon serve`` in a subprocess, configured like the chart does, over the fake OpenAI server
    (the ``large`` level at ``large_url`` instead, when given)."""
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "levels:\n"
        f"  - {{name: small, backend: openai, model: qwen-7b, base_url: '{fake_url}/v1', timeout_s: 10,\n"
        "      price_in_per_1m: 0.2, price_out_per_1m: 0.2, max_tokens: 64}\n"
        f"  - {{name: large, backend: openai, model: qwen-32b, base_url: '{large_url or fake_url}/v1', timeout_s: 10,\n"
        "      price_in_per_1m: 0.9, price_out_per_1m: 0.9, max_tokens: 64}\n")
    tokens = tmp_path / "auth" / "tokens"
    tokens.parent.mkdir()
    tokens.write_text(TOKEN + "\n")
    port = free_port()
    full_env = {**os.environ, "LEMON_LOG_LEVEL": "info", "LEMON_CACHE_DIR": str(tmp_path / "cache"),
                "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "LEMON_ORCHESTRATOR_BASE_URL": f"{fake_url}/v1",
                **env}
    cmd = [sys.executable, "-c", "from lemon_core.cli import app; app()", "serve", "--host=127.0.0.1",
           f"--port={port}", f"--pool={pool}", "--orchestrator=lemon-orchestrator", f"--auth-token-file={tokens}"]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("lemon serve did not start: " + proc.communicate()[0])


@pytest.mark.slow
def test_sigterm_with_a_stuck_backend_exits_within_the_grace_period(tmp_path: Path) -> None:
    # issue #11: shutdown after SIGTERM took ~70 s (chart grace: 30 s) and logged tracebacks
    stall = threading.Event()
    fake = fake_openai_server(two_agent_spec(), stall=stall)
    try:
        with serve_in_thread(fake) as fake_url:
            proc, url = start_lemon_serve(tmp_path, fake_url, LEMON_SHUTDOWN_GRACE_S="2")
            replies: list[httpx.Response] = []
            client = threading.Thread(target=lambda: replies.append(httpx.post(
                f"{url}/v1/orchestrate", json={"task": "40+2?"}, headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=60)))
            client.start()
            deadline = time.time() + 20
            while "qwen-7b" not in fake.state.models and time.time() < deadline:
                time.sleep(0.05)
            assert "qwen-7b" in fake.state.models  # the request is stuck in the level's backend
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
            took = time.monotonic() - t0
            client.join(timeout=10)
            stall.set()  # let the fake server's stuck handler end before the fake server stops
    finally:
        stall.set()
    assert took < 2 + 4, f"shutdown took {took:.1f} s with a 2 s grace period"
    assert replies and replies[0].status_code == 503 and replies[0].json()["error"]["type"] == "shutting_down"
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "Traceback" not in out and "Exception in ASGI application" not in out, out
    assert "Application shutdown complete" in out


@pytest.mark.slow
def test_lemon_serve_started_like_the_chart(tmp_path: Path) -> None:
    fake = fake_openai_server(two_agent_spec())
    with serve_in_thread(fake) as fake_url:
        proc, url = start_lemon_serve(tmp_path, fake_url, LEMON_SOME_FUTURE_SETTING="ignored")
        try:
            ready = httpx.get(f"{url}/readyz", timeout=5)
            assert ready.status_code == 200, ready.text
            assert set(ready.json()["checks"]) == {"level:small", "level:large", "orchestrator"}
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=30)
            reply = client.chat.completions.create(
                model="lemon", messages=[{"role": "user", "content": "40+2?"}])
            assert reply.choices[0].message.content == "(qwen-32b) The answer is 42."
            assert reply.usage is not None and reply.usage.total_tokens == 24
            assert fake.state.models == ["lemon-orchestrator", "qwen-7b", "qwen-32b"]
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        # graceful stop on SIGTERM (the kubelet's signal); uvicorn re-raises it after shutting down
        assert proc.returncode in (0, -signal.SIGTERM), out
        assert "Application shutdown complete" in out
        assert "lemon serve ready" in out and "Traceback" not in out


@pytest.mark.slow
def test_no_credential_of_a_base_url_reaches_the_log(tmp_path: Path) -> None:
    # issue #42: with base_url http://user:password@host/v1 every agent call logged
    # "httpx: HTTP Request: POST http://user:password@host/..." at INFO
    password = "pw-" + "7f3a9c"  # not spelled out whole in the source, so a match is the server's doing
    fake = fake_openai_server(two_agent_spec())
    with serve_in_thread(fake) as fake_url:
        with_userinfo = fake_url.replace("http://", f"http://lemon:{password}@")
        dead = with_userinfo.rsplit(":", 1)[0] + f":{free_port()}"  # a `large` server that is not there
        proc, url = start_lemon_serve(tmp_path, with_userinfo, large_url=dead, LEMON_LOG_LEVEL="debug",
                                      LEMON_ORCHESTRATOR_BASE_URL=f"{with_userinfo}/v1")
        try:
            assert httpx.get(f"{url}/readyz", timeout=10).status_code == 503  # `large` is down
            reply = httpx.post(f"{url}/v1/orchestrate", json={"task": "40+2?"}, timeout=60,
                               headers={"Authorization": f"Bearer {TOKEN}"})
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    assert fake.state.models[:2] == ["lemon-orchestrator", "qwen-7b"]  # the calls really went out with it
    assert reply.status_code == 503 and reply.json()["error"]["type"] == "backend_unavailable", reply.text
    assert reply.headers["retry-after"] == "1" and "127.0.0.1" not in reply.text
    assert "HTTP Request: POST http://***@127.0.0.1" in out  # httpx's own line, at INFO
    assert "cannot reach http://***@127.0.0.1" in out  # lemon's warning about the failed agent
    assert password not in out, [line for line in out.splitlines() if password in line]
    assert "Traceback" not in out
