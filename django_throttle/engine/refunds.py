"""Giving back what a decision took: an attempt counted before it happened that turned out
fine (``refund()``, ``refund_key()``), the end of a concurrency lease, a delayed request
turned away past MAX_DELAYED. One store call (refund.lua), atomic for every algorithm, never
below empty. What the local fallback decided while the store was down is given back to it.
A refund that cannot reach the store is logged (once per outage) and dropped: what it would
have given back stays counted, which can only limit more, never less."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from redis.exceptions import TryAgainError

from ..choices import Algorithm
from ..conf import conf
from ..costs import valid_cost
from ..rules import clients_reset
from ..runtime import runtime
from ..store import Check, Result, get_store
from ..store.breaker import CLOSED, Breaker
from ..store.errors import STORE_ERRORS
from ..store.fallback import async_store, breaker, breaker_moved, by_node, local_fallback
from .state import take_back

logger = logging.getLogger("django_throttle")

_CONCURRENCY = str(Algorithm.CONCURRENCY)


class Refund(NamedTuple):
    """Checks to give back, as decided at ``at`` (0: no decision known), by the store or by
    the local fallback (``local``)."""

    at: int
    local: bool
    checks: list[Check]


def taken(results: Sequence[Result], cost: int | None = None) -> list[Refund]:
    """The refunds of these results (``cost`` replaces each result's cost)."""
    by_decision: dict[tuple[int, bool], list[Check]] = {}
    for result in results:
        check = Check(result.rule, result.identity, result.cost if cost is None else cost)
        by_decision.setdefault((result.at, result.local), []).append(check)
    return [Refund(at, local, checks) for (at, local), checks in by_decision.items()]


def refund_request(request: Any, scope: str, cost: int) -> int:
    """Give back ``cost`` of what the request's decisions took under ``scope`` (``refund()``);
    how many rules gave something back."""
    results = take_back(request, scope, valid_cost(cost))
    give_back(taken(results), announce=True)
    return len(results)


async def arefund_request(request: Any, scope: str, cost: int) -> int:
    # Finding the scope's rules may load them from the database: not on the event loop.
    results = await sync_to_async(take_back)(request, scope, valid_cost(cost))
    await agive_back(taken(results), announce=True)
    return len(results)


def give_back(refunds: Sequence[Refund], announce: bool = False) -> None:
    """Refund these checks where they were decided (``announce``: see _split)."""
    remote = _split(refunds, announce)
    if remote:
        with _guarded(breaker) as allowed:
            if allowed:
                store = get_store()
                for refund in remote:
                    # On a cluster, each master's part behind its own breaker.
                    for guard, checks in by_node(store, refund.checks):
                        if guard is None:
                            store.refund(checks, refund.at)
                            continue
                        with _guarded(guard) as node_allowed:
                            if node_allowed:
                                store.refund(checks, refund.at)


async def agive_back(refunds: Sequence[Refund], announce: bool = False) -> None:
    """give_back() on the event loop's own asyncio client."""
    if not conf.uses_redis:
        give_back(refunds, announce)
        return
    remote = _split(refunds, announce, on_loop=True)
    if remote:
        with _guarded(breaker) as allowed:
            if allowed:
                store = await async_store()
                for refund in remote:
                    for guard, checks in by_node(store, refund.checks):
                        if guard is None:
                            await store.refund(checks, refund.at)
                            continue
                        with _guarded(guard) as node_allowed:
                            if node_allowed:
                                await store.refund(checks, refund.at)


@contextmanager
def _guarded(breaker: Breaker) -> Iterator[bool]:
    """A breaker around the store calls of a refund (the store's, or on a cluster a master's):
    whether they may be made; a store error is reported to it and the refund dropped, never
    raised."""
    token = breaker.allow()
    if token is None:
        _dropped("the store is unavailable")
        yield False
        return
    try:
        yield True
    except TryAgainError as exc:
        _dropped(repr(exc))  # a slot migrating: this refund only, not an outage
        return
    except STORE_ERRORS as exc:
        breaker.failed(exc, token)
        breaker_moved()
        _dropped(repr(exc))
        return
    except BaseException:
        breaker.abandoned(token)
        raise
    if breaker.state != CLOSED:  # this call may be the probe that closes the breaker
        breaker.succeeded(token)
        breaker_moved()
    runtime().part(Dropping).said = False


def _split(refunds: Sequence[Refund], announce: bool, on_loop: bool = False) -> list[Refund]:
    """Give back the local fallback's refunds here and now; return the store's. With
    ``announce`` (a refund asked for: refund(), refund_key()), the clients given back to are
    forgotten by every process's block cache: they may fit again (from an event loop, which
    must not wait on a sync client, announced at the next refresh). What the engine gives back
    of a request it just admitted (a delay turned away, a lease's end) is not announced: it was
    taken moments ago, and a flood of turned-away requests would otherwise empty every
    process's block cache and add a store call each."""
    given = [
        check.rule.state_prefix + check.identity
        for refund in refunds
        for check in refund.checks
        # Only what a block cache can hold: a concurrency lease's end is never announced.
        if check.rule.enforcing and check.rule.algorithm != _CONCURRENCY
    ]
    if given and announce:
        clients_reset(given, announce=not on_loop)
    remote = []
    for refund in refunds:
        if refund.local:
            local_fallback.refund(refund.checks, refund.at)
        elif refund.checks:
            remote.append(refund)
    return remote


class Dropping:
    """Whether a refund failed and no store call has worked since: said once."""

    def __init__(self) -> None:
        self.said = False


def _dropped(why: str) -> None:
    dropping = runtime().part(Dropping)
    if dropping.said:
        return
    dropping.said = True
    logger.warning(
        "django_throttle: a refund could not be made (%s); what it would give back stays "
        "counted until its window or lease ends (said once until refunds work again)",
        why,
    )
