"""The HTTP layer: FastAPI app with /v1/orchestrate, /v1/chat/completions, probes and /metrics.

Every error a client sees has one JSON shape, ``{"error": {"type", "message", "param"?}}`` (OpenAI's,
so SDK clients print the message); nothing else - no stack trace, no backend URL - leaves the
process: details go to the server log, and agent errors in a returned trace have URLs masked.
Startup (the lifespan) builds every backend first, so a pod only accepts traffic once its models are
loaded; /readyz then says per level whether its backend answers (ready / not ready, no URLs), from
checks cached for ``readiness_cache_s`` so probes cannot fan out to every backend on each call.

A request whose client disconnects is cancelled: its slot is freed at once and its job is marked
abandoned, so the batch skips its re-sample and execution.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from lemon_core.backends.base import UNAVAILABLE, Backend
from lemon_core.metrics import SERVICE_PARTS, LemonMetrics, exposition, new_registry
from lemon_core.pool import CapacityPool, load_pool
from lemon_core.redact import redact
from lemon_core.serve.auth import TokenAuth
from lemon_core.serve.batcher import MicroBatcher, ShuttingDown
from lemon_core.serve.limits import AuthGate, BodySizeLimit, ConcurrencyLimiter, error_body
from lemon_core.serve.orchestrator import (
    Job,
    JobResult,
    Orchestrator,
    make_orchestrator_backend,
    run_jobs,
    with_model_prompt,
)
from lemon_core.serve.settings import ServeSettings

log = logging.getLogger("lemon.serve")
PROBE_PATHS = ("/healthz", "/readyz", "/metrics")
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


class ApiError(Exception):
    """An error meant for the client: HTTP status + error type + a message a person can act on."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param, self.headers = status, kind, message, param, headers


# --- request / response bodies --------------------------------------------------------------------
class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_agents: int | None = Field(None, ge=1, description="most agents the spec may use")
    max_tokens: int | None = Field(None, ge=1, description="most completion tokens the team may generate")


class OrchestrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="the task for the team")
    answer_format: str | None = Field(None, description="how the final answer must look (one line)")
    benchmark: str | None = Field(None, description="use this benchmark's answer format (e.g. gsm8k)")
    budget: Budget | None = None
    picture: bool = Field(False, description="also return the spec as an SVG picture (lemon_core/spec_picture.py)")


class AgentOut(BaseModel):
    id: str
    role: str
    capacity: str
    output: str
    prompt_tokens: int
    completion_tokens: int
    cost: float
    latency_s: float
    cached: bool
    error: str | None = None


class TraceOut(BaseModel):
    agents: list[AgentOut]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost: float
    latency_s: float = Field(description="critical-path latency of the team (slowest agent per level)")


class SpecOut(BaseModel):
    yaml: str = Field(description="the spec as the orchestrator wrote it")
    parsed: dict[str, Any]
    attempts: int = Field(description="1, or 2 after a re-sample")
    prompt_tokens: int
    completion_tokens: int


class OrchestrateResponse(BaseModel):
    id: str
    spec: SpecOut
    trace: TraceOut
    answer: str
    seconds: dict[str, float] = Field(description="wall time of the batch stages this request was part of")
    picture_svg: str | None = Field(None, description="the spec as SVG, when the request asked for it")
    picture_error: str | None = Field(None, description="why no picture could be drawn (the answer still stands)")


