"""Giving back what a decision took: an attempt counted before it happened that turned out
fine (``refund()``, ``refund_key()``), the end of a concurrency lease, a delayed request
turned away past MAX_DELAYED. One store call (refund.lua), atomic for every algorithm, never
below empty. A refund that cannot reach the store is logged and dropped: what it would have
given back stays counted, which can only limit more, never less."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..conf import conf
from ..store import Check, Result, get_store
from ..store.errors import STORE_ERRORS
from ..store.fallback import async_store, breaker

logger = logging.getLogger("django_throttle")


def taken(results: Sequence[Result], cost: int | None = None) -> list[tuple[int, list[Check]]]:
    """The checks to give back, by decision time (``cost`` replaces each result's cost)."""
    by_time: dict[int, list[Check]] = {}
    for result in results:
        check = Check(result.rule, result.identity, result.cost if cost is None else cost)
        by_time.setdefault(result.at, []).append(check)
    return list(by_time.items())


def give_back(refunds: Sequence[tuple[int, Sequence[Check]]]) -> None:
    """Refund these checks, each group as decided at its time (0: none known)."""
    if not refunds:
        return
    token = breaker.allow()
    if token is None:
        _dropped("the store is unavailable")
        return
    try:
        store = get_store()
        for at, checks in refunds:
            store.refund(checks, at)
    except STORE_ERRORS as exc:
        breaker.failed(exc, token)
        _dropped(repr(exc))
        return
    except BaseException:
        breaker.abandoned(token)
        raise
    breaker.succeeded(token)


async def agive_back(refunds: Sequence[tuple[int, Sequence[Check]]]) -> None:
    """give_back() on the event loop's own asyncio client."""
    if not refunds:
        return
    if not conf.uses_redis:
        give_back(refunds)
        return
    token = breaker.allow()
    if token is None:
        _dropped("the store is unavailable")
        return
    try:
        store = await async_store()
        for at, checks in refunds:
            await store.refund(checks, at)
    except STORE_ERRORS as exc:
        breaker.failed(exc, token)
        _dropped(repr(exc))
        return
    except BaseException:
        breaker.abandoned(token)
        raise
    breaker.succeeded(token)


def _dropped(why: str) -> None:
    logger.warning(
        "django_throttle: a refund could not be made (%s); what it would give back stays "
        "counted until its window or lease ends",
        why,
    )
