"""The rate-limit headers of a request's decisions, written on its response."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponseBase

from ..conf import conf
from ..responses import RETRY_AFTER, X_LIMIT, add_headers, retry_after_seconds
from .leases import release_when_closed
from .request_state import state_of


def finish(request: Any, response: Any) -> Any:
    """Write the rate-limit headers of the request's decisions on a response that has none:
    our own 429s have them; a view's response, or a 429 of DRF's, does not. Concurrency
    leases end when the response is closed (a streaming one: once streamed)."""
    state = state_of(request)
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
