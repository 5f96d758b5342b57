"""Giving back what a decision took: refunds asked for, leases ended, delays turned away
(refund.lua, atomic for every algorithm, never below empty)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async

from ..choices import ALGORITHMS_WITH_BURST, Algorithm
from ..conf import conf
from ..costs import valid_cost
from ..rules import clients_reset
from ..store import Check, Result, get_store
from .request_state import take_back

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
        check = Check(
            result.rule, result.identity, result.cost if cost is None else cost, until(result)
        )
        by_decision.setdefault((result.at, result.local), []).append(check)
    return [Refund(at, local, checks) for (at, local), checks in by_decision.items()]


def until(result: Result) -> int:
    """Where an admitted bucket decision's own interval ends (the arrival time it left), in
    the store's microseconds; 0 for other algorithms or without a decision time."""
    if result.rule.algorithm not in ALGORITHMS_WITH_BURST or not result.at:
        return 0
    # reset_at is at + reset_after in float seconds: their difference is exact to well under
    # a microsecond, where at * 1e-6 + ... rounded as a whole could be one off.
    return result.at + round((result.reset_at - result.at / 1_000_000) * 1_000_000)


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
    """Refund these checks where they were decided (``announce``: see _announce)."""
    _announce(refunds, announce)
    get_store().refund(refunds)


async def agive_back(refunds: Sequence[Refund], announce: bool = False) -> None:
    """give_back() on the event loop's own asyncio client."""
    if not conf.uses_redis:
        give_back(refunds, announce)
        return
    _announce(refunds, announce, on_loop=True)
    await get_store().arefund(refunds)


def _announce(refunds: Sequence[Refund], announce: bool, on_loop: bool = False) -> None:
    """With ``announce`` (a refund asked for: refund(), refund_key()), the clients given back
    to are forgotten by every process's block cache: they may fit again (from an event loop,
    which must not wait on a sync client, announced at the next refresh). What the engine gives
    back of a request it just admitted (a delay turned away, a lease's end) is not announced:
    it was taken moments ago, and a flood of turned-away requests would otherwise empty every
    process's block cache and add a store call each."""
    if not announce:
        return
    given = [
        check.rule.state_prefix + check.identity
        for refund in refunds
        for check in refund.checks
        # Only what a block cache can hold: a concurrency lease's end is never announced.
        if check.rule.enforcing and check.rule.algorithm != _CONCURRENCY
    ]
    if given:
        clients_reset(given, announce=not on_loop)
