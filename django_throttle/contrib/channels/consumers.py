"""``ThrottledConsumerMixin``: every received message of a connection counted under a scope."""

from __future__ import annotations

import inspect
import json
from typing import Any

from channels.consumer import SyncConsumer

from ...costs import valid_cost
from ...decision import Decision
from ...engine import aevaluate, arelease_leases, evaluate, release_leases, state_of
from ...responses import retry_after_seconds
from ...rules import ScopeSpec
from .connection import SCOPE_KEY, Connection

CLOSE_CODE = 4429  # a close code of the application range (4000-4999): "too many messages"


class ThrottledConsumerMixin:
    """Put it before the consumer class (``class Chat(ThrottledConsumerMixin,
    AsyncWebsocketConsumer)``), sync or async, JSON or not. ``throttle_scope``'s rules (admin
    rules, else code defaults; their methods empty or naming WEBSOCKET) count each received
    message for the client of the handshake, keyed as its rules say (ip, user, header, query
    parameter, key function), with overrides, exemptions and fail modes. A rejected message
    never reaches ``receive()``: ``throttled(decision)`` is called instead, and after
    ``throttle_close_after`` rejections in a row the socket is closed with code 4429."""

    throttle_scope: str | None = None
    throttle_close_after: int | None = 10  # None: never close

    scope: dict[str, Any]
    _throttle_client: Connection | None = None
    _throttle_spec: ScopeSpec | None = None
    _throttle_rejected = 0

    def throttle_cost(self, text_data: str | None = None, bytes_data: bytes | None = None) -> int:
        """What a message counts for (1 unless overridden; 0 counts nothing)."""
        return 1

    def throttled(self, decision: Decision) -> Any:
        """A message was rejected: by default a JSON text frame
        ``{"error": "throttled", "retry_after": N}`` (an async consumer may make it a
        coroutine)."""
        frame = json.dumps({"error": "throttled", "retry_after": retry_after_seconds(decision)})
        return self.send(text_data=frame)  # type: ignore[attr-defined]

    def websocket_receive(self, message: dict[str, Any]) -> Any:
        # Channels dispatches websocket.receive here; the consumer's own method decodes the
        # frame and calls receive() / receive_json(). An async consumer gets a coroutine
        # (a SyncConsumer is an AsyncConsumer too, whose dispatch runs in a thread).
        if not isinstance(self, SyncConsumer):
            return self._athrottle_receive(message)
        if self.throttle_scope is None:
            return super().websocket_receive(message)  # type: ignore[misc]
        client, spec, cost = self._throttle_event(message)
        if cost == 0:
            return super().websocket_receive(message)  # type: ignore[misc]
        decision = evaluate(client, [spec], cost=cost)
        if not decision.allowed:
            self.throttled(decision)
            if self._throttle_refused():
                self.close(code=CLOSE_CODE)
            return None
        self._throttle_rejected = 0
        try:
            return super().websocket_receive(message)  # type: ignore[misc]
        finally:
            if state_of(client).leases:
                release_leases(client)  # a concurrency rule: messages being handled at once

    async def _athrottle_receive(self, message: dict[str, Any]) -> None:
        if self.throttle_scope is None:
            await super().websocket_receive(message)  # type: ignore[misc]
            return
        client, spec, cost = self._throttle_event(message)
        if cost == 0:
            await super().websocket_receive(message)  # type: ignore[misc]
            return
        decision = await aevaluate(client, [spec], cost=cost)
        if not decision.allowed:
            reply = self.throttled(decision)
            if inspect.isawaitable(reply):
                await reply
            if self._throttle_refused():
                await self.close(code=CLOSE_CODE)  # type: ignore[attr-defined]
            return
        self._throttle_rejected = 0
        try:
            await super().websocket_receive(message)  # type: ignore[misc]
        finally:
            if state_of(client).leases:
                await arelease_leases(client)

    def _throttle_event(self, message: dict[str, Any]) -> tuple[Connection, ScopeSpec, int]:
        """The message as the engine decides it: a fresh event of the handshake's client,
        the scope, its cost."""
        handshake = self._throttle_client
        if handshake is None:
            # The middleware's, or (without it in the stack) this connection's own scope.
            handshake = self.scope.get(SCOPE_KEY) or Connection(self.scope)
            self._throttle_client = handshake
        spec = self._throttle_spec
        if spec is None:
            spec = self._throttle_spec = ScopeSpec(str(self.throttle_scope), None, 1)
        text = message.get("text")
        cost = self.throttle_cost(
            text_data=text, bytes_data=None if text is not None else message.get("bytes")
        )
        if cost != 0 or isinstance(cost, bool):
            try:
                valid_cost(cost)
            except ValueError:
                raise ValueError(
                    f"{type(self).__name__}.throttle_cost() must return a whole number, 0 or "
                    f"more, not {cost!r}"
                ) from None
        return handshake.for_message(), spec, cost

    def _throttle_refused(self) -> bool:
        """Count a rejection in a row; whether it is the one that closes the socket."""
        self._throttle_rejected += 1
        limit = self.throttle_close_after
        return limit is not None and self._throttle_rejected >= limit
