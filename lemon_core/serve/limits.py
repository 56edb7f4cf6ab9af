"""Request limits that protect the service: auth before the body, read timeouts, body size (413) and
in-progress requests (429).

The order matters. ``AuthGate`` is the outermost middleware: it answers 401 from the headers alone and
never reads the body, so unauthenticated clients cannot make the server buffer anything (800 such
connections holding 64 KB each pinned ~57 MB when the body was read first). ``BodySizeLimit`` then
reads at most ``max_bytes + 1`` bytes within ``timeout_s`` (408 after), so an oversized, endless or
trickling body is refused without being buffered in full. Slow *headers* never reach the app; the
uvicorn protocol from ``header_timeout_protocol`` closes such connections. The concurrency limit is
a counter checked by the API endpoints (not probes or /metrics): a request over the limit is answered
at once with 429 and ``Retry-After`` instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(kind: str, message: str, param: str | None = None) -> dict[str, Any]:
    """The one error shape of the service (the OpenAI one, so SDK clients show the message)."""
    err: dict[str, Any] = {"type": kind, "message": message}
    if param is not None:
        err["param"] = param
    return {"error": err}


async def send_error(send: Send, status: int, kind: str, message: str,
                     headers: Collection[tuple[bytes, bytes]] = ()) -> None:
    """Answer with the service's error body and close the connection (the body was not read)."""
    payload = json.dumps(error_body(kind, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": payload})


class AuthGate:
    """401 for requests without a valid bearer token, decided on the headers before any body is read.

    ``check`` gets the raw ``Authorization`` header bytes (None when absent); ``public`` paths (probes,
    /metrics) pass without a token. ``check=None`` disables auth (--allow-unauthenticated).
    """

    def __init__(self, app: ASGIApp, check: Callable[[bytes | None], bool] | None,
                 public: Collection[str]) -> None:
        self.app = app
        self.check = check
        self.public = frozenset(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.check is None or scope["path"] in self.public:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers") or [] if k.lower() == b"authorization"), None)
        if not self.check(header):
            await send_error(send, 401, "authentication_error",
                             "missing or wrong bearer token; send 'Authorization: Bearer <token>'",
                             [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413, and bodies slower than ``timeout_s`` with 408."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while more:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                await send_error(send, 408, "request_timeout", f"request body not received within "
                                 f"{self.timeout_s:g} s; send the whole body at once")
                return
            if message["type"] != "http.request":  # client went away
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replay = _replay([{"type": "http.request", "body": body, "more_body": False}], receive)
        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        await send_error(send, 413, "request_too_large",
                         f"request body is larger than {self.max_bytes} bytes; send a shorter task")


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive() that yields the buffered messages, then defers to the real one (disconnects)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


class ConcurrencyLimiter:
    """A non-blocking counter of requests in progress (used from the event loop thread only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    def try_acquire(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active = max(0, self.active - 1)


def header_timeout_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, plus: a connection whose request headers are not complete within
    ``timeout_s`` (from connecting, or from the first byte of a keep-alive request) is closed.

    uvicorn itself only times out idle keep-alive connections, so a client sending one header byte at
    a time would hold its connection for ever (the "slowloris" attack).
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            if before is not None and before.response_complete and self._header_timer is None:
                self._arm()  # the next request on a kept-alive connection starts
            super().data_received(data)
            if self.cycle is not None and self.cycle is not before:
                self._disarm()  # its headers are complete

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection whose request headers took over %g s", timeout_s)
                self.transport.close()

    return HeaderTimeoutH11Protocol
