"""``check()`` and ``reset()``: throttling from code, for events only the view knows about."""

from __future__ import annotations

from typing import Any

from .decision import Decision
from .engine import aevaluate, evaluate
from .rules import ScopeSpec, get_rules, scope_rules
from .store import get_store


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
    under every rule of ``scope``; returns how many rules were reset."""
    store = get_store()
    rules = scope_rules(get_rules(), scope)
    for rule in rules:
        store.reset(rule, key)
    return len(rules)
