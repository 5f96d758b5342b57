"""``ThrottleMiddleware``: every rule that applies to a request, in one store call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from .engine import (
    aenforce_bans,
    aenforce_view,
    afailed,
    arelease_after_threads,
    arespond,
    begin,
    enforce_bans,
    enforce_view,
    failed,
    respond,
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
            # in a thread; the engine's own, with no coroutine of ours around it. (The
            # ignore: the instance attribute deliberately swaps the sync method for a
            # coroutine function, which no static type can express.)
            self.process_view = aenforce_view  # type: ignore[method-assign, assignment]

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        # The request's state and its client; this thread counted among the server's
        # (MAX_DELAYED).
        threads = begin(request)
        try:
            if (banned := enforce_bans(request)) is not None:
                return banned  # before any rule, whatever the path
            try:
                response = self.get_response(request)
            except BaseException as error:
                # Django turns a view's exception into a response before it gets here, unless
                # DEBUG_PROPAGATE_EXCEPTIONS: then no response will be closed, the leases end
                # now, and the request counts with the status Django would have answered.
                failed(request, error)
                raise
            return respond(request, response)
        finally:
            if threads is not None:
                threads.leave()

    async def __acall__(self, request: HttpRequest) -> Any:
        begin(request, in_thread=False)
        if (banned := await aenforce_bans(request)) is not None:
            return banned
        get_response: Callable[[HttpRequest], Awaitable[Any]] = self.get_response
        try:
            response = await get_response(request)
        except asyncio.CancelledError:
            # The client went away (ASGIHandler cancels the request): no response will be
            # closed. A sync view goes on running in its thread and keeps its slots until it
            # returns; after an async view (cancelled: its work has ended) they end at once.
            # Its status is never known: the request stays counted by every rule (leaving
            # before the answer must not be a way around a rule that counts failures).
            await arelease_after_threads(request)
            raise
        except BaseException as error:
            await afailed(request, error)  # as in __call__
            raise
        return await arespond(request, response)

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        return enforce_view(request, view_func)
