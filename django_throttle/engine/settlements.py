"""A request's cost known after its response (``settle()``, ``Rule.cost_header``): the
difference from what its decisions took before the view, charged or given back once, when the
response ends (a streaming one: when it is closed), in one store call (refund.lua: a negative
cost charges). A view that raised settles nothing: the cost taken stands."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.http import HttpResponseBase

from ..choices import Algorithm
from ..store import Check
from .refunds import Refund, agive_back, give_back, until
from .request_state import RequestState, state_of

_CONCURRENCY = str(Algorithm.CONCURRENCY)


def settle_request(request: Any, cost: object, rule: str | None = None) -> int:
    """``settle()``: the request's actual cost under every rule that counted it (or the one
    named ``rule``), applied when its response ends; how many rules it applies to."""
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
        raise ValueError(f"cost must be a whole number, 0 or more, not {cost!r}")
    if rule is not None and not isinstance(rule, str):
        raise ValueError(f"rule must be a rule's name or None, not {rule!r}")
    state = state_of(request)
    if state.actual is None:
        state.actual = {}
    applied = 0
    for prefix, result in state.taken.items():
        if result.rule.algorithm == _CONCURRENCY or rule not in (None, result.rule.name):
            continue
        state.actual[prefix] = cost
        applied += 1
    return applied


def settle_cost(request: Any, state: RequestState, response: Any) -> None:
    """Settle the request once ``response`` is done: now, or when a streaming one is closed
    (its view may call settle() as its last chunk is made)."""
    if _armed(state, response):
        refunds = _settlement(state, response)
        if refunds:
            give_back(refunds)


async def asettle_cost(request: Any, state: RequestState, response: Any) -> None:
    if _armed(state, response):
        refunds = _settlement(state, response)
        if refunds:
            await agive_back(refunds)


def view_failed(request: Any, **kwargs: Any) -> None:
    """The view raised (Django's ``got_request_exception``, or the exception reached the
    middleware): whatever it settled, the cost taken before it stands."""
    if request is not None:
        state_of(request).settled = True


def _armed(state: RequestState, response: Any) -> bool:
    """Whether to settle now: not a streaming response, whose settlement waits for its close
    (the server's, after the last chunk: the sync client then, from ASGIHandler's thread)."""
    if state.settled or not state.taken or not isinstance(response, HttpResponseBase):
        return False
    if response.streaming:
        response._resource_closers.append(partial(_settle_closed, state, response))  # type: ignore[attr-defined]
        return False
    return True


def _settle_closed(state: RequestState, response: HttpResponseBase) -> None:
    refunds = _settlement(state, response)
    if refunds:
        give_back(refunds)


def _settlement(state: RequestState, response: HttpResponseBase) -> list[Refund]:
    """What to give back (a positive cost) or charge (negative) of each rule that counted the
    request, by decision; nothing where the actual cost is the one taken, or unknown."""
    if state.settled:
        return []
    state.settled = True
    if not state.actual and not any(r.rule.cost_header for r in state.taken.values()):
        return []
    by_decision: dict[tuple[int, bool], list[Check]] = {}
    for prefix, result in state.taken.items():
        rule = result.rule
        if rule.algorithm == _CONCURRENCY:
            continue
        actual = state.actual.get(prefix) if state.actual else None
        if actual is None and rule.cost_header:
            actual = header_cost(response, rule.cost_header)
        if actual is None or actual == result.cost:
            continue
        check = Check(rule, result.identity, result.cost - actual, until(result))
        by_decision.setdefault((result.at, result.local), []).append(check)
    return [Refund(at, local, checks) for (at, local), checks in by_decision.items()]


MAX_HEADER_COST = 2**31 - 1  # past it a header's figure is no cost a store counts exactly


def header_cost(response: HttpResponseBase, header: str) -> int | None:
    """The whole number in ``header`` of the response; None if missing or not one."""
    text = response.get(header)
    if text is None:
        return None
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        return None
    value = int(text)
    return value if value <= MAX_HEADER_COST else None
