"""Counting only some outcomes (``count_statuses``): what a request took under a rule that does
not count its response's status is given back once the status is known.

The request is counted before its view like any other (parallel attempts cannot all pass);
only the give-back waits for the response."""

from __future__ import annotations

from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404
from django.http.multipartparser import MultiPartParserError

from ..compiled import outcomes_rule
from ..rules import rule_cache
from ..store import Check, Result, get_store
from .refunds import agive_back, give_back, taken
from .request_state import RequestState


def failed_status(error: BaseException) -> int:
    """The status of a view that raised, as Django's handler answers it (what the middleware
    sees of the same view): 500, or 404, 403, 400 for the exceptions Django maps."""
    if isinstance(error, Http404):
        return 404
    if isinstance(error, PermissionDenied):
        return 403
    if isinstance(error, BadRequest | SuspiciousOperation | MultiPartParserError):
        return 400
    return 500


def count_outcome(state: RequestState, status: int) -> None:
    """Give back what the request took under the rules that do not count ``status``; count it
    among the outcomes of the rules that do and start blocks (see _outcomes)."""
    given = _uncounted(state, status)
    if given:
        give_back(taken(given), announce=_announced(given))
    settled = _counted(state)
    if settled:
        get_store().decide(_outcomes(settled))


async def acount_outcome(state: RequestState, status: int) -> None:
    given = _uncounted(state, status)
    if given:
        await agive_back(taken(given), announce=_announced(given))
    settled = _counted(state)
    if settled:
        await get_store().adecide(_outcomes(settled))


def _counted(state: RequestState) -> list[Result]:
    """The request's counted outcomes under rules that start their block from them
    (``defers_block``), no longer the request's (counted once, however often the response is
    seen). Called after _uncounted(): what is left of a rule with count_statuses counts."""
    took = state.taken
    if not took:
        return []
    settled = [result for result in took.values() if result.rule.defers_block]
    for result in settled:
        del took[result.rule.state_prefix]
    return settled


def _outcomes(settled: list[Result]) -> list[Check]:
    """The checks that count these outcomes (one store call, after the give-backs): each
    against its rule's outcomes state, one short of the rule, whose rejection (the limit
    filled by counted outcomes alone, not by shares of requests still in flight) starts the
    rule's block. A rejected request took nothing and counts nothing."""
    return [Check(outcomes_rule(r.rule), r.identity, r.cost) for r in settled]


def _uncounted(state: RequestState, status: int) -> list[Result]:
    """What the request's admitted decisions took under rules that do not count ``status``, no
    longer the request's (given back once, however often the response is seen)."""
    took = state.taken
    if not took:
        return []
    given = [
        result
        for result in took.values()
        if result.rule.count_statuses is not None and status not in result.rule.count_statuses
    ]
    for result in given:
        del took[result.rule.state_prefix]
    return given


def _announced(given: list[Result]) -> bool:
    """Whether giving these back is announced, as refund() is: every process's block cache
    forgets the clients (refunds._announce).

    Only when a block cache may remember one of them. A rejection is remembered only of a
    client with nothing left (block_cache.remember); while these takes stood, one could have
    been rejected because of them only if a take left nothing (``remaining`` 0), and this
    process knows whether it remembers the client. Otherwise not: a "5xx" rule over "*" gives
    back nearly every request, and announcing each would cost a store call per request and
    empty every process's block cache at every refresh."""
    if any(result.remaining == 0 for result in given):
        return True
    rules = rule_cache().current()
    blocked = rules.blocked if rules is not None else None
    if not blocked:
        return False
    return any(r.rule.state_prefix + r.identity in blocked for r in given)
