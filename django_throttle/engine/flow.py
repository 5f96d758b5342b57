"""Deciding a request: what applies, its checks, one store call, the Decision, and what
follows (signals, the rejection log, the 429). One sync and one async flow, shared by the
middleware, the decorator, ``check()`` and the DRF throttle."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import replace
from functools import partial
from typing import Any

from asgiref.sync import SyncToAsync, sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, HttpResponseBase

from .. import metrics, recording
from ..audience import counts
from ..choices import Action, Algorithm
from ..compiled import ON_LOOP, WITH_USER, CompiledRule
from ..conf import conf
from ..decision import Decision, from_results, unavailable
from ..keys import identity
from ..responses import RETRY_AFTER, X_LIMIT, add_headers, rejected, retry_after_seconds
from ..rules import ScopeSpec, get_rules, request_rules, rule_cache
from ..signals import request_throttled
from ..store import Check, Result, StoreUnavailable, get_store
from .block_cache import Blocked, never_admitted, remember, remembered
from .refunds import agive_back, give_back, taken
from .state import state_of

logger = logging.getLogger("django_throttle")

_CONCURRENCY = str(Algorithm.CONCURRENCY)
_DELAY = str(Action.DELAY)


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
    return _learn(checks, get_store().decide(checks, dry_run), dry_run, blocked)


async def adecide(
    checks: Sequence[Check], dry_run: bool = False, blocked: Blocked | None = None
) -> Decision:
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    known = _known(checks, dry_run, blocked)
    if known is not None:
        return known
    return _learn(checks, await get_store().adecide(checks, dry_run), dry_run, blocked)


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
    # A wait in a thread of a WSGI server holds one of its few threads; under ASGI (a sync
    # view's thread is the request's own) it holds nothing shared.
    in_thread = not isinstance(request, ASGIRequest)
    gathered = gather(request, specs, paths=paths, url_name=url_name)
    decision = gathered.early
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
    decision = await aevaluate(request, specs, paths=paths, url_name=url_name)
    if not decision.allowed:
        return rejected(request, decision)
    wait = delay_of(decision)
    if wait:
        held = Held(decision, wait, in_thread=False)  # an await holds no thread
        if not delays.enter(held):
            await agive_back(taken(forget_taken(request, decision)))
            turned = turned_away(decision, wait)
            announce(request, turned)
            return rejected(request, turned)
        try:
            await asyncio.sleep(wait)
        finally:
            delays.leave(held)
    return None


def delay_of(decision: Decision) -> float:
    """How long to hold an admitted request; never longer than its rule's queue allows."""
    if decision.delay <= 0:
        return 0.0
    longest = max(
        (r.rule.burst * r.rule.period / r.rule.limit for r in decision.results), default=0.0
    )
    return min(decision.delay, longest)


AUTO_MAX_DELAYED = 10  # MAX_DELAYED "auto": the most held at once, in threads or not


class Serving:
    """The threads serving a request now (ThrottleMiddleware's sync path, or a sync view under
    @throttle), and the most seen at once: the server has at least that many threads."""

    def __init__(self) -> None:
        # A set of thread ids, changed without a lock (one C call each, atomic): a thread
        # serves one request at a time, and a counter would need a lock on every request.
        self.busy: set[int] = set()
        self.most = 0

    def enter(self) -> bool:
        """Count this thread; False if it is counted already (the middleware, then the view)."""
        busy = self.busy
        ident = threading.get_ident()
        if ident in busy:
            return False
        busy.add(ident)
        if len(busy) > self.most:
            self.most = len(busy)
        return True

    def leave(self) -> None:
        self.busy.discard(threading.get_ident())


serving = Serving()


class Held:
    """A request held for a delay rule: how long, whether it holds a server's thread, and the
    result of each client (rule, key) whose turn it waits for."""

    __slots__ = ("clients", "counted", "in_thread", "wait")

    def __init__(self, decision: Decision, wait: float, in_thread: bool) -> None:
        self.wait = wait
        self.in_thread = in_thread
        self.counted = False  # among its clients' held requests (MAX_DELAYED_PER_CLIENT)
        self.clients = [
            ((r.rule.state_prefix, r.identity), r)
            for r in decision.results
            if r.delay > 0 and r.rule.action == _DELAY
        ]