class ChatMessage(BaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseModel):
    """OpenAI chat completion request; unknown OpenAI parameters (temperature, n, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    answer_format: str | None = None
    benchmark: str | None = None
    budget: Budget | None = None


# --- the service state ----------------------------------------------------------------------------
class Service:
    """Everything the endpoints share; built by ``create_app``, started by the lifespan."""

    def __init__(self, settings: ServeSettings, pool: CapacityPool, orchestrator_backend: Backend | None,
                 registry: Any) -> None:
        self.settings = settings
        self.pool = pool
        self.metrics = LemonMetrics(registry, parts=SERVICE_PARTS)
        self.readiness: tuple[float, dict[str, dict[str, Any]]] | None = None  # (checked at, checks)
        self.readiness_lock = asyncio.Lock()
        self.auth = None if settings.allow_unauthenticated else TokenAuth(settings.auth_token_file or "")
        self.limiter = ConcurrencyLimiter(settings.max_concurrent_requests)
        self._given_backend = orchestrator_backend
        self.orchestrator: Orchestrator | None = None
        self.batcher: MicroBatcher[Job, JobResult] = MicroBatcher(
            self._run_batch, settings.batch_max_size, settings.batch_wait_ms / 1000)

    def _run_batch(self, jobs: Sequence[Job]) -> list[JobResult]:
        assert self.orchestrator is not None
        return run_jobs(self.orchestrator, jobs)

    def load_backends(self) -> None:
        """Build every backend (loads in-process weights; HTTP backends connect lazily). Idempotent."""
        if self.orchestrator is not None:
            return
        for name in self.pool.level_names:
            self.pool.backend(name)
        if self._given_backend is None:
            self.settings = with_model_prompt(self.settings)  # prompted as it was trained
        backend = self._given_backend or make_orchestrator_backend(self.settings, self.pool)
        self.orchestrator = Orchestrator(backend, self.pool, self.settings, self.metrics)

    def backends(self) -> dict[str, Backend]:
        found = {f"level:{n}": self.pool.backend(n) for n in self.pool.level_names}
        if self.orchestrator is not None:
            found["orchestrator"] = self.orchestrator.backend
        return found

    def close(self) -> None:
        shared = [self.pool.backend(n) for n in self.pool.level_names]
        if self.orchestrator is not None and all(self.orchestrator.backend is not b for b in shared):
            self.orchestrator.backend.close()
        self.pool.close()


def create_app(settings: ServeSettings, *, pool: CapacityPool | None = None,
               orchestrator_backend: Backend | None = None, registry: Any = None) -> FastAPI:
    """The service app; ``pool`` / ``orchestrator_backend`` replace what ``settings`` name (tests)."""
    if not settings.allow_unauthenticated and not settings.auth_token_file:
        raise ValueError("no auth configured: pass --auth-token-file FILE (one token per line), or "
                         "--allow-unauthenticated for local development")
    registry = registry if registry is not None else new_registry(process_metrics=True)
    pool = pool if pool is not None else load_pool(settings.pool)
    service = Service(settings, pool, orchestrator_backend, registry)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            await asyncio.to_thread(service.load_backends)
        except Exception as e:
            log.error("lemon serve cannot start: %s", e)
            raise
        service.batcher.start()
        log.info("lemon serve ready: pool levels %s, orchestrator %s", service.pool.level_names,
                 settings.orchestrator_base_url or settings.orchestrator)
        try:
            yield
        finally:
            await service.batcher.stop()
            service.close()

    docs = settings.enable_docs
    app = FastAPI(title="lemon", version="0.1.0", lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url=None, swagger_ui_oauth2_redirect_url="/docs/oauth2-redirect" if docs else None,
                  description="Serve a LEMON orchestrator: task -> multi-agent spec -> executed answer.")
    app.state.service = service
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    public = PROBE_PATHS + (("/openapi.json", "/docs", "/docs/oauth2-redirect") if docs else ())
    # added last = runs first: the token is checked before the body is read
    app.add_middleware(AuthGate, check=service.auth.check if service.auth else None, public=public)
    _install_error_handlers(app)

    @app.get("/healthz", tags=["probes"])
    async def healthz() -> dict[str, str]:
        """The process is alive (liveness/startup probe)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"])
    async def readyz() -> JSONResponse:
        """Ready when every level's backend and the orchestrator's answer (cached a few seconds)."""
        checks = await _readiness(service)
        ready = all(c["ok"] for c in checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["probes"])
    async def metrics() -> Response:
        return Response(exposition(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    for path, probe in (("/healthz", healthz), ("/readyz", readyz), ("/metrics", metrics)):
        # HEAD for probes and uptime checkers that use it (was 405); the server sends no body
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": settings.served_model_name, "object": "model",
                                            "created": 0, "owned_by": "lemon"}]}

    @app.post("/v1/orchestrate", response_model=OrchestrateResponse)
    async def orchestrate(body: OrchestrateRequest, request: Request) -> OrchestrateResponse:
        """Task -> the spec the orchestrator wrote, the executed trace, and the answer."""
        job = _job(service, body.task, "task", body.answer_format, body.benchmark, body.budget)
        result = await _run(service, job, request)
        response = _orchestrate_response(result)
        if body.picture:
            _add_picture(response, result, service.pool.level_names)
        return response

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        """OpenAI-compatible: the last user message is the task, the team's answer is the reply."""
        if body.model != settings.served_model_name:
            raise ApiError(404, "model_not_found", f"model {body.model!r} does not exist; use "
                           f"{settings.served_model_name!r}", param="model")
        budget = body.budget or Budget()
        cap = body.max_completion_tokens or body.max_tokens
        cap_param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        if cap is not None and budget.max_tokens is None:
            budget = Budget(max_agents=budget.max_agents, max_tokens=cap)
        else:
            cap_param = "budget.max_tokens"
        task = _last_user_text(body.messages)
        job = _job(service, task, "messages", body.answer_format, body.benchmark, budget, cap_param)
        result = await _run(service, job, request)
        completion = _chat_body(settings.served_model_name, result)
        if not body.stream:
            return JSONResponse(completion)
        usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_sse_chunks(completion, usage), media_type="text/event-stream")

    return app


