"""When a request's concurrency leases end: its response closed, its handler call over, or
its view failed or was cancelled."""

from __future__ import annotations

import asyncio
import threading
import weakref
from contextvars import ContextVar
from functools import partial
from typing import Any

from asgiref.sync import SyncToAsync, sync_to_async
from django.http import HttpResponseBase

from ..runtime import Runtime, runtime
from .refunds import agive_back, give_back, taken
from .request_state import RequestState, state_of


def release_leases(request: Any) -> None:
    """End the request's concurrency leases (the response is finished, or never will be)."""
    state = state_of(request)
    leases, state.leases = state.leases, []
    give_back(taken(leases))


async def arelease_leases(request: Any) -> None:
    state = state_of(request)
    leases, state.leases = state.leases, []
    await agive_back(taken(leases))


async def arelease_after_threads(request: Any) -> None:
    """End the request's leases once the sync work it started is done: an ASGI request
    cancelled (its client gone) while a sync view runs in a thread, which goes on running.
    Queued even when the request holds no lease yet: the view may still take one (check())."""
    # The request's sync view runs on its thread-sensitive executor (one thread, one call at
    # a time: ASGIHandler gives each request its own), so a call queued there runs once the
    # view has returned, or at once if it never started. Shielded: a second cancellation
    # must not drop the release still waiting behind the view.
    await asyncio.shield(sync_to_async(release_leases, thread_sensitive=True)(request))


def release_when_closed(request: Any, state: RequestState, response: HttpResponseBase) -> None:
    """End the request's leases when ``response`` is closed (a streaming one: once streamed),
    or when its handler call is over (an outer middleware answered with its own response)."""
    state.release_armed = True
    # Django calls these from response.close(), which every server calls when the response
    # is done (WSGI's close(), and ASGIHandler after the last body chunk).
    response._resource_closers.append(partial(release_leases, request))  # type: ignore[attr-defined]
    holding = _handler_holding()
    if holding is not None:
        holding.append(request)


# The requests of the current handler call that hold leases. Under WSGI, request_started
# puts a new list in the handler's context (the request's thread) and request_finished ends
# what is in it. Under ASGI both signals' receivers run in tasks of their own (Signal.asend),
# so what they set never reaches the request; there the list is keyed by the request's
# ThreadSensitiveContext, which ASGIHandler enters around the request and which every task
# and thread of the request (its sync view, the signals' receivers) inherits.
# A module-level ContextVar, not a runtime part: each context has its own value, so nothing
# in it is shared between requests.
_holding: ContextVar[list[Any] | None] = ContextVar("django_throttle_holding", default=None)


class AsgiHolding:
    """Under ASGI, the requests holding leases, by their handler's ThreadSensitiveContext."""

    def __init__(self) -> None:
        self.by_handler: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()

    def handover(self, successor: Runtime) -> None:
        # Requests in flight across a settings change still end their leases at the end.
        with self.lock:
            held = dict(self.by_handler)
        following = successor.part(AsgiHolding)
        with following.lock:
            following.by_handler.update(held)


def _handler_holding(end: bool = False) -> list[Any] | None:
    """The list of the current handler call (``end``: taken away, the call is over)."""
    holding = _holding.get()
    if holding is not None:
        return holding
    handler = SyncToAsync.thread_sensitive_context.get(None)
    if handler is None:
        return None
    asgi = runtime().part(AsgiHolding)
    with asgi.lock:
        if end:
            return asgi.by_handler.pop(handler, None)
        return asgi.by_handler.setdefault(handler, [])


def request_started(**kwargs: Any) -> None:
    _holding.set([])


def request_finished(**kwargs: Any) -> None:
    """The final response is closed, or an ASGI request ended without one (its client left;
    the receivers run after its sync view has returned, on the request's thread): end the
    leases of the request, also when an outer middleware answered with a response of its own
    (a 304, a redirect), which the server closes instead of ours."""
    holding = _handler_holding(end=True)
    if holding:
        requests, holding[:] = list(holding), []
        for request in requests:
            release_leases(request)
