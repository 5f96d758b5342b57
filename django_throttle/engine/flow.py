"""Deciding a request: what applies, its checks, one store call, the Decision, and what
follows (signals, the rejection log, the 429). One sync and one async flow, shared by the
middleware, the decorator, ``check()`` and the DRF throttle."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import replace
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse, HttpResponseBase

from .. import metrics, recording
from ..audience import counts
from ..choices import Algorithm
from ..compiled import ON_LOOP, WITH_USER, CompiledRule
from ..conf import conf
from ..decision import Decision, from_results, unavailable
from ..keys import identity
from ..responses import RETRY_AFTER, X_LIMIT, add_headers, rejected, retry_after_seconds
from ..rules import ScopeSpec, get_rules, request_rules, rule_cache
from ..signals import request_throttled
from ..store import Check, Result, get_store
from ..store.fallback import StoreUnavailable, adecide_guarded, decide_guarded
from .blocks import Blocked, never_admitted, remember, remembered
from .giveback import agive_back, give_back, taken
from .state import state_of

logger = logging.getLogger("django_throttle")

_CONCURRENCY = str(Algorithm.CONCURRENCY)


class Gathered:
    """The checks still to decide for a request, the results of rules that already counted
    it, or a decision already (a rule whose key cannot be computed and that fails closed);
    and the block cache of the rules they come from."""

    __slots__ = ("blocked", "checks", "earlier", "early")

    def __init__(
        self,
        checks: list[Check],
        earlier: list[Result],
        early: Decision | None = None,
        blocked: Blocked | None = None,
    ) -> None:
        self.checks = checks
        self.earlier = earlier
        self.early = early
        self.blocked = blocked


def gather(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
    cost: int | None = None,
    dry_run: bool = False,
    on_loop: bool = False,
) -> Gathered:
    """What applies to this request and has not counted it yet. ``cost`` replaces each
    rule's cost (``check()``); a dry run looks at every rule, counted or not. ``on_loop``:
    called on an event loop, where the database must not be used; NeedsThread is raised,
    before anything about the request is changed, if the rules must be refreshed or a rule
    needs the user (not loaded yet), its groups or a key function."""
    state = state_of(request)
    counted = state.counted
    decided_now: list[ScopeSpec] = []
    if specs and cost is None and not dry_run:
        decided = state.decided_specs
        specs = decided_now = [spec for spec in specs if id(spec) not in decided]
        if not specs and not paths and not url_name:
            return Gathered([], [])  # a decorator whose scopes the middleware decided
    checks: list[Check] = []
    earlier: list[Result] = []
    memo: dict[str, str | None] = {}
    if on_loop:
        fresh = rule_cache().fresh()
        if fresh is None:
            raise NeedsThread  # a refresh may read the database
        ruleset = fresh
        user_loaded = hasattr(request, "_cached_user")  # AuthenticationMiddleware's cache
    else:
        ruleset = get_rules()
    # Without EXEMPT_NETWORKS, a rule that counts everyone counts this request: no call to
    # counts() for it.
    anyone = not conf.EXEMPT_NETWORKS
    for rule, rule_cost in request_rules(ruleset, request, specs, paths=paths, url_name=url_name):
        if on_loop and rule.on_loop != ON_LOOP and not (rule.on_loop == WITH_USER and user_loaded):
            raise NeedsThread
        done = counted.get(rule.state_prefix)
        if done is not None and not dry_run:
            earlier.append(done)
            continue
        try:
            if not (anyone and rule.everyone) and not counts(rule, request, memo):
                continue  # outside the rule's audience, or exempt
            who = identity(rule, request, memo)
        except Exception:
            _log_key_error(rule)
            if rule.fails_closed(conf.FAIL_OPEN):
                return Gathered([], [], unavailable(rule, rule.period))
            continue
        if who is None:
            continue
        overrides = rule.overrides
        if overrides is not None and who in overrides:
            own = overrides[who]
            if own is None:
                continue  # this client is exempt from the rule
            rule = own  # this client's own limit, on the same state
        checks.append(Check(rule, who, rule_cost if cost is None else cost))
    state.decided_specs.update(id(spec) for spec in decided_now)
    return Gathered(checks, earlier, blocked=ruleset.blocked)


class NeedsThread(Exception):
    """Gathering must run in a thread: it may use the database."""


KEY_ERROR_LOG_EVERY = 60.0  # seconds: a broken key function is logged, not once per request
_key_errors_logged: dict[str, float] = {}


def _log_key_error(rule: CompiledRule) -> None:
    now = time.monotonic()
    if now - _key_errors_logged.get(rule.state_prefix, -KEY_ERROR_LOG_EVERY) >= KEY_ERROR_LOG_EVERY:
        _key_errors_logged[rule.state_prefix] = now
        logger.exception(
            "django_throttle: the key of rule %r could not be computed; its fail mode applies "
            "(logged at most once a minute)",
            rule.name,
        )


def _summarize(outcome: list[Result] | StoreUnavailable) -> Decision:
    if isinstance(outcome, StoreUnavailable):
        for check in outcome.checks:  # those the store could not decide (a cluster: some)
            if check.rule.fails_closed(conf.FAIL_OPEN):
                return unavailable(check.rule, outcome.retry_after, check.identity)
        if outcome.results is None:
            return Decision(allowed=True)  # a fresh one: callers may keep it
        return from_results(outcome.results)
    return from_results(outcome)


def decide(
    checks: Sequence[Check], dry_run: bool = False, blocked: Blocked | None = None
) -> Decision:
    """One store call for these checks (none if there are none, or if the block cache knows
    one of their clients is rejected)."""
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    known = _known(checks, dry_run, blocked)
    if known is not None:
        return known
    return _learn(checks, decide_guarded(get_store, checks, dry_run), dry_run, blocked)


async def adecide(
    checks: Sequence[Check], dry_run: bool = False, blocked: Blocked | None = None
) -> Decision:
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    known = _known(checks, dry_run, blocked)
    if known is not None:
        return known
    return _learn(checks, await adecide_guarded(get_store, checks, dry_run), dry_run, blocked)


def _known(checks: Sequence[Check], dry_run: bool, blocked: Blocked | None) -> Decision | None:
    """A rejection known without the store, or None: a cost no enforcing rule's window or
    bucket can ever hold (so no single request makes Redis work for it), or what the block
    cache holds for one of these clients."""
    if dry_run:
        return None  # a dry run reports the state as it is
    for check in checks:
        rule = check.rule
        if check.cost > rule.burst and rule.enforcing:  # burst: a bucket's size, else the limit
            return from_results([never_admitted(check)])
    if not blocked:
        return None
    known = remembered(blocked, checks)
    if known is not None and metrics.switch.on:
        metrics.block_cache_hit(known.rule or "")
    return known


def _learn(
    checks: Sequence[Check],
    outcome: list[Result] | StoreUnavailable,
    dry_run: bool,
    blocked: Blocked | None,
) -> Decision:
    """The decision of a store call, after the block cache kept its rejections."""
    if blocked is not None and not dry_run and not isinstance(outcome, StoreUnavailable):
        remember(blocked, checks, outcome)
    return _summarize(outcome)


def settle(request: Any, gathered: Gathered, decision: Decision, dry_run: bool = False) -> Decision:
    """Keep what was decided on the request, announce it, and return the decision over every
    rule that applied (the ones decided earlier included)."""
    if dry_run:
        return decision
    state = state_of(request)
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


def announce(request: Any | None, decision: Decision) -> None:
    """Count rejections for the dashboard and every decision in the metrics, and send
    request_throttled for a rejection and for each would-be rejection of a log-only rule (not
    for a key decided without a request: ``request`` None)."""
    recording.note(decision)  # free when admitted
    if metrics.switch.on:
        metrics.decided(decision)
    if request is None:
        return
    if not decision.allowed and decision.rule is not None:
        request_throttled.send(
            Decision, request=request, rule=decision.rule, decision=decision, shadow=False
        )
    for result in decision.results:
        if not result.allowed and not result.rule.enforcing:
            request_throttled.send(
                Decision, request=request, rule=result.rule.name, decision=decision, shadow=True
            )


# -- the two flows ------------------------------------------------------------------------


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


def enforce(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> HttpResponse | None:
    """The rejection response, or None once the request may go on (after holding it, for a
    delay rule)."""
    decision = evaluate(request, specs, paths=paths, url_name=url_name)
    if not decision.allowed:
        return rejected(request, decision)
    wait = delay_of(decision)
    if wait:
        if not delays.enter():
            give_back(taken(forget_taken(request, decision)))
            turned = turned_away(decision, wait)
            announce(request, turned)
            return rejected(request, turned)
        try:
            time.sleep(wait)
        finally:
            delays.leave()
    return None


async def aenforce(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> HttpResponse | None:
    """enforce() for async callers: the store call and the wait never block the loop."""
    decision = await aevaluate(request, specs, paths=paths, url_name=url_name)
    if not decision.allowed:
        return rejected(request, decision)
    wait = delay_of(decision)
    if wait:
        if not delays.enter():
            await agive_back(taken(forget_taken(request, decision)))
            turned = turned_away(decision, wait)
            announce(request, turned)
            return rejected(request, turned)
        try:
            await asyncio.sleep(wait)
        finally:
            delays.leave()
    return None


def delay_of(decision: Decision) -> float:
    """How long to hold an admitted request; never longer than its rule's queue allows."""
    if decision.delay <= 0:
        return 0.0
    longest = max(
        (r.rule.burst * r.rule.period / r.rule.limit for r in decision.results), default=0.0
    )
    return min(decision.delay, longest)