# --- request handling -----------------------------------------------------------------------------
def _job(service: Service, task: str, task_param: str, answer_format: str | None,
         benchmark: str | None, budget: Budget | None, tokens_param: str = "budget.max_tokens") -> Job:
    """Validate one request's task, format and budget against the server's limits."""
    settings = service.settings
    if not task.strip():
        raise ApiError(422, "invalid_request", f"{task_param}: the task is empty", param=task_param)
    if len(task) > settings.max_task_chars:
        raise ApiError(422, "invalid_request", f"{task_param}: the task is {len(task)} characters, at most "
                       f"{settings.max_task_chars} allowed; shorten it", param=task_param)
    if answer_format and len(answer_format) > settings.max_answer_format_chars:
        raise ApiError(422, "invalid_request", f"answer_format: {len(answer_format)} characters, at most "
                       f"{settings.max_answer_format_chars} allowed; describe the format in one short line",
                       param="answer_format")
    if answer_format and benchmark:
        raise ApiError(422, "invalid_request", "give answer_format or benchmark, not both", param="benchmark")
    team_answer_format = ""
    if benchmark:
        from lemon_core.benchmarks import get

        try:
            named = get(benchmark)
        except ValueError as e:
            raise ApiError(422, "invalid_request", f"benchmark: {e}", param="benchmark") from None
        answer_format, team_answer_format = named.answer_format, named.team_answer_format
    budget = budget or Budget()
    _check_budget(service, budget, tokens_param)
    return Job(task=task, answer_format=answer_format or "", team_answer_format=team_answer_format,
               max_agents=budget.max_agents or settings.max_agents,
               max_tokens=budget.max_tokens or settings.max_tokens)


def _check_budget(service: Service, budget: Budget, tokens_param: str) -> None:
    """422 before any model runs for a budget over the server's limits or below what any spec needs.

    The floor: ``min_budget_agents`` agents at the cheapest level's ``max_tokens``. A tighter budget
    cannot be met by any team the orchestrator writes, and re-sampling it only ended in a 502.
    """
    s = service.settings
    floor_agents = min(s.min_budget_agents, s.max_agents)
    floor_tokens = floor_agents * min(level.max_tokens for level in service.pool.levels)
    for name, param, asked, low, high in (
            ("max_agents", "budget.max_agents", budget.max_agents, floor_agents, s.max_agents),
            ("max_tokens", tokens_param, budget.max_tokens, floor_tokens, s.max_tokens)):
        if asked is not None and asked > high:
            raise ApiError(422, "invalid_request", f"{param}={asked} is over this server's limit of {high}; "
                           f"ask for at most {high}", param=param)
        if asked is not None and asked < low:
            why = (f"the orchestrator writes teams of at least {floor_agents} agents" if name == "max_agents" else
                   f"{floor_agents} agent(s) at the cheapest level may generate {floor_tokens} tokens")
            raise ApiError(422, "invalid_request", f"{param}={asked} cannot be met: {why}; ask for at least "
                           f"{low} (or leave it out)", param=param)


