"""Deciding a request: the rules that apply, their checks, one store call, the Decision.

Shared by the middleware, the ``@throttle`` decorator, ``check()`` and the DRF
throttle class, in a sync and an async flavour.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from asgiref.sync import sync_to_async

from . import recording
from .decision import Decision, from_results, unavailable
from .keys import identity
from .responses import rejected
from .rules import CompiledRule, RuleSet, get_rules
from .signals import request_throttled
from .store import Check, get_store
from .store.fallback import StoreUnavailable, adecide_guarded, decide_guarded, fails_closed

logger = logging.getLogger("django_throttle")

# Attributes on the request: the scope specs already decided (so nothing is counted
# twice), and every decision made for it (the headers show the most constrained).
SPECS_ATTR = "_throttle_specs"  # on a decorated view: its scope specs, outermost first
SEEN_ATTR = "_throttle_seen"  # set by the middleware, which then writes the headers itself
DONE_ATTR = "_throttle_done"
DECISIONS_ATTR = "_throttle_decisions"


class ScopeSpec(Protocol):
    """What gather() needs of a ``@throttle`` scope (see decorators.ScopeSpec)."""

    def rules(self, ruleset: RuleSet, method: str) -> list[CompiledRule]: ...

    def cost_of(self, request: Any) -> int: ...


def gather(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> tuple[list[Check], Decision | None]:
    """The checks for this request; or a Decision already, if a rule cannot be evaluated and
    fails closed (a key function that raises is treated like an unavailable store)."""
    ruleset = get_rules()
    method = request.method or "GET"
    chosen: dict[int, tuple[CompiledRule, int]] = {}
    if paths:
        for rule in ruleset.for_path(request.path_info, method):
            chosen[id(rule)] = (rule, 1)
    if url_name:
        for rule in ruleset.for_scope(url_name, method):
            chosen.setdefault(id(rule), (rule, 1))
    for spec in specs:
        rules = spec.rules(ruleset, method)
        if rules:
            cost = spec.cost_of(request)
            for rule in rules:
                previous = chosen.get(id(rule))
                chosen[id(rule)] = (rule, max(cost, previous[1] if previous else 0))
    checks = []
    memo: dict[str, str | None] = {}
    for rule, cost in chosen.values():
        try:
            who = identity(rule, request, memo)
        except Exception:
            _log_key_error(rule)
            if fails_closed(rule):
                return [], unavailable(rule, rule.period)
            continue
        if who is not None:
            checks.append(Check(rule, who, cost))
    return checks, None


async def agather(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> tuple[list[Check], Decision | None]:
    """gather() for async callers: refreshing the rules and working out keys (request.user, a
    key function) may query the database, which Django forbids inside the event loop."""
    return await sync_to_async(gather)(request, specs, paths=paths, url_name=url_name)


KEY_ERROR_LOG_EVERY = 60.0  # seconds: a broken key function is logged, not once per request
_key_errors_logged: dict[int, float] = {}


def _log_key_error(rule: CompiledRule) -> None:
    now = time.monotonic()
    if now - _key_errors_logged.get(rule.id, -KEY_ERROR_LOG_EVERY) >= KEY_ERROR_LOG_EVERY:
        _key_errors_logged[rule.id] = now
        logger.exception(
            "django_throttle: the key of rule %r could not be computed; its fail mode applies "
            "(logged at most once a minute)",
            rule.name,
        )


def _summarize(checks: Sequence[Check], outcome: Any) -> Decision:
    if isinstance(outcome, StoreUnavailable):
        closed = [c.rule for c in checks if fails_closed(c.rule)]
        if closed:
            return unavailable(closed[0], outcome.retry_after)
        if outcome.results is None:
            return Decision(allowed=True)  # a fresh one: callers may keep it
        outcome = outcome.results
    return from_results(outcome)


def decide(checks: Sequence[Check], dry_run: bool = False) -> Decision:
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    return _summarize(checks, decide_guarded(get_store, checks, dry_run))


async def adecide(checks: Sequence[Check], dry_run: bool = False) -> Decision:
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    return _summarize(checks, await adecide_guarded(checks, dry_run))


def record(request: Any, decision: Decision) -> None:
    decisions = getattr(request, DECISIONS_ATTR, None)
    if decisions is None:
        decisions = []
        setattr(request, DECISIONS_ATTR, decisions)
    decisions.append(decision)
    announce(request, decision)


def announce(request: Any, decision: Decision) -> None:
    """Send request_throttled for a rejection and for each shadow rule's would-be rejection."""
    recording.note(request, decision)  # counts rejections for the dashboard; free when admitted

    if not decision.allowed and decision.rule is not None:
        request_throttled.send(
            Decision, request=request, rule=decision.rule, decision=decision, shadow=False
        )
    for result in decision.results:
        if not result.allowed and result.rule.action == "log":
            request_throttled.send(
                Decision, request=request, rule=result.rule.name, decision=decision, shadow=True
            )


def for_headers(request: Any) -> Decision | None:
    """The decision whose figures the response shows: a rejection, else the most constrained."""
    decisions = [d for d in getattr(request, DECISIONS_ATTR, ()) if d.rule is not None]
    if not decisions:
        return None
    rejected = [d for d in decisions if not d.allowed]
    if rejected:
        return rejected[0]
    return min(decisions, key=lambda d: (d.remaining, -(d.reset_at or 0)))


def pending_specs(request: Any, specs: Sequence[ScopeSpec]) -> list[ScopeSpec]:
    """The specs not decided yet for this request, now marked as decided."""
    done = getattr(request, DONE_ATTR, None)
    if done is None:
        done = set()
        setattr(request, DONE_ATTR, done)
    pending = [s for s in specs if id(s) not in done]
    done.update(id(s) for s in pending)
    return pending


def enforce(request: Any, gathered: tuple[list[Check], Decision | None]) -> Any:
    """Decide the gathered checks: the rejection response, or None once the request may go
    on (after holding it, for a delay rule)."""
    checks, early = gathered
    decision = early or decide(checks)
    record(request, decision)
    if not decision.allowed:
        return rejected(request, decision)
    wait = delay_of(decision)
    if wait:
        time.sleep(wait)
    return None


async def aenforce(request: Any, gathered: tuple[list[Check], Decision | None]) -> Any:
    """enforce() for async callers: the store call and the wait never block the loop."""
    checks, early = gathered
    decision = early or await adecide(checks)
    record(request, decision)
    if not decision.allowed:
        return rejected(request, decision)
    wait = delay_of(decision)
    if wait:
        await asyncio.sleep(wait)
    return None


def delay_of(decision: Decision) -> float:
    """How long to hold an admitted request; never longer than its rule's queue allows."""
    if decision.delay <= 0:
        return 0.0
    longest = max(
        (r.rule.burst * r.rule.period / r.rule.limit for r in decision.results), default=0.0
    )
    return min(decision.delay, longest)