class Delays:
    """How many requests this process holds for delay rules now (MAX_DELAYED caps it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0

    def enter(self) -> bool:
        with self._lock:
            if self.held >= conf.MAX_DELAYED:
                return False
            self.held += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.held -= 1


delays = Delays()


def forget_taken(request: Any, decision: Decision) -> list[Result]:
    """What an admitted decision took, no longer the request's (it is being given back)."""
    state = state_of(request)
    given = [r for r in decision.results if state.taken.pop(r.rule.state_prefix, None) is r]
    state.leases = [lease for lease in state.leases if lease not in given]
    return given


def turned_away(decision: Decision, wait: float) -> Decision:
    """The 429 of a request admitted with a delay while MAX_DELAYED are held already (what it
    took was given back): retry once its turn would have come."""
    remaining = decision.remaining
    for result in decision.results:
        if result.rule.name == decision.rule and remaining is not None:
            remaining += result.cost  # given back
            break
    # The delay rule rejects it now: recorded, counted and signalled as a rejection.
    results = tuple(
        replace(r, allowed=False, retry_after=wait) if r.rule.name == decision.rule else r
        for r in decision.results
    )
    return replace(
        decision,
        allowed=False,
        remaining=remaining,
        retry_after=wait,
        delay=0.0,
        results=results,
    )