async def _run(service: Service, job: Job, request: Request) -> JobResult:
    """Admission (429 when full), batching, metrics, and failures turned into client errors."""
    s = service.settings
    if not service.limiter.try_acquire():
        raise ApiError(429, "rate_limit_exceeded", f"server busy: {s.max_concurrent_requests} requests in "
                       f"progress; retry after {s.retry_after_s} s",
                       headers={"Retry-After": str(s.retry_after_s)})
    service.metrics.requests_in_flight.inc()
    t0 = time.perf_counter()
    try:
        result = await _submit_unless_gone(service, job, request)
    finally:
        service.limiter.release()
        service.metrics.requests_in_flight.dec()
        service.metrics.request_latency.observe(time.perf_counter() - t0)
    if result.spec.parsed is None:
        status = 502 if result.spec.error_type == "invalid_spec" else 503
        raise ApiError(status, result.spec.error_type or "invalid_spec", result.spec.error or "no spec")
    trace = result.trace
    assert trace is not None
    if trace.error is not None:
        log.warning("team execution failed: %s", trace.error)
        failed = next((a for a in trace.agents if a.error and not a.error.startswith("skipped")), None)
        where = f"agent {failed.agent_id!r} (capacity {failed.capacity!r})" if failed else "an agent"
        if failed is not None and failed.error and failed.error.startswith(UNAVAILABLE):
            raise ApiError(503, "backend_unavailable", f"{where} got no answer from its model server, so the "
                           f"team has no answer; retry after {s.retry_after_s} s",
                           headers={"Retry-After": str(s.retry_after_s)})
        raise ApiError(502, "execution_failed", f"{where} failed, so the team has no answer; see server logs")
    return result


async def _submit_unless_gone(service: Service, job: Job, request: Request) -> JobResult:
    """The job's result, or 499 as soon as the client disconnects (its slot is freed then, and
    ``job.abandoned`` tells the batch and the backends to stop its work).

    ``Task.cancel()`` only *requests* cancellation: the task is not cancelled until the loop has run it
    once more, and asking for its result before then raises ``InvalidStateError`` (a 500 with a
    traceback in the log). So a cancelled ``work`` is awaited before anything is decided from it.
    """
    work = asyncio.ensure_future(service.batcher.submit(job))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # also when this handler itself is cancelled (shutdown): nothing may keep running for it
        if not work.done():
            job.abandoned.set()
            work.cancel()
        watch.cancel()
        await asyncio.wait((work, watch))  # both settle within one loop turn: they only await futures
    if work.cancelled():
        log.info("client went away; request cancelled")
        raise ApiError(499, "client_closed_request", "the client closed the connection")
    error = work.exception()
    if isinstance(error, ShuttingDown):
        raise ApiError(503, "shutting_down", "the server is shutting down; retry on another replica",
                       headers={"Retry-After": str(service.settings.retry_after_s)})
    if error is not None:
        raise error
    return work.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is already read, so the next message is the end)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _add_picture(response: OrchestrateResponse, result: JobResult, levels: list[str]) -> None:
    """The spec as SVG (the same picture the report and `lemon spec show` draw); a spec the picture cannot be drawn
    for is reported in ``picture_error``, never a failed request."""
    from lemon_core.spec_picture import SpecPictureError, spec_svg

    assert result.spec.parsed is not None
    try:
        response.picture_svg = spec_svg(result.spec.parsed.spec, levels)
    except SpecPictureError as e:
        response.picture_error = str(e)


def _orchestrate_response(result: JobResult) -> OrchestrateResponse:
    spec, trace = result.spec, result.trace
    assert spec.parsed is not None and trace is not None
    roles = {a.id: a.role for a in spec.parsed.spec.agents}
    lo, hi = spec.parsed.block
    return OrchestrateResponse(
        id=f"orch-{uuid.uuid4().hex[:24]}",
        spec=SpecOut(yaml=spec.parsed.text[lo:hi].strip("\n") + "\n", parsed=spec.parsed.spec.model_dump(),
                     attempts=spec.attempts, prompt_tokens=spec.prompt_tokens,
                     completion_tokens=spec.completion_tokens),
        trace=TraceOut(
            agents=[AgentOut(id=a.agent_id, role=roles.get(a.agent_id, ""), capacity=a.capacity,
                             output=a.output, prompt_tokens=a.prompt_tokens,
                             completion_tokens=a.completion_tokens, cost=a.cost, latency_s=a.latency_s,
                             cached=a.cached, error=_mask_urls(a.error)) for a in trace.agents],
            prompt_tokens=trace.prompt_tokens, completion_tokens=trace.completion_tokens,
            total_tokens=trace.tokens, cost=trace.cost, latency_s=trace.latency_s),
        answer=trace.answer, seconds=result.seconds,
    )


