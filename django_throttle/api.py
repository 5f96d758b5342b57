"""``check()`` and ``reset()``: throttling from code, for events only the view knows about."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from .decision import Decision
from .keys import identity
from .rules import CompiledRule, get_rules
from .store import Check, get_store
from .throttling import adecide, announce, decide


def _checks(request: Any, scope: str, cost: int) -> list[Check]:
    memo: dict[str, str | None] = {}
    checks = []
    for rule in get_rules().for_scope(scope, request.method or "GET"):
        who = identity(rule, request, memo)
        if who is not None:
            checks.append(Check(rule, who, max(1, int(cost))))
    return checks


def check(request: Any, scope: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """Count this request against the rules of ``scope`` (without consuming if ``dry_run``)."""
    decision = decide(_checks(request, scope, cost), dry_run=dry_run)
    if not dry_run:
        announce(request, decision)
    return decision


async def acheck(request: Any, scope: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """``check()`` for async views, on the native asyncio Redis client."""
    # Refreshing the rules and working out keys may query the database: not in the event loop.
    checks = await sync_to_async(_checks)(request, scope, cost)
    decision = await adecide(checks, dry_run=dry_run)
    if not dry_run:
        announce(request, decision)
    return decision


def _rules_of(scope: str) -> list[CompiledRule]:
    from .decorators import code_defaults

    rules = [r for r in get_rules().rules if r.scope == scope]
    for spec in code_defaults.get(scope, ()):
        if spec.default is not None:
            rules.append(spec.default.compile())
    return rules


def reset(scope: str, key: str) -> int:
    """Forget the state of client ``key`` (``"ip:203.0.113.7"``, ``"user:42"``, ``"global"``)
    under every rule of ``scope``; returns how many rules were reset."""
    store = get_store()
    rules = _rules_of(scope)
    for rule in rules:
        store.reset(rule, key)
    return len(rules)
