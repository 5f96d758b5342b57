"""Deciding a request, one sync and one async flow: gather what applies, decide, keep it on
the request and announce it; enforcing also answers a rejection and holds a delay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse

from ..choices import Algorithm
from ..compiled import CompiledRule
from ..decision import Decision, from_results
from ..responses import rejected
from ..rules import ScopeSpec
from ..runtime import current
from .announcing import announce
from .deciding import adecide, decide
from .delays import Delays, Held, delay_of, turned_away
from .gathering import Gathered, NeedsThread, gather
from .refunds import agive_back, give_back, taken
from .request_state import forget_taken, state_of, view_specs

_CONCURRENCY = str(Algorithm.CONCURRENCY)


def evaluate(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
    cost: int | None = None,
    dry_run: bool = False,
) -> Decision:
    """Decide a request against what applies to it (sync)."""
    gathered = gather(request, specs, paths=paths, url_name=url_name, cost=cost, dry_run=dry_run)
    decision = gathered.early or decide(gathered.checks, dry_run, gathered.blocked)
    return settle(request, gathered, decision, dry_run)


async def aevaluate(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
    cost: int | None = None,
    dry_run: bool = False,
) -> Decision:
    """evaluate() for async callers: the store call never blocks the loop. Refreshing the
    rules and working out some keys (request.user, a user's groups, a key function) may query
    the database, which Django forbids inside the event loop: then gathering runs in a
    thread; otherwise (fresh rules; ip, header, param, global keys; a user already loaded)
    on the loop, without that thread hop."""
    try:
        gathered = gather(
            request, specs, paths=paths, url_name=url_name, cost=cost, dry_run=dry_run, on_loop=True
        )
    except NeedsThread:
        gathered = await sync_to_async(gather)(
            request, specs, paths=paths, url_name=url_name, cost=cost, dry_run=dry_run
        )
    decision = gathered.early or await adecide(gathered.checks, dry_run, gathered.blocked)
    return settle(request, gathered, decision, dry_run)


def preview(
    request: Any, view_func: Any = None, scopes: Iterable[str] = ()
) -> tuple[list[CompiledRule], Decision]:
    """What ThrottleMiddleware, and the view's throttles deciding ``scopes``, would meet for
    this request: the rules that apply to its client (overrides and exemptions applied) and
    their state, in one store call that consumes nothing; kept on no request, announced to
    no one."""
    specs = view_specs(view_func) if view_func is not None else []
    specs = [*specs, *(ScopeSpec(scope, None, 1) for scope in scopes)]
    gathered = gather(request, specs, paths=True, url_name=_url_name(request), dry_run=True)
    decision = gathered.early or decide(gathered.checks, True, gathered.blocked)
    return [check.rule for check in gathered.checks], decision


def settle(request: Any, gathered: Gathered, decision: Decision, dry_run: bool = False) -> Decision:
    """Keep what was decided on the request, announce it, and return the decision over every
    rule that applied (the ones decided earlier included)."""
    if dry_run:
        return decision
    state = gathered.state or state_of(request)
    if gathered.checks or decision.unavailable:
        for result in decision.results:
            state.counted[result.rule.state_prefix] = result
            if decision.allowed and result.allowed:
                state.taken[result.rule.state_prefix] = result
                if result.rule.algorithm == _CONCURRENCY:
                    state.leases.append(result)
        state.decisions.append(decision)
        announce(request, decision)
    if gathered.earlier and not decision.unavailable:
        return from_results([*gathered.earlier, *decision.results])
    return decision


def enforce(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> HttpResponse | None:
    """The rejection response, or None once the request may go on (after holding it, for a
    delay rule)."""
    # A wait in a thread of a WSGI server holds one of its few threads; under ASGI (a sync
    # view's thread is the request's own) it holds nothing shared.
    in_thread = not isinstance(request, ASGIRequest)
    gathered = gather(request, specs, paths=paths, url_name=url_name)
    decision = gathered.early
    delays = current.runtime.part(Delays)
    if decision is None and in_thread and delays.clients:
        decision = delays.turned_away_before(gathered.checks)
    if decision is None:
        decision = decide(gathered.checks, False, gathered.blocked)
    decision = settle(request, gathered, decision)
    if not decision.allowed:
        return rejected(request, decision)
    wait = delay_of(decision)
    if wait:
        held = Held(decision, wait, in_thread)
        if not delays.enter(held):
            give_back(taken(forget_taken(request, decision)))
            turned = turned_away(decision, wait)
            announce(request, turned)
            return rejected(request, turned)
        try:
            time.sleep(wait)
        finally:
            delays.leave(held)
    return None


async def aenforce(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> HttpResponse | None:
    """enforce() for async callers: the store call and the wait never block the loop."""
    decision = await aadmit(request, specs, paths=paths, url_name=url_name)
    return None if decision.allowed else rejected(request, decision)


async def aadmit(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> Decision:
    """aenforce() without the response (a WebSocket handshake answers its own way): the
    rejection, or the admission once a delay rule has held the request."""
    decision = await aevaluate(request, specs, paths=paths, url_name=url_name)
    if not decision.allowed:
        return decision
    wait = delay_of(decision)
    if wait:
        delays = current.runtime.part(Delays)
        held = Held(decision, wait, in_thread=False)  # an await holds no thread
        if not delays.enter(held):
            await agive_back(taken(forget_taken(request, decision)))
            turned = turned_away(decision, wait)
            announce(request, turned)
            return turned
        try:
            await asyncio.sleep(wait)
        finally:
            delays.leave(held)
    return decision


def enforce_view(request: Any, view_func: Any) -> HttpResponse | None:
    """ThrottleMiddleware's process_view: the path rules, the URL name's and the view's
    @throttle scopes, in one decision."""
    state_of(request).paths_decided = True
    return enforce(request, view_specs(view_func), paths=True, url_name=_url_name(request))


async def aenforce_view(request: Any, view_func: Any) -> HttpResponse | None:
    state_of(request).paths_decided = True
    return await aenforce(request, view_specs(view_func), paths=True, url_name=_url_name(request))


def enforce_unrouted(request: Any) -> HttpResponse | None:
    """The path rules of a request that reached no view (a 404, a redirect), on its way out;
    None if they were decided already."""
    state = state_of(request)
    if state.paths_decided:
        return None
    state.paths_decided = True
    return enforce(request, paths=True)


async def aenforce_unrouted(request: Any) -> HttpResponse | None:
    state = state_of(request)
    if state.paths_decided:
        return None
    state.paths_decided = True
    return await aenforce(request, paths=True)


def _url_name(request: Any) -> str | None:
    match = getattr(request, "resolver_match", None)
    return match.view_name if match is not None else None