def _last_user_text(messages: list[ChatMessage]) -> str:
    for m in reversed(messages):
        if m.role == "user":
            if isinstance(m.content, list):  # content parts: keep the text ones
                return "\n".join(str(p.get("text", "")) for p in m.content if p.get("type") == "text")
            return m.content or ""
    raise ApiError(422, "invalid_request", "messages: no message with role 'user'; the last user message "
                   "is the task", param="messages")


def _chat_body(model: str, result: JobResult) -> dict[str, Any]:
    trace = result.trace
    assert trace is not None and result.spec.parsed is not None
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": trace.answer},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": trace.prompt_tokens, "completion_tokens": trace.completion_tokens,
                  "total_tokens": trace.tokens},
        "lemon": {"agents": len(trace.agents), "cost": trace.cost, "spec_attempts": result.spec.attempts},
    }


async def _sse_chunks(completion: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """The finished answer as OpenAI stream chunks: role, content, stop (+ usage), then [DONE]."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    answer = completion["choices"][0]["message"]["content"]
    deltas = [({"role": "assistant", "content": ""}, None), ({"content": answer}, None), ({}, "stop")]
    for delta, finish in deltas:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        if include_usage:
            chunk["usage"] = None
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': completion['usage']})}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _mask_urls(text: str | None) -> str | None:
    """``text`` with every URL (which may carry credentials or internal hosts) replaced by ``<url>``."""
    return URL.sub("<url>", text) if text else text


async def _readiness(service: Service) -> dict[str, dict[str, Any]]:
    """The backend checks, re-run at most once per ``readiness_cache_s`` however many probes ask."""
    if service.orchestrator is None:
        return {"startup": {"ok": False, "detail": "backends are still loading"}}
    async with service.readiness_lock:  # concurrent probes wait for one check instead of each fanning out
        now = time.monotonic()
        cached = service.readiness
        if cached is None or now - cached[0] >= service.settings.readiness_cache_s:
            service.readiness = (now, await _check_backends(service))
        return service.readiness[1]


async def _check_backends(service: Service) -> dict[str, dict[str, Any]]:
    """Per level (and the orchestrator): ok + a detail that names no URL. HTTP backends get
    GET {base_url}/models with a short timeout, each server once however many levels share it."""
    checks: dict[str, dict[str, Any]] = {}
    urls: dict[str, tuple[str, dict[str, str]]] = {}  # name -> (base_url, headers)
    for name, backend in service.backends().items():
        base_url = getattr(backend, "base_url", None)
        if isinstance(base_url, str):
            urls[name] = (base_url, getattr(backend, "headers", {}))
        else:
            checks[name] = {"ok": True, "detail": "loaded in process"}
    unique = {url: headers for url, headers in urls.values()}
    async with httpx.AsyncClient(timeout=service.settings.readiness_timeout_s) as client:
        # all servers at once, so /readyz answers within one timeout (the probe's own is 3 s)
        results = await asyncio.gather(*(_probe(client, url, h) for url, h in unique.items()))
    by_url = dict(zip(unique, results, strict=True))
    checks.update({name: by_url[url] for name, (url, _) in urls.items()})
    return checks


async def _probe(client: httpx.AsyncClient, base_url: str, headers: dict[str, str]) -> dict[str, Any]:
    """One server's check; the URL goes to the log only (it may hold credentials)."""
    try:
        resp = await client.get(f"{base_url}/models", headers=headers)
    except httpx.HTTPError as e:
        log.warning("readiness: %s/models unreachable: %s", redact(base_url), type(e).__name__)
        return {"ok": False, "detail": f"server unreachable ({type(e).__name__})"}
    if resp.status_code != 200:
        log.warning("readiness: GET %s/models -> HTTP %d", redact(base_url), resp.status_code)
    return {"ok": resp.status_code == 200, "detail": f"GET /models -> HTTP {resp.status_code}"}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.kind, exc.message, exc.param), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems, first = [], None
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ()) if p != "body"]
            field = ".".join(loc) or "body"
            first = first or field
            problems.append(f"{field}: {err.get('msg', 'invalid')}")
        return JSONResponse(error_body("invalid_request", "; ".join(problems), first), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else "http_error"
        return JSONResponse(error_body(kind, str(exc.detail)), exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        ref = uuid.uuid4().hex[:12]
        log.error("unhandled error %s on %s %s", ref, request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body("internal_error", f"internal server error (reference {ref}); "
                                       "see the server log"), 500)
