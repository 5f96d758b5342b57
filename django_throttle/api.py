"""Throttling from code: ``check()``, ``check_key()``, ``acquire()``, ``refund()``, ``reset()``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from asgiref.sync import sync_to_async

from .choices import Algorithm
from .decision import Decision
from .engine import aevaluate, evaluate, state_of
from .engine.flow import adecide, announce, decide
from .engine.keyed import key_arguments, key_checks, valid_cost
from .engine.refunds import Refund, agive_back, give_back, taken
from .rules import ScopeSpec, clients_reset, get_rules, scope_rules
from .store import Result, get_store

MIN_WAIT = 0.001  # seconds: acquire() never spins, whatever retry time a decision gives


def check(request: Any, scope: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """Count this request against the rules of ``scope`` (without consuming if ``dry_run``).

    As the middleware would: admin rules of the scope, else its code defaults; a raising key
    function applies the rule's fail mode; a rule that already counted this request (through
    the middleware, the decorator or an earlier check()) does not count it again."""
    return evaluate(request, [ScopeSpec(scope, None, 1)], cost=max(1, int(cost)), dry_run=dry_run)


async def acheck(request: Any, scope: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """``check()`` for async views, on the native asyncio Redis client."""
    return await aevaluate(
        request, [ScopeSpec(scope, None, 1)], cost=max(1, int(cost)), dry_run=dry_run
    )


def reset(scope: str, key: str) -> int:
    """Forget the state of client ``key`` (``"ip:203.0.113.7"``, ``"user:42"``, ``"global"``)
    under every rule of ``scope``; returns how many rules were reset. Every process forgets
    the rejections it remembers (BLOCK_CACHE) within RULES_REFRESH, without reloading rules."""
    store = get_store()
    rules = scope_rules(get_rules(), scope)
    for rule in rules:
        store.reset(rule, key)
    if rules:
        clients_reset([rule.state_prefix + key for rule in rules])
    return len(rules)


def check_key(scope: str, key: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """Count an event of client ``key`` (``"tenant:42"``, ``"partner:acme"``) against the rules
    of ``scope`` (admin rules, else code defaults), whatever each rule's key kind; no request
    needed. A rejection is recorded for the dashboard (no request_throttled signal)."""
    cost = key_arguments(scope, key, cost)
    checks, ruleset = key_checks(scope, key, cost)
    decision = decide(checks, dry_run, ruleset.blocked)
    if checks and not dry_run:
        announce(None, decision)
    return decision


async def acheck_key(scope: str, key: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """``check_key()`` for async code, on the native asyncio Redis client."""
    cost = key_arguments(scope, key, cost)
    # Loading changed rules may query the database, which the event loop must not.
    checks, ruleset = await sync_to_async(key_checks)(scope, key, cost)
    decision = await adecide(checks, dry_run, ruleset.blocked)
    if checks and not dry_run:
        announce(None, decision)
    return decision


def acquire(scope: str, key: str, cost: int = 1, timeout: float = 5.0) -> Decision:
    """``check_key()`` until admitted, sleeping until each rejection's retry time; gives up
    at once, with the last decision, when that time is past ``timeout`` seconds from now."""
    deadline = time.monotonic() + _timeout(timeout)
    while True:
        decision = check_key(scope, key, cost)
        wait = _wait(decision, deadline)
        if wait is None:
            return decision
        time.sleep(wait)


async def aacquire(scope: str, key: str, cost: int = 1, timeout: float = 5.0) -> Decision:
    """``acquire()`` for async code: the waits are ``asyncio.sleep``."""
    deadline = time.monotonic() + _timeout(timeout)
    while True:
        decision = await acheck_key(scope, key, cost)
        wait = _wait(decision, deadline)
        if wait is None:
            return decision
        await asyncio.sleep(wait)


def refund(request: Any, scope: str, cost: int = 1) -> int:
    """Give back ``cost`` of what ``check(request, scope)`` took: the attempt turned out fine (a
    login with the right password). Never more than it took, never below empty; what is left
    can be given back by another call. Returns how many rules gave something back."""
    results = _taken_from(request, scope, valid_cost(cost))
    give_back(taken(results), announce=True)
    return len(results)


async def arefund(request: Any, scope: str, cost: int = 1) -> int:
    """``refund()`` for async views."""
    results = await sync_to_async(_taken_from)(request, scope, valid_cost(cost))
    await agive_back(taken(results), announce=True)
    return len(results)


def refund_key(scope: str, key: str, cost: int = 1) -> int:
    """Give back ``cost`` to client ``key`` under the rules of ``scope`` (what ``check_key()``
    took; a concurrency slot taken with it), from its newest state: a window's current count,
    the log's newest entries; returns how many rules were refunded."""
    checks, _ = key_checks(scope, key, key_arguments(scope, key, cost))
    give_back([Refund(0, False, checks)] if checks else [], announce=True)
    return len(checks)


def _taken_from(request: Any, scope: str, cost: int) -> list[Result]:
    """``cost`` of what the request's admitted decisions committed under ``scope``'s rules
    (at most what each took), no longer the request's. A concurrency slot is not given back
    here: it ends with the response."""
    state = state_of(request)
    results = []
    for rule in scope_rules(get_rules(), scope):
        result = state.taken.get(rule.state_prefix)
        if result is None or result.rule.algorithm == Algorithm.CONCURRENCY:
            continue
        given = min(cost, result.cost)
        if given == result.cost:
            del state.taken[rule.state_prefix]
            state.counted.pop(rule.state_prefix, None)  # a later check() counts again
        else:
            state.taken[rule.state_prefix] = replace(result, cost=result.cost - given)
        results.append(replace(result, cost=given))
    return results


def _timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds, 0 or more, not {timeout!r}")
    return float(timeout)


def _wait(decision: Decision, deadline: float) -> float | None:
    """How long to sleep before asking again, or None: admitted, or not admissible in time."""
    if decision.allowed:
        return None
    wait = max(decision.retry_after, MIN_WAIT)
    if time.monotonic() + wait > deadline:
        return None
    return wait
