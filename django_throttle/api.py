"""Throttling from code: ``check()``, ``check_key()``, ``acquire()``, ``refund()``, ``reset()``,
``block_key()``, ``charge_key()``."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from .costs import valid_cost
from .decision import Decision
from .engine import (
    ablock_key as engine_ablock_key,
)
from .engine import (
    acharge_key as engine_acharge_key,
)
from .engine import (
    adecide_key,
    aevaluate,
    arefund_request,
    decide_key,
    evaluate,
    refund_request,
    reset_key,
    settle_request,
)
from .engine import (
    block_key as engine_block_key,
)
from .engine import (
    charge_key as engine_charge_key,
)
from .engine import (
    refund_key as engine_refund_key,
)
from .rules import ScopeSpec

MIN_WAIT = 0.001  # seconds: acquire() never spins, whatever retry time a decision gives


def check(request: Any, scope: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """Count this request against the rules of ``scope`` (without consuming if ``dry_run``).

    As the middleware would: admin rules of the scope, else its code defaults; a raising key
    function applies the rule's fail mode; a rule that already counted this request (through
    the middleware, the decorator or an earlier check()) does not count it again."""
    return evaluate(request, _scope_specs(scope), cost=valid_cost(cost), dry_run=dry_run)


async def acheck(request: Any, scope: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """``check()`` for async views, on the native asyncio Redis client."""
    return await aevaluate(
        request, [ScopeSpec(scope, None, 1)], cost=valid_cost(cost), dry_run=dry_run
    )


def reset(scope: str, key: str) -> int:
    """Forget the state of client ``key`` (``"ip:203.0.113.7"``, ``"user:42"``, ``"global"``)
    under every rule of ``scope``; returns how many rules were reset. Every process forgets
    the rejections it remembers (BLOCK_CACHE) within RULES_REFRESH, without reloading rules."""
    return reset_key(scope, key)


def block_key(scope: str, key: str, seconds: int) -> int:
    """Reject client ``key`` under every rule of ``scope`` (admin rules, else code defaults) for
    ``seconds`` (a whole number, at most a year), in every process, whatever its state: its
    ``Retry-After`` counts down to the end. ``reset(scope, key)`` ends it. Returns how many
    rules; ValueError for bad arguments; the store's error is raised."""
    return engine_block_key(scope, key, seconds)


async def ablock_key(scope: str, key: str, seconds: int) -> int:
    """``block_key()`` for async code."""
    return await engine_ablock_key(scope, key, seconds)


def check_key(scope: str, key: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """Count an event of client ``key`` (``"tenant:42"``, ``"partner:acme"``) against the rules
    of ``scope`` (admin rules, else code defaults), whatever each rule's key kind; no request
    needed. A rejection is recorded for the dashboard (no request_throttled signal)."""
    return decide_key(scope, key, cost, dry_run)


async def acheck_key(scope: str, key: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """``check_key()`` for async code, on the native asyncio Redis client."""
    return await adecide_key(scope, key, cost, dry_run)


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
    return refund_request(request, scope, cost)


async def arefund(request: Any, scope: str, cost: int = 1) -> int:
    """``refund()`` for async views."""
    return await arefund_request(request, scope, cost)


def refund_key(scope: str, key: str, cost: int = 1) -> int:
    """Give back ``cost`` to client ``key`` under the rules of ``scope`` (what ``check_key()``
    took; a concurrency slot taken with it), from its newest state: a window's current count,
    the log's newest entries; returns how many rules were refunded."""
    return engine_refund_key(scope, key, cost)


def settle(request: Any, cost: int, rule: str | None = None) -> int:
    """The request's actual cost, known in the view (the tokens a completion used), under
    every rule that counted it or the one named ``rule``. When the response ends (a streaming
    response: once closed) the difference from what the request took before the view (its
    cost, 1 by default) is charged or given back, once, in one store call; nothing if they are
    equal, and nothing if the view raises. Returns how many rules it applies to (a concurrency
    rule never: its slots are requests in flight)."""
    return settle_request(request, cost, rule)


async def asettle(request: Any, cost: int, rule: str | None = None) -> int:
    """``settle()`` for async views."""
    return settle_request(request, cost, rule)


def charge_key(scope: str, key: str, cost: int) -> int:
    """Add ``cost`` to client ``key`` under the rules of ``scope``, without deciding: the cost of
    work known only once it is done (the tokens an LLM call used, in the Celery task that made
    it). It counts even past a limit (the work is done): later requests of the client wait
    until it has drained, and their ``Retry-After`` says how long. Returns how many rules were
    charged (a concurrency rule never is)."""
    return engine_charge_key(scope, key, cost)


async def acharge_key(scope: str, key: str, cost: int) -> int:
    """``charge_key()`` for async code."""
    return await engine_acharge_key(scope, key, cost)


@functools.lru_cache(maxsize=1024)
def _scope_specs(scope: str) -> list[ScopeSpec]:
    """check()'s specs of ``scope``, made once (never changed by the engine: a given cost
    leaves them out of the request's decided specs)."""
    return [ScopeSpec(scope, None, 1)]


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
