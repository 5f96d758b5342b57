"""``ThrottleMiddleware``: the path rules of a WebSocket handshake, before the consumer runs."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.http import HttpResponse

from ...decision import Decision
from ...engine import aadmit, arelease_leases, state_of
from ...responses import rejection_detail, rejection_headers, retry_after_seconds
from .connection import SCOPE_KEY, Connection

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[Any]]

DENIAL = "websocket.http.response"  # the WebSocket Denial Response extension


class ThrottleMiddleware:
    """ASGI middleware for Channels' stack (inside AuthMiddlewareStack, so user rules see the
    user): a ``websocket`` connection attempt counts as one request under the rules of its
    path whose methods are empty or name WEBSOCKET; other scopes pass through untouched.

    A rejected handshake never reaches the consumer: a 429 (503 for a fail-closed rule while
    the store is down) with Retry-After and the rate-limit fields where the server supports
    the Denial Response extension, else a close (the server answers HTTP 403). A concurrency
    rule's slot is held while the connection is open."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> Any:
        if scope["type"] != "websocket":
            return await self.inner(scope, receive, send)
        connection = Connection(scope)
        decision = await aadmit(connection, paths=True)
        if not decision.allowed:
            await refuse(scope, receive, send, decision)
            return None
        try:
            return await self.inner({**scope, SCOPE_KEY: connection}, receive, send)
        finally:
            if state_of(connection).leases:
                await arelease_leases(connection)  # the connection is over: its slots end


async def refuse(scope: Scope, receive: Receive, send: Send, decision: Decision) -> None:
    """Answer the handshake's ``websocket.connect`` with the rejection."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the client left first
    if DENIAL not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close"})
        return
    status, headers, body = denial(decision)
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


def denial(decision: Decision) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The status, headers and JSON body of a refused handshake, as an HTTP rejection's."""
    seconds = retry_after_seconds(decision)
    body = json.dumps({"detail": str(rejection_detail(decision)), "retry_after": seconds})
    response = HttpResponse(status=503 if decision.unavailable else 429)
    rejection_headers(response, decision)
    headers = [(b"content-type", b"application/json")]
    headers += [
        (name.lower().encode("latin1"), value.encode("latin1"))
        for name, value in response.items()
        if name.lower() != "content-type"
    ]
    return response.status_code, headers, body.encode()
