"""``lemon serve``: run the inference service (FastAPI app on uvicorn, one process).

One process on purpose: in-process models are loaded once and shared by the micro-batcher, and
requests from many users are batched together. Scale out with replicas (the Helm chart's HPA).

Shutdown (SIGTERM from the kubelet): uvicorn stops accepting connections; requests in progress get
``shutdown_grace_s`` to finish, then the ones still waiting are answered 503 ``shutting_down`` (not
cancelled mid-flight, which logged tracebacks) and the process exits. The chart sets
``shutdown_grace_s`` a few seconds below ``terminationGracePeriodSeconds``, so the kubelet never has
to SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import uvicorn

if TYPE_CHECKING:
    from fastapi import FastAPI

    from lemon_core.serve.settings import ServeSettings

# After the drain, what uvicorn may still take: answering the 503s and closing connections.
SHUTDOWN_SLACK_S = 2.0


def serve_command(
    host: Annotated[str | None, typer.Option(
        help="Address to bind (0.0.0.0 in a container). Default: 127.0.0.1.")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="TCP port. Default: 8080.")] = None,
    pool: Annotated[str | None, typer.Option(
        help="Capacity pool: YAML path or built-in name (cpu, gpu, simulated). Default: cpu.")] = None,
    orchestrator: Annotated[str | None, typer.Option(
        help="Orchestrator model. In process: a local path, a checkpoint or `lemon train` output folder, "
             "or a `lemon models` alias. With --orchestrator-base-url: the served model name. "
             "[default: smollm2-135m-instruct]")] = None,
    orchestrator_base_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible endpoint serving the orchestrator, e.g. http://vllm:8000/v1 "
             "(env LEMON_ORCHESTRATOR_BASE_URL). Unset: run it in process with transformers.")] = None,
    auth_token_file: Annotated[Path | None, typer.Option(
        help="File with the accepted bearer tokens, one per line (a mounted Secret; re-read when it "
             "changes).")] = None,
    allow_unauthenticated: Annotated[bool | None, typer.Option(
        "--allow-unauthenticated", help="Serve without auth. Local development only.")] = None,
    config: Annotated[Path | None, typer.Option(
        help="YAML file with any ServeSettings fields (lemon_core/serve/settings.py). Precedence: flags > "
             "LEMON_* environment > this file > defaults.")] = None,
    max_concurrent_requests: Annotated[int | None, typer.Option(
        min=1, help="Requests in progress before new ones get 429 + Retry-After. Default: 32.")] = None,
    max_agents: Annotated[int | None, typer.Option(min=1, help="Most agents per spec. Default: 8.")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        min=1, help="Most completion tokens a team may generate per request. Default: 8192.")] = None,
    batch_max_size: Annotated[int | None, typer.Option(
        min=1, help="Most requests orchestrated and executed as one batch. Default: 16.")] = None,
    batch_wait_ms: Annotated[float | None, typer.Option(
        min=0, help="How long a batch waits for more requests, in ms. Default: 10.")] = None,
    log_level: Annotated[str | None, typer.Option(
        help="debug, info, warning, error (env LEMON_LOG_LEVEL). Default: info.")] = None,
    shutdown_grace_s: Annotated[float | None, typer.Option(
        min=0.1, help="After SIGTERM, how long requests in progress may finish before they get 503; keep it "
                      "below the pod's terminationGracePeriodSeconds. Default: 25.")] = None,
) -> None:
    """Serve an orchestrator: POST /v1/orchestrate and /v1/chat/completions (model 'lemon'), GET /healthz,
    /readyz, /metrics. Every setting also reads LEMON_<NAME> from the environment."""
    from lemon_core.backends.base import BackendError
    from lemon_core.pool import PoolError
    from lemon_core.redact import install_log_redaction
    from lemon_core.serve.app import create_app
    from lemon_core.serve.auth import AuthError
    from lemon_core.serve.settings import load_settings

    try:
        settings = load_settings(
            config, host=host, port=port, pool=pool, orchestrator=orchestrator,
            orchestrator_base_url=orchestrator_base_url,
            auth_token_file=str(auth_token_file) if auth_token_file else None,
            allow_unauthenticated=allow_unauthenticated, max_concurrent_requests=max_concurrent_requests,
            max_agents=max_agents, max_tokens=max_tokens, batch_max_size=batch_max_size,
            batch_wait_ms=batch_wait_ms, log_level=log_level.lower() if log_level else None,
            shutdown_grace_s=shutdown_grace_s,
        )
        install_log_redaction()  # before any handler exists: no credential reaches a log line
        logging.basicConfig(level=settings.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if settings.allow_unauthenticated:
            logging.getLogger("lemon.serve").warning("serving WITHOUT auth (--allow-unauthenticated)")
        app = create_app(settings)
        app.state.service.load_backends()  # load models now: a bad model path is a one-line error
    except (ValueError, PoolError, AuthError, BackendError) as e:
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from None
    run_server(app, settings)


def server_config(app: FastAPI, settings: ServeSettings) -> uvicorn.Config:
    """The uvicorn config of ``lemon serve``: header read timeout, graceful-shutdown bound, no banner."""
    from lemon_core.serve.limits import header_timeout_protocol

    return uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level, server_header=False,
        http=header_timeout_protocol(settings.header_timeout_s), lifespan="on",
        timeout_graceful_shutdown=settings.shutdown_grace_s + SHUTDOWN_SLACK_S,  # type: ignore[arg-type]
    )


def run_server(app: FastAPI, settings: ServeSettings, sockets: list[socket.socket] | None = None) -> None:
    """Run ``app`` until SIGTERM/SIGINT, then drain it within ``settings.shutdown_grace_s``."""
    from lemon_core.redact import install_log_redaction

    install_log_redaction()  # uvicorn's access and error logs, httpx's request log: no credentials
    DrainingServer(server_config(app, settings), app, settings.shutdown_grace_s).run(sockets=sockets)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that, once shutdown starts, gives requests ``grace_s`` and then answers the ones
    still waiting with 503 (``MicroBatcher.stop``) instead of letting uvicorn cancel them mid-flight."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_s: float) -> None:
        super().__init__(config)
        self.lemon_app = app
        self.grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = asyncio.get_running_loop().create_task(self._fail_waiting_after_grace())
        try:
            await super().shutdown(sockets)
        finally:
            drain.cancel()

    async def _fail_waiting_after_grace(self) -> None:
        await asyncio.sleep(self.grace_s)
        logging.getLogger("lemon.serve").warning("shutdown: requests still running after %g s get 503",
                                                 self.grace_s)
        await self.lemon_app.state.service.batcher.stop()
