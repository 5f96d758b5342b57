"""``ThrottleMiddleware``: every rule that applies to a request, in one store call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from .engine import (
    aenforce_unrouted,
    aenforce_view,
    arelease_after_threads,
    arelease_leases,
    enforce_unrouted,
    enforce_view,
    finish,
    release_leases,
    seen_by_middleware,
    serving,
)

GetResponse = Callable[[HttpRequest], Any]


class ThrottleMiddleware:
    """Decides in process_view, once the view (and so its URL name and @throttle scopes) is
    known; requests that never reach a view (404s, redirects) are decided on the way out
    under '*' and path rules."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            # Django awaits an async process_view under ASGI instead of running a sync one
            # in a thread. (The ignore: the instance attribute deliberately swaps the sync
            # method for a coroutine function, which no static type can express.)
            self.process_view = self._aprocess_view  # type: ignore[method-assign, assignment]

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        seen_by_middleware(request)
        threads = serving()
        counted = threads.enter()  # how many threads the server has, as seen (MAX_DELAYED)
        try:
            try:
                response = self.get_response(request)
            except BaseException:
                release_leases(request)  # no response will be closed: the leases end now
                raise
            rejection = enforce_unrouted(request)
            if rejection is not None:
                return rejection
            return finish(request, response)
        finally:
            if counted:
                threads.leave()

    async def __acall__(self, request: HttpRequest) -> Any:
        seen_by_middleware(request)
        get_response: Callable[[HttpRequest], Awaitable[Any]] = self.get_response
        try:
            response = await get_response(request)
        except asyncio.CancelledError:
            # The client went away (ASGIHandler cancels the request): no response will be
            # closed. A sync view goes on running in its thread and keeps its slots until it
            # returns; after an async view (cancelled: its work has ended) they end at once.
            await arelease_after_threads(request)
            raise
        except BaseException:
            await arelease_leases(request)  # no response will be closed: the leases end now
            raise
        rejection = await aenforce_unrouted(request)
        if rejection is not None:
            return rejection
        return finish(request, response)

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        return enforce_view(request, view_func)

    async def _aprocess_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        return await aenforce_view(request, view_func)
