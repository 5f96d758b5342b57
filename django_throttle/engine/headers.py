"""A request's response as the engine sees it: what a rule does not count given back, a cost
known after the response settled, the rate-limit headers of its decisions written, its
concurrency leases set to end."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponseBase

from ..conf import conf
from ..responses import RETRY_AFTER, X_LIMIT, add_headers, retry_after_seconds
from .leases import arelease_leases, release_leases, release_when_closed
from .outcomes import acount_outcome, count_outcome, failed_status
from .request_state import RequestState, state_of
from .settlements import asettle_cost, settle_cost, view_failed


def finish(request: Any, response: Any) -> Any:
    """Give back what the rules that do not count the response's status took, and write the
    rate-limit headers of the request's decisions on a response that has none: our own 429s
    have them; a view's response, or a 429 of DRF's, does not. Concurrency leases end when
    the response is closed (a streaming one: once streamed)."""
    state = state_of(request)
    if state.taken and isinstance(response, HttpResponseBase):
        count_outcome(state, response.status_code)
        settle_cost(request, state, response)  # a cost known after the response
    return _written(request, state, response)


async def afinish(request: Any, response: Any) -> Any:
    """finish() on an event loop: the give-back never blocks it."""
    state = state_of(request)
    if state.taken and isinstance(response, HttpResponseBase):
        await acount_outcome(state, response.status_code)
        await asettle_cost(request, state, response)
    return _written(request, state, response)


def failed(request: Any, error: BaseException) -> None:
    """The view raised: no response will be closed. What the rules that do not count the
    status Django answers with (500, or 404, 403, 400) took is given back; the leases end."""
    count_outcome(state_of(request), failed_status(error))
    view_failed(request)
    release_leases(request)


async def afailed(request: Any, error: BaseException) -> None:
    await acount_outcome(state_of(request), failed_status(error))
    view_failed(request)
    await arelease_leases(request)


def _written(request: Any, state: RequestState, response: Any) -> Any:
    if state.leases and not state.release_armed and isinstance(response, HttpResponseBase):
        release_when_closed(request, state, response)
    decision = state.for_headers()
    if (
        decision is not None
        and (conf.HEADERS or not decision.allowed)
        and isinstance(response, HttpResponseBase)
        and not response.has_header(X_LIMIT)
    ):
        add_headers(response, decision)
        if response.status_code in (429, 503) and not response.has_header(RETRY_AFTER):
            response[RETRY_AFTER] = str(retry_after_seconds(decision))
    return response