def release_leases(request: Any) -> None:
    """End the request's concurrency leases (the response is finished, or never will be)."""
    state = state_of(request)
    leases, state.leases = state.leases, []
    give_back(taken(leases))


async def arelease_leases(request: Any) -> None:
    state = state_of(request)
    leases, state.leases = state.leases, []
    await agive_back(taken(leases))


# The requests of the current handler call that hold leases. request_started puts a new
# list in the handler's context (the request's thread under WSGI; under ASGI the handler's
# task, whose request task shares the list), request_finished ends what is in it.
_holding: ContextVar[list[Any] | None] = ContextVar("django_throttle_holding", default=None)


def request_started(**kwargs: Any) -> None:
    _holding.set([])


def request_finished(**kwargs: Any) -> None:
    """The final response is closed: end the leases of the request, also when an outer
    middleware answered with a response of its own (a 304, a redirect), which the server
    closes instead of ours."""
    holding = _holding.get()
    if holding:
        requests, holding[:] = list(holding), []
        for request in requests:
            release_leases(request)


def finish(request: Any, response: Any) -> Any:
    """Write the rate-limit headers of the request's decisions on a response that has none:
    our own 429s have them; a view's response, or a 429 of DRF's, does not. Concurrency
    leases end when the response is closed (a streaming one: once streamed)."""
    state = state_of(request)
    if state.leases and not state.release_armed and isinstance(response, HttpResponseBase):
        state.release_armed = True
        # Django calls these from response.close(), which every server calls when the
        # response is done (WSGI's close(), and ASGIHandler after the last body chunk).
        response._resource_closers.append(partial(release_leases, request))  # type: ignore[attr-defined]
        holding = _holding.get()
        if holding is not None:
            holding.append(request)
    decision = state.for_headers()
    if (
        decision is not None
        and (conf.HEADERS or not decision.allowed)
        and isinstance(response, HttpResponseBase)
        and not response.has_header(X_LIMIT)
    ):
        add_headers(response, decision)
        if response.status_code in (429, 503) and not response.has_header(RETRY_AFTER):
            response[RETRY_AFTER] = str(retry_after_seconds(decision))
    return response
