"""The inference service through FastAPI's TestClient.

The orchestrator and the capacity levels are TEST DOUBLES (lemon_core/serve/doubles.py): scripted
spec texts and echo agents, so each test controls exactly what the models say. One test uses a real
tiny transformers model (random weights) as the orchestrator: its gibberish is a genuine invalid spec.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from lemon_core.backends.base import Completion
from lemon_core.backends.openai_http import OpenAIBackend
from lemon_core.benchmarks import get
from lemon_core.pool import CapacityLevel, CapacityPool
from lemon_core.serve import ServeSettings, create_app, load_settings
from lemon_core.serve.doubles import EchoAgent, ScriptedOrchestrator, two_agent_spec

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = two_agent_spec()


def make_pool(agents: dict[str, EchoAgent]) -> CapacityPool:
    levels = [
        CapacityLevel(name="small", backend="simulated", model="double-small", price_in_per_1m=1.0,
                      price_out_per_1m=2.0, max_tokens=100),
        CapacityLevel(name="large", backend="simulated", model="double-large", price_in_per_1m=10.0,
                      price_out_per_1m=20.0, max_tokens=200),
    ]
    pool = CapacityPool(levels=levels, description="test double pool")
    for name, agent in agents.items():
        pool.set_backend(name, agent)
    return pool


class Harness:
    """A started app over test doubles; ``client`` is a TestClient inside its lifespan."""

    def __init__(self, tmp_path: Path, script: Any = (SPEC,), orchestrator: Any = None,
                 agents: dict[str, EchoAgent] | None = None, raise_server_exceptions: bool = True,
                 **overrides: Any) -> None:
        self.token_file = tmp_path / "tokens"
        self.token_file.write_text(f"# comment\n{TOKEN}\n\nsecond-token-abcdefghijklmnop\n")
        self.agents = agents or {"small": EchoAgent("small"), "large": EchoAgent("large")}
        self.orchestrator = orchestrator or ScriptedOrchestrator(script)
        self.settings = ServeSettings(auth_token_file=str(self.token_file), **overrides)
        self.app = create_app(self.settings, pool=make_pool(self.agents),
                              orchestrator_backend=self.orchestrator)
        self.service = self.app.state.service
        self.client = TestClient(self.app, raise_server_exceptions=raise_server_exceptions)

    def __enter__(self) -> Harness:
        self.client.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.__exit__(*exc)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        return self.client.post(path, json=body, headers=AUTH if headers is None else headers)

    def metrics(self) -> dict[str, float]:
        text = self.client.get("/metrics").text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                                if s.labels else "")
                out[key] = s.value
        return out


def assert_error(resp: Any, status: int, kind: str, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["type"] == kind
    if param is not None:
        assert err["param"] == param
    assert "Traceback" not in resp.text
    return err


# --- auth -----------------------------------------------------------------------------------------
def test_auth_missing_wrong_and_ok(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        task = {"task": "What is 40 + 2?"}
        missing = h.post("/v1/orchestrate", task, headers={})
        assert_error(missing, 401, "authentication_error")
        assert missing.headers["www-authenticate"] == "Bearer"
        assert_error(h.post("/v1/orchestrate", task, headers={"Authorization": "Bearer nope"}), 401,
                     "authentication_error")
        assert_error(h.post("/v1/orchestrate", task, headers={"Authorization": f"Basic {TOKEN}"}), 401,
                     "authentication_error")
        assert_error(h.post("/v1/orchestrate", task, headers={"Authorization": f"Bearer {TOKEN}x"}), 401,
                     "authentication_error")
        assert h.post("/v1/orchestrate", task).status_code == 200
        other = {"Authorization": "Bearer second-token-abcdefghijklmnop"}
        assert h.post("/v1/orchestrate", task, headers=other).status_code == 200
        assert h.client.get("/v1/models").status_code == 401
        # probes and metrics stay open for the kubelet and Prometheus
        assert h.client.get("/healthz").status_code == 200
        assert h.client.get("/metrics").status_code == 200
        assert sum(len(c) for c in h.orchestrator.calls) == 2  # refused requests never reached a model


def test_token_file_is_reread_when_rotated(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        assert h.post("/v1/orchestrate", {"task": "t"}).status_code == 200
        h.token_file.write_text("rotated-token-abcdefghijklmnop\n")
        later = time.time_ns() + 10**9
        os.utime(h.token_file, ns=(later, later))
        assert h.post("/v1/orchestrate", {"task": "t"}).status_code == 401
        rotated = {"Authorization": "Bearer rotated-token-abcdefghijklmnop"}
        assert h.post("/v1/orchestrate", {"task": "t"}, headers=rotated).status_code == 200


def test_auth_must_be_configured_or_explicitly_disabled(tmp_path: Path) -> None:
    pool = make_pool({"small": EchoAgent("small"), "large": EchoAgent("large")})
    with pytest.raises(ValueError, match="--auth-token-file"):
        create_app(ServeSettings(), pool=pool, orchestrator_backend=ScriptedOrchestrator([SPEC]))
    empty = tmp_path / "empty"
    empty.write_text("\n# only a comment\n")
    with pytest.raises(ValueError, match="no tokens"):
        create_app(ServeSettings(auth_token_file=str(empty)), pool=pool,
                   orchestrator_backend=ScriptedOrchestrator([SPEC]))
    app = create_app(ServeSettings(allow_unauthenticated=True), pool=pool,
                     orchestrator_backend=ScriptedOrchestrator([SPEC]))
    with TestClient(app) as client:
        assert client.post("/v1/orchestrate", json={"task": "t"}).status_code == 200


def test_unauthenticated_request_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    # issue #11: bodies were buffered before auth (800 such connections x 64 KB pinned ~57 MB)
    h = Harness(tmp_path)
    reads: list[int] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:  # a client that sends headers, then its body very slowly
        reads.append(1)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    def scope(auth: bytes | None) -> dict[str, Any]:
        headers = [(b"host", b"test"), (b"content-type", b"application/json"), (b"content-length", b"60000")]
        return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                "scheme": "http", "path": "/v1/orchestrate", "raw_path": b"/v1/orchestrate", "root_path": "",
                "query_string": b"", "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80),
                "headers": headers + ([(b"authorization", auth)] if auth else [])}

    for auth in (None, b"Bearer wrong-token", b"Basic " + TOKEN.encode()):
        sent.clear()
        asyncio.run(asyncio.wait_for(h.app(scope(auth), receive, send), timeout=5))
        assert reads == [], "the body was read before the token was checked"
        assert sent[0]["status"] == 401
        assert (b"connection", b"close") in sent[0]["headers"]
    # with the right token the app does read the body (here: it waits for it)
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(h.app(scope(f"Bearer {TOKEN}".encode()), receive, send), timeout=0.5))
    assert reads == [1]


def test_non_ascii_token_authenticates(tmp_path: Path) -> None:
    from lemon_core.serve.auth import TokenAuth

    token = "clé-ñandú-Ωmega-0123456789"
    with Harness(tmp_path) as h:
        h.token_file.write_text(f"{token}\n{TOKEN}\n", encoding="utf-8")
        later = time.time_ns() + 10**9
        os.utime(h.token_file, ns=(later, later))
        utf8 = {"Authorization": b"Bearer " + token.encode("utf-8")}
        assert h.client.post("/v1/orchestrate", json={"task": "t"}, headers=utf8).status_code == 200
        assert h.post("/v1/orchestrate", {"task": "t"}).status_code == 200  # ASCII tokens still work
        wrong = {"Authorization": b"Bearer " + token.replace("Ω", "O").encode("utf-8")}
        assert_error(h.client.post("/v1/orchestrate", json={"task": "t"}, headers=wrong), 401,
                     "authentication_error")
        auth = TokenAuth(h.token_file)
        # Starlette's str view of a header is Latin-1: the same bytes, so the same answer
        assert auth.check(("Bearer " + token).encode("utf-8").decode("latin-1"))
        assert not auth.check("Bearer " + token)  # a str that never was wire bytes (not Latin-1)


def test_docs_are_off_by_default_and_need_no_cdn(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        assert h.client.get("/docs", headers=AUTH).status_code == 404
        assert h.client.get("/redoc", headers=AUTH).status_code == 404
        assert h.client.get("/openapi.json", headers=AUTH).json()["info"]["title"] == "lemon"
        assert h.client.get("/openapi.json").status_code == 401
    with Harness(tmp_path, enable_docs=True) as h:
        page = h.client.get("/docs")
        assert page.status_code == 200 and "swagger" in page.text.lower()
        assert h.client.get("/openapi.json").status_code == 200  # the page fetches it without a token


# --- orchestrate ----------------------------------------------------------------------------------
def test_a_json_trained_orchestrator_is_prompted_for_json_and_its_spec_runs(tmp_path: Path) -> None:
    from lemon_core.spec import render_spec_json
    from lemon_core.spec_text import parse_spec

    json_spec = render_spec_json(parse_spec(SPEC).spec)
    with Harness(tmp_path, script=(json_spec,), spec_format="json") as h:
        resp = h.post("/v1/orchestrate", {"task": "What is 40 + 2?", "benchmark": "gsm8k"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["answer"] == "[large] The answer is 42."
        prompt = h.orchestrator.calls[0][0].messages[-1][1]
        assert "JSON object" in prompt and "```yaml" not in prompt


def test_orchestrate_returns_the_spec_picture_on_request(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        plain = h.post("/v1/orchestrate", {"task": "What is 40 + 2?"}).json()
        assert plain["picture_svg"] is None
        body = h.post("/v1/orchestrate", {"task": "What is 40 + 2?", "picture": True}).json()
        assert body["picture_error"] is None and body["answer"], "pictures need no system program"
        svg = body["picture_svg"]
        assert svg.startswith("<svg") and "Arithmetic solver" in svg and "Answer checker" in svg


def test_orchestrate_returns_spec_trace_and_answer(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        resp = h.post("/v1/orchestrate", {"task": "What is 40 + 2?", "benchmark": "gsm8k"})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["answer"] == "[large] The answer is 42."
        assert body["spec"]["attempts"] == 1
        assert body["spec"]["yaml"].startswith("agents:")
        assert [a["id"] for a in body["spec"]["parsed"]["agents"]] == ["solve", "check"]
        assert body["spec"]["parsed"]["output"] == "check"
        agents = body["trace"]["agents"]
        assert [(a["id"], a["capacity"], a["role"]) for a in agents] == [
            ("solve", "small", "Arithmetic solver"), ("check", "large", "Answer checker")]
        assert agents[0]["output"] == "[small] The answer is 42."
        # cost at the pool's prices: small 10*1 + 20*2, large 10*10 + 20*20 (per 1M tokens)
        assert body["trace"]["cost"] == pytest.approx((10 + 40 + 100 + 400) / 1e6)
        assert body["trace"]["total_tokens"] == 2 * (10 + 20)
        # the verifier read the solver's output and, as an output agent with a parent, got the benchmark's
        # placeholder-free team format (not "The answer is N", which such an agent copies)
        final_prompt = h.agents["large"].requests[0].messages[-1][1]
        assert "[small] The answer is 42." in final_prompt
        assert get("gsm8k").team_answer_format in final_prompt and "The answer is N" not in final_prompt
        # the orchestrator saw the lemon prompt with the task and the pool's levels, greedy, seed 0
        req = h.orchestrator.calls[0][0]
        assert "What is 40 + 2?" in req.messages[-1][1] and "small" in req.messages[-1][1]
        assert (req.temperature, req.seed) == (0.0, 0)


def test_answer_format_and_benchmark_validation(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        ok = h.post("/v1/orchestrate", {"task": "t", "answer_format": "Answer in French."})
        assert ok.status_code == 200
        assert "Answer in French." in h.agents["large"].requests[-1].messages[-1][1]
        err = assert_error(h.post("/v1/orchestrate", {"task": "t", "benchmark": "nope"}), 422,
                           "invalid_request", "benchmark")
        assert "gsm8k" in err["message"]
        assert_error(h.post("/v1/orchestrate", {"task": "t", "benchmark": "gsm8k", "answer_format": "x"}),
                     422, "invalid_request", "benchmark")
        assert_error(h.post("/v1/orchestrate", {"task": "t", "colour": "red"}), 422, "invalid_request",
                     "colour")


def test_answer_format_length_is_limited(tmp_path: Path) -> None:
    with Harness(tmp_path, max_answer_format_chars=40) as h:
        assert h.post("/v1/orchestrate", {"task": "t", "answer_format": "f" * 40}).status_code == 200
        err = assert_error(h.post("/v1/orchestrate", {"task": "t", "answer_format": "f" * 41}), 422,
                           "invalid_request", "answer_format")
        assert "41 characters" in err["message"] and "40" in err["message"]
        chat = {"model": "lemon", "messages": [{"role": "user", "content": "t"}], "answer_format": "f" * 41}
        assert_error(h.post("/v1/chat/completions", chat), 422, "invalid_request", "answer_format")
        assert len(h.orchestrator.calls) == 1  # only the request within the limit reached the model


def test_invalid_spec_is_resampled_once_with_another_seed(tmp_path: Path) -> None:
    with Harness(tmp_path, script=["I think we should just answer 42.", SPEC]) as h:
        resp = h.post("/v1/orchestrate", {"task": "What is 40 + 2?"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["spec"]["attempts"] == 2
        first, second = h.orchestrator.calls[0][0], h.orchestrator.calls[1][0]
        assert (first.seed, first.temperature) == (0, 0.0)
        assert (second.seed, second.temperature) == (1, h.settings.resample_temperature)
        assert h.metrics()["lemon_spec_invalid_total"] == 1


def test_invalid_spec_twice_is_a_clear_502(tmp_path: Path) -> None:
    bad = ("```yaml\nagents:\n  - id: a1\n    role: x\n    base_role: solver\n    duty: d\n"
           "    capacity: huge\noutput: a1\n```")
    with Harness(tmp_path, script=[bad]) as h:
        err = assert_error(h.post("/v1/orchestrate", {"task": "t"}), 502, "invalid_spec")
        assert "invalid spec twice" in err["message"] and "huge" in err["message"]
        assert sum(len(c) for c in h.orchestrator.calls) == 2  # exactly one re-sample
        assert h.agents["small"].requests == []  # nothing executed
        assert h.metrics()["lemon_spec_invalid_total"] == 2


def test_budget_is_enforced_on_the_spec(tmp_path: Path) -> None:
    with Harness(tmp_path, max_agents=4, max_tokens=1000) as h:
        err = assert_error(h.post("/v1/orchestrate", {"task": "t", "budget": {"max_tokens": 250}}), 502,
                           "invalid_spec")
        assert "up to 300 completion tokens" in err["message"] and "max_tokens=250" in err["message"]
        assert h.post("/v1/orchestrate", {"task": "t", "budget": {"max_agents": 2, "max_tokens": 300}}
                      ).status_code == 200
        err = assert_error(h.post("/v1/orchestrate", {"task": "t", "budget": {"max_agents": 5}}), 422,
                           "invalid_request", "budget.max_agents")
        assert "at most 4" in err["message"]
        assert_error(h.post("/v1/orchestrate", {"task": "t", "budget": {"max_tokens": 0}}), 422,
                     "invalid_request", "budget.max_tokens")
        assert h.agents["small"].requests and len(h.agents["small"].requests) == 1  # only the run in budget
    # a server whose orchestrator may write one-agent teams lets clients ask for one; the spec is checked
    with Harness(tmp_path, min_budget_agents=1) as h:
        err = assert_error(h.post("/v1/orchestrate", {"task": "t", "budget": {"max_agents": 1}}), 502,
                           "invalid_spec")
        assert "at most 1" in err["message"]


def test_budget_no_spec_can_meet_is_422_before_any_model_runs(tmp_path: Path) -> None:
    # issue #11: max_tokens=1 / max_agents=1 were re-sampled twice and ended as 502
    with Harness(tmp_path) as h:
        err = assert_error(h.post("/v1/orchestrate", {"task": "t", "budget": {"max_agents": 1}}), 422,
                           "invalid_request", "budget.max_agents")
        assert "at least 2" in err["message"]
        # floor: 2 agents at the cheapest level's max_tokens (small: 100)
        err = assert_error(h.post("/v1/orchestrate", {"task": "t", "budget": {"max_tokens": 1}}), 422,
                           "invalid_request", "budget.max_tokens")
        assert "at least 200" in err["message"]
        chat = {"model": "lemon", "messages": [{"role": "user", "content": "t"}]}
        assert_error(h.post("/v1/chat/completions", {**chat, "max_tokens": 16}), 422, "invalid_request",
                     "max_tokens")
        assert_error(h.post("/v1/chat/completions", {**chat, "max_completion_tokens": 16}), 422,
                     "invalid_request", "max_completion_tokens")
        assert h.orchestrator.calls == []  # refused up front: no sample, no re-sample
        assert h.post("/v1/orchestrate", {"task": "t", "budget": {"max_agents": 2, "max_tokens": 300}}
                      ).status_code == 200


# --- limits ---------------------------------------------------------------------------------------
def test_body_size_limit_413(tmp_path: Path) -> None:
    with Harness(tmp_path, max_body_bytes=2048, max_task_chars=100_000) as h:
        big = {"task": "x" * 3000}
        assert_error(h.post("/v1/orchestrate", big), 413, "request_too_large")

        def chunks() -> Any:  # no Content-Length: the limit must count streamed bytes
            for _ in range(5):
                yield b"x" * 1000

        headers = {**AUTH, "content-type": "application/json"}
        resp = h.client.post("/v1/orchestrate", content=chunks(), headers=headers)
        assert_error(resp, 413, "request_too_large")
        assert h.orchestrator.calls == []
        assert h.post("/v1/orchestrate", {"task": "x" * 1000}).status_code == 200


def test_task_length_and_shape_422_names_the_field(tmp_path: Path) -> None:
    with Harness(tmp_path, max_task_chars=50) as h:
        err = assert_error(h.post("/v1/orchestrate", {"task": "y" * 51}), 422, "invalid_request", "task")
        assert "51 characters" in err["message"] and "50" in err["message"]
        assert_error(h.post("/v1/orchestrate", {}), 422, "invalid_request", "task")
        assert_error(h.post("/v1/orchestrate", {"task": "   "}), 422, "invalid_request", "task")
        bad_json = h.client.post("/v1/orchestrate", content=b"{not json", headers={**AUTH,
                                 "content-type": "application/json"})
        assert bad_json.status_code == 422 and "error" in bad_json.json()
        assert h.orchestrator.calls == []


def test_concurrency_limit_429_with_retry_after(tmp_path: Path) -> None:
    gate = threading.Event()
    agents = {"small": EchoAgent("small", gate=gate), "large": EchoAgent("large")}
    with Harness(tmp_path, agents=agents, max_concurrent_requests=2, retry_after_s=3, batch_wait_ms=0) as h:
        results: list[int] = []
        workers = [threading.Thread(target=lambda: results.append(h.post("/v1/orchestrate", {"task": "t"})
                                                                  .status_code)) for _ in range(2)]
        for w in workers:
            w.start()
        deadline = time.time() + 10
        while h.service.limiter.active < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert h.service.limiter.active == 2
        busy = h.post("/v1/orchestrate", {"task": "t"})
        err = assert_error(busy, 429, "rate_limit_exceeded")
        assert busy.headers["retry-after"] == "3" and "2 requests" in err["message"]
        assert h.metrics()["lemon_requests_in_flight"] == 2
        gate.set()
        for w in workers:
            w.join(timeout=10)
        assert results == [200, 200]
        assert h.post("/v1/orchestrate", {"task": "t"}).status_code == 200  # capacity is back
        assert h.metrics()["lemon_requests_in_flight"] == 0


def test_concurrent_requests_are_batched(tmp_path: Path) -> None:
    with Harness(tmp_path, batch_wait_ms=300, batch_max_size=8) as h:
        codes: list[int] = []
        workers = [threading.Thread(target=lambda i=i: codes.append(
            h.post("/v1/orchestrate", {"task": f"task {i}"}).status_code)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=20)
        assert codes == [200] * 4
        sizes = [len(c) for c in h.orchestrator.calls]
        assert sum(sizes) == 4 and max(sizes) >= 2, sizes  # several users' tasks in one orchestrator call
        assert h.service.batcher.stats.batches < 4


def test_failed_agent_is_502_without_internal_details(tmp_path: Path) -> None:
    agents = {"small": EchoAgent("small", error="cannot reach http://10.0.0.7:8000/v1 (secret)"),
              "large": EchoAgent("large")}
    with Harness(tmp_path, agents=agents) as h:
        resp = h.post("/v1/orchestrate", {"task": "t"})
        err = assert_error(resp, 502, "execution_failed")
        assert "'solve'" in err["message"] and "10.0.0.7" not in resp.text


def test_unexpected_error_is_a_generic_500(tmp_path: Path) -> None:
    class Exploding(ScriptedOrchestrator):
        def generate(self, requests: Any) -> list[Completion]:
            raise RuntimeError("boom at /srv/secret/path")

    with Harness(tmp_path, orchestrator=Exploding([SPEC]), raise_server_exceptions=False) as h:
        resp = h.post("/v1/orchestrate", {"task": "t"})
        err = assert_error(resp, 500, "internal_error")
        assert "boom" not in resp.text and "secret" not in resp.text and "reference" in err["message"]
        assert h.post("/v1/orchestrate", {"task": "t"}).status_code == 500  # the batcher survived


def test_orchestrator_backend_failure_is_503(tmp_path: Path) -> None:
    class Down(ScriptedOrchestrator):
        def generate(self, requests: Any) -> list[Completion]:
            return [Completion("", error="cannot reach http://vllm-orchestrator:8000/v1") for _ in requests]

    with Harness(tmp_path, orchestrator=Down([SPEC])) as h:
        resp = h.post("/v1/orchestrate", {"task": "t"})
        assert_error(resp, 503, "orchestrator_unavailable")
        assert "vllm-orchestrator" not in resp.text
        assert h.metrics().get("lemon_spec_invalid_total", 0) == 0  # unavailable is not invalid


# --- chat completions -----------------------------------------------------------------------------
def test_chat_completions_wire_format(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        body = {"model": "lemon", "temperature": 0.2, "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "earlier answer"},
            {"role": "user", "content": [{"type": "text", "text": "What is 40 + 2?"}]}]}
        resp = h.post("/v1/chat/completions", body)
        assert resp.status_code == 200, resp.text
        data = resp.json()
        assert data["object"] == "chat.completion" and data["model"] == "lemon"
        assert data["id"].startswith("chatcmpl-") and isinstance(data["created"], int)
        choice = data["choices"][0]
        assert choice["index"] == 0 and choice["finish_reason"] == "stop"
        assert choice["message"] == {"role": "assistant", "content": "[large] The answer is 42."}
        assert data["usage"] == {"prompt_tokens": 20, "completion_tokens": 40, "total_tokens": 60}
        assert "What is 40 + 2?" in h.orchestrator.calls[0][0].messages[-1][1]
        assert "first question" not in h.orchestrator.calls[0][0].messages[-1][1]
        assert_error(h.post("/v1/chat/completions", {**body, "model": "gpt-4"}), 404, "model_not_found",
                     "model")
        assert_error(h.post("/v1/chat/completions", {"model": "lemon", "messages": [
            {"role": "system", "content": "hi"}]}), 422, "invalid_request", "messages")
        # max_tokens is the team's completion-token budget (the spec needs up to 300)
        assert_error(h.post("/v1/chat/completions", {**body, "max_tokens": 250}), 502, "invalid_spec")
        models = h.client.get("/v1/models", headers=AUTH).json()
        assert [m["id"] for m in models["data"]] == ["lemon"]


def test_chat_completions_streaming_sse(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        body = {"model": "lemon", "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "What is 40 + 2?"}]}
        with h.client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = [ln for ln in resp.iter_lines() if ln]
        assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == "[large] The answer is 42."
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
        assert chunks[-1]["usage"]["total_tokens"] == 60


# --- probes and metrics ---------------------------------------------------------------------------
class _ModelsHandler(BaseHTTPRequestHandler):
    hits: list[str] = []  # paths of the GETs received (reset by each test)

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.hits.append(self.path)
        ok = self.path == "/v1/models"
        self.send_response(200 if ok else 404)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"object": "list", "data": []}')

    def log_message(self, *args: Any) -> None:
        pass


def test_healthz_and_readyz(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _ModelsHandler.hits = []
    # credentials in the URL: they must never reach a caller of the (unauthenticated) probe
    url = f"http://lemon:pa55word-xyz@127.0.0.1:{server.server_port}/v1"
    live = OpenAIBackend(url, "lemon-orchestrator")
    try:
        with Harness(tmp_path, orchestrator=live) as h:
            assert h.client.get("/healthz").json() == {"status": "ok"}
            ready = h.client.get("/readyz")
            assert ready.status_code == 200, ready.text
            checks = ready.json()["checks"]
            assert set(checks) == {"orchestrator", "level:small", "level:large"}
            assert checks["orchestrator"]["ok"] and "HTTP 200" in checks["orchestrator"]["detail"]
            assert checks["level:small"]["ok"] and checks["level:large"]["ok"]
            assert "pa55word" not in ready.text and "127.0.0.1" not in ready.text and "://" not in ready.text
            # cached: ten more probes within readiness_cache_s do not reach the backend again
            for _ in range(10):
                assert h.client.get("/readyz").status_code == 200
            assert _ModelsHandler.hits == ["/v1/models"]
            # HEAD works for probes that use it (was 405)
            assert h.client.head("/healthz").status_code == 200
            assert h.client.head("/readyz").status_code == 200
        with Harness(tmp_path, orchestrator=live, readiness_cache_s=0) as h:
            for _ in range(3):
                assert h.client.get("/readyz").status_code == 200
            assert len(_ModelsHandler.hits) == 4  # no cache: every probe checks
    finally:
        server.shutdown()
        server.server_close()
    # the same backend once its server is gone: not ready, still no URL
    dead = OpenAIBackend(url, "lemon-orchestrator")
    with Harness(tmp_path, orchestrator=dead, readiness_timeout_s=1.0) as h:
        resp = h.client.get("/readyz")
        assert resp.status_code == 503
        assert resp.json()["ready"] is False and not resp.json()["checks"]["orchestrator"]["ok"]
        assert "unreachable" in resp.json()["checks"]["orchestrator"]["detail"]
        assert "pa55word" not in resp.text and "127.0.0.1" not in resp.text
        assert h.client.get("/healthz").status_code == 200


def test_probes_answer_head(tmp_path: Path) -> None:
    # issue #11: HEAD /healthz was 405 (uptime checkers and some load balancers probe with HEAD)
    with Harness(tmp_path) as h:
        for path in ("/healthz", "/readyz", "/metrics"):
            resp = h.client.head(path)
            assert resp.status_code == 200, path
            assert resp.content == b""
        assert h.client.head("/v1/models").status_code == 401  # HEAD is no way around auth


def test_trace_agent_errors_do_not_leak_backend_urls(tmp_path: Path) -> None:
    from lemon_core.spec import AgentSpec, OrchestrationSpec, render_spec

    # 'check' (the output) fails with a backend URL carrying credentials in its error: whatever the service
    # answers, neither the password nor the host leaves the process
    spec = OrchestrationSpec(agents=[
        AgentSpec(id="solve", role="Solver", base_role="solver", duty="Solve it.", capacity="small"),
        AgentSpec(id="check", role="Checker", base_role="verifier", duty="Check it.", capacity="large",
                  depends_on=["solve"]),
    ], output="check")
    agents = {"small": EchoAgent("small"),
              "large": EchoAgent("large", error="cannot reach http://svc:hunter2@10.0.0.7:8000/v1 (refused)")}
    with Harness(tmp_path, script=[f"```yaml\n{render_spec(spec)}```"], agents=agents) as h:
        resp = h.post("/v1/orchestrate", {"task": "t"})
        assert resp.status_code in (200, 502), resp.text
        assert "hunter2" not in resp.text and "10.0.0.7" not in resp.text
        if resp.status_code == 200:
            assert resp.json()["trace"]["agents"][1]["error"] == "cannot reach <url> (refused)"


def test_metrics_exposition(tmp_path: Path) -> None:
    with Harness(tmp_path, script=["no spec here", SPEC]) as h:
        for _ in range(3):
            assert h.post("/v1/orchestrate", {"task": "What is 40 + 2?"}).status_code == 200
        resp = h.client.get("/metrics")
        assert resp.headers["content-type"].startswith("text/plain")
        m = h.metrics()
        assert m["lemon_request_latency_seconds_count"] == 3
        assert m["lemon_request_latency_seconds_sum"] > 0
        assert m["lemon_requests_in_flight"] == 0
        assert m["lemon_spec_invalid_total"] == 1
        assert m["lemon_agent_calls_total{capacity=small}"] == 3
        assert m["lemon_agent_calls_total{capacity=large}"] == 3
        assert m["lemon_tokens_total{capacity=large,kind=completion}"] == 60
        assert m["lemon_cost_usd_total{capacity=small}"] == pytest.approx(3 * 50 / 1e6)
        assert "process_cpu_seconds_total" in m or "python_info{" in "".join(m)
        # training, rollout and evaluation series are not the service's: no gauges stuck at 0 here
        names = {k.split("{")[0] for k in m}
        assert not [n for n in names if n.startswith(("lemon_train_", "lemon_eval_", "lemon_rollout_",
                                                       "lemon_counterfactual_", "lemon_spec_valid"))]
        assert "# TYPE lemon_train_loss" not in resp.text


# --- settings and CLI -----------------------------------------------------------------------------
def test_settings_precedence_and_unknown_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("max_agents: 3\nport: 9000\npool: simulated\n")
    monkeypatch.setenv("LEMON_PORT", "9100")
    monkeypatch.setenv("LEMON_ORCHESTRATOR_BASE_URL", "http://orch:8000/v1")
    monkeypatch.setenv("LEMON_CACHE_DIR", "/var/cache/lemon")  # another lemon part's variable
    monkeypatch.setenv("LEMON_SOMETHING_NEW", "1")
    s = load_settings(cfg, pool="cpu", host=None)
    assert (s.max_agents, s.port, s.pool, s.host) == (3, 9100, "cpu", "127.0.0.1")
    assert s.orchestrator_base_url == "http://orch:8000/v1"
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_agent: 3\n")
    with pytest.raises(ValueError, match="max_agent"):
        load_settings(bad)
    monkeypatch.setenv("LEMON_MAX_AGENTS", "zero")
    with pytest.raises(ValueError, match="max_agents"):
        load_settings()


def test_serve_command_help_and_bad_input(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from lemon_core.cli_serve import serve_command

    app = typer.Typer()
    app.command("serve")(serve_command)
    app.command("other")(lambda: None)
    runner = CliRunner()
    helptext = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    for flag in ("--host", "--port", "--pool", "--orchestrator", "--auth-token-file", "--config",
                 "--max-concurrent-requests"):
        assert flag in helptext
    missing = runner.invoke(app, ["serve", "--pool", str(tmp_path / "nope.yaml"), "--allow-unauthenticated"])
    assert missing.exit_code == 2 and "not found" in missing.output
    no_auth = runner.invoke(app, ["serve", "--pool", "simulated"])
    assert no_auth.exit_code == 2 and "--auth-token-file" in no_auth.output
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("max_agents: 3\nport: [8080\n")
    bad_yaml = runner.invoke(app, ["serve", "--config", str(malformed), "--allow-unauthenticated"])
    assert bad_yaml.exit_code == 2, bad_yaml.output
    assert bad_yaml.exception is None or isinstance(bad_yaml.exception, SystemExit)  # no traceback
    assert "not valid YAML" in bad_yaml.output and "malformed.yaml" in bad_yaml.output
    assert "line " in bad_yaml.output and len(bad_yaml.output.strip().splitlines()) == 1
    bad_model = runner.invoke(app, ["serve", "--pool", "simulated", "--allow-unauthenticated",
                                    "--orchestrator", str(tmp_path / "no-such-checkpoint")])
    assert bad_model.exit_code == 2 and "cannot load model" in bad_model.output


# --- a real (tiny, random-weight) transformers model as the orchestrator ---------------------------
def test_real_tiny_orchestrator_gibberish_is_502(tmp_path: Path) -> None:
    from tiny_models import build_tiny_chat_model

    from lemon_core.backends.transformers_backend import TransformersBackend

    model_dir = build_tiny_chat_model(tmp_path / "tiny")
    backend = TransformersBackend(str(model_dir))
    with Harness(tmp_path, orchestrator=backend, include_roles=False, include_format=False,
                 orchestrator_max_tokens=24) as h:
        err = assert_error(h.post("/v1/orchestrate", {"task": "What is 40 + 2?"}), 502, "invalid_spec")
        assert "invalid spec twice" in err["message"]
        assert h.metrics()["lemon_spec_invalid_total"] == 2
        assert h.client.get("/readyz").json()["checks"]["orchestrator"]["ok"]
