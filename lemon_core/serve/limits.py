"""Request limits that protect the service: body size (413) and in-progress requests (429).

The body limit is an ASGI middleware that reads at most ``max_bytes + 1`` bytes before the app sees
anything, so an oversized or endless chunked body is refused without being buffered in full. The
concurrency limit is a counter checked by the API endpoints (not probes or /metrics): a request over
the limit is answered at once with 429 and ``Retry-After`` instead of queueing without bound.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
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


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413 before the app runs."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

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
        while more:
            message = await receive()
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
        payload = json.dumps(error_body(
            "request_too_large", f"request body is larger than {self.max_bytes} bytes; send a shorter task",
        )).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


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