class Delays:
    """The requests this process holds for delay rules now. MAX_DELAYED caps them all; its
    default, "auto", holds at most AUTO_MAX_DELAYED, and in threads at most half the threads
    seen serving at once (at least one), so waits never take most of a WSGI server's
    threads. In threads, MAX_DELAYED_PER_CLIENT caps those of one client of a rule: one
    client flooding a delay rule holds one thread, and its other requests get 429 at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0
        self.in_threads = 0
        # Per client of a rule held in threads: how many, and when the last one entered
        # (monotonic), wakes, and its result.
        self.clients: dict[tuple[str, str], int] = {}
        self.waking: dict[tuple[str, str], tuple[float, float, Result]] = {}

    def enter(self, held: Held) -> bool:
        cap = conf.MAX_DELAYED
        per_client = conf.MAX_DELAYED_PER_CLIENT
        with self._lock:
            if cap == "auto":
                if self.held >= AUTO_MAX_DELAYED:
                    return False
                if held.in_thread and self.in_threads >= max(1, serving.most // 2):
                    return False
            elif self.held >= int(cap):
                return False
            if held.in_thread and per_client is not None:
                if any(self.clients.get(c, 0) >= per_client for c, _ in held.clients):
                    return False
                now = time.monotonic()
                for client, result in held.clients:
                    self.clients[client] = self.clients.get(client, 0) + 1
                    self.waking[client] = (now, now + held.wait, result)
                held.counted = True
            self.held += 1
            if held.in_thread:
                self.in_threads += 1
            return True

    def leave(self, held: Held) -> None:
        with self._lock:
            self.held -= 1
            if held.in_thread:
                self.in_threads -= 1
            if held.counted:
                for client, _ in held.clients:
                    left = self.clients[client] - 1
                    if left:
                        self.clients[client] = left
                    else:
                        del self.clients[client]
                        self.waking.pop(client, None)

    def turned_away_before(self, checks: Sequence[Check]) -> Decision | None:
        """The 429 of a request whose client has MAX_DELAYED_PER_CLIENT requests held in
        threads for one of these delay rules, known without a store call: the bucket holds
        theirs until they wake, so this one would wait too, and be turned away."""
        per_client = conf.MAX_DELAYED_PER_CLIENT
        if per_client is None:
            return None
        for check in checks:
            rule = check.rule
            if rule.action != _DELAY:
                continue
            client = (rule.state_prefix, check.identity)
            waking = self.waking.get(client)  # one C call: no lock needed to read
            if waking is None or self.clients.get(client, 0) < per_client:
                continue
            entered, wakes, seen = waking
            now = time.monotonic()
            # Its turn comes one interval after the last held one's.
            retry_after = max(0.0, wakes - now) + rule.period / rule.limit
            at = seen.at + round((now - entered) * 1_000_000) if seen.at else 0
            result = Result(
                rule=rule,
                identity=check.identity,
                allowed=False,
                limit=seen.limit,
                remaining=seen.remaining,
                reset_at=seen.reset_at,
                retry_after=retry_after,
                delay=0.0,
                at=at,
                cost=check.cost,
            )
            return from_results([result])
        return None


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


async def arelease_after_threads(request: Any) -> None:
    """End the request's leases once the sync work it started is done: an ASGI request
    cancelled (its client gone) while a sync view runs in a thread, which goes on running.
    Queued even when the request holds no lease yet: the view may still take one (check())."""
    # The request's sync view runs on its thread-sensitive executor (one thread, one call at
    # a time: ASGIHandler gives each request its own), so a call queued there runs once the
    # view has returned, or at once if it never started. Shielded: a second cancellation
    # must not drop the release still waiting behind the view.
    await asyncio.shield(sync_to_async(release_leases, thread_sensitive=True)(request))


# The requests of the current handler call that hold leases. Under WSGI, request_started
# puts a new list in the handler's context (the request's thread) and request_finished ends
# what is in it. Under ASGI both signals' receivers run in tasks of their own (Signal.asend),
# so what they set never reaches the request; there the list is keyed by the request's
# ThreadSensitiveContext, which ASGIHandler enters around the request and which every task
# and thread of the request (its sync view, the signals' receivers) inherits.
_holding: ContextVar[list[Any] | None] = ContextVar("django_throttle_holding", default=None)
_asgi_holding: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_asgi_lock = threading.Lock()


def _handler_holding(end: bool = False) -> list[Any] | None:
    """The list of the current handler call (``end``: taken away, the call is over)."""
    holding = _holding.get()
    if holding is not None:
        return holding
    handler = SyncToAsync.thread_sensitive_context.get(None)
    if handler is None:
        return None
    with _asgi_lock:
        if end:
            return _asgi_holding.pop(handler, None)
        return _asgi_holding.setdefault(handler, [])


def request_started(**kwargs: Any) -> None:
    _holding.set([])


def request_finished(**kwargs: Any) -> None:
    """The final response is closed, or an ASGI request ended without one (its client left;
    the receivers run after its sync view has returned, on the request's thread): end the
    leases of the request, also when an outer middleware answered with a response of its own
    (a 304, a redirect), which the server closes instead of ours."""
    holding = _handler_holding(end=True)
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
        holding = _handler_holding()
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
