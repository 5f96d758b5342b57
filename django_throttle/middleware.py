"""``ThrottleMiddleware``: every rule that applies to a request, in one store call."""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from .conf import conf
from .responses import add_headers
from .throttling import (
    SEEN_ATTR,
    SPECS_ATTR,
    aenforce,
    agather,
    enforce,
    for_headers,
    gather,
    pending_specs,
)


def view_specs(view_func: Any) -> list[Any]:
    """The @throttle scopes of a view: on the function, or on a class-based view's dispatch
    (method_decorator copies the decorator's attributes onto it)."""
    specs = getattr(view_func, SPECS_ATTR, None)
    if specs is None:
        view_class = getattr(view_func, "view_class", None)
        specs = getattr(getattr(view_class, "dispatch", None), SPECS_ATTR, None)
    return specs or []


def _url_name(request: HttpRequest) -> str | None:
    match = getattr(request, "resolver_match", None)
    return match.view_name if match is not None else None


class ThrottleMiddleware:
    """Decides in process_view, once the view (and so its URL name and @throttle scopes) is
    known; requests that never reach a view (404s, redirects) are decided on the way out
    under '*' and path rules."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            # Django awaits an async process_view under ASGI instead of running a sync one
            # in a thread.
            self.process_view = self._aprocess_view  # type: ignore[method-assign]

    # -- sync --------------------------------------------------------------------

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        response = self.get_response(request)
        if not getattr(request, SEEN_ATTR, False):
            setattr(request, SEEN_ATTR, True)
            rejection = enforce(request, gather(request, paths=True))
            if rejection is not None:
                return rejection
        return self._finish(request, response)

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        specs = self._view_specs(request, view_func)
        return enforce(request, gather(request, specs, paths=True, url_name=_url_name(request)))

    # -- async -------------------------------------------------------------------

    async def __acall__(self, request: HttpRequest) -> Any:
        response = await self.get_response(request)
        if not getattr(request, SEEN_ATTR, False):
            setattr(request, SEEN_ATTR, True)
            rejection = await aenforce(request, await agather(request, paths=True))
            if rejection is not None:
                return rejection
        return self._finish(request, response)

    async def _aprocess_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        specs = self._view_specs(request, view_func)
        gathered = await agather(request, specs, paths=True, url_name=_url_name(request))
        return await aenforce(request, gathered)

    # -- shared ------------------------------------------------------------------

    def _view_specs(self, request: HttpRequest, view_func: Any) -> list[Any]:
        setattr(request, SEEN_ATTR, True)
        return pending_specs(request, view_specs(view_func))

    def _finish(self, request: HttpRequest, response: Any) -> Any:
        if conf.HEADERS:
            decision = for_headers(request)
            if decision is not None and decision.allowed:
                add_headers(response, decision)
        return response
