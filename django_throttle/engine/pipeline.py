"""One request's decision, read top to bottom: the client identified, the checks gathered, one
decision in the store, the request settled (its state, the block cache, the rejection log,
metrics), the answer. Each stage takes what the one before produced and hands on a value; none
calls back into an earlier one, and the request's state is written in one place (settle()).

Under ThrottleMiddleware the client is identified as the request comes in (request_state.py,
``begin()``); the middleware then enters here twice: ``enforce_view()`` before the view and
``respond()`` on the way out. The decorator, ``check()``, DRF and Channels enter through
``enforce()``, ``evaluate()`` and their async forms, which identify the client themselves."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, HttpResponseBase

from .. import metrics, rejection_log
from ..audience import counts
from ..choices import Action, Algorithm, KeyKind
from ..compiled import ON_LOOP, WITH_USER, CompiledRule, every_call
from ..conf import conf
from ..decision import Decision, unavailable
from ..rejection_log import RejectionLog, sizing
from ..rejection_log.sizing import SIZE_BOUNDS
from ..responses import add_missing_headers, rejected
from ..rules import ScopeSpec, request_rules
from ..runtime import current
from ..signals import request_throttled
from ..store import Check, GuardedStore, Result, StoreUnavailable, get_store
from .block_cache import Blocked, never_admitted, remember, remembered
from .delays import Held, delay_of, turned_away
from .leases import arelease_leases, release_leases, release_when_closed
from .outcomes import acount_outcome, count_outcome, failed_status
from .overrides import rule_for
from .refunds import agive_back, give_back, taken
from .request_state import (
    ATTR,
    SPECS_ATTR,
    UNREAD_USER,
    Client,
    Parts,
    RequestState,
    client_ip,
    forget_taken,
    state_of,
)
from .settlements import asettle_cost, settle_cost, view_failed

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; only read by type checkers

logger = logging.getLogger("django_throttle")

US = 1_000_000
_CONCURRENCY = str(Algorithm.CONCURRENCY)
_FIXED = Algorithm.FIXED_WINDOW.value
_DELAY = Action.DELAY.value  # an enum member's lookup on its class costs more than the compare


class Asked(NamedTuple):
    """What a request is decided against: the @throttle or check() scopes (``specs``); with
    ``paths``, the '*' and path rules; the rules of its URL name; ``cost`` in place of each
    rule's (check()); ``dry_run``: nothing consumed, every rule looked at, counted or not."""

    specs: Iterable[ScopeSpec] = ()
    paths: bool = False
    url_name: str | None = None
    cost: int | None = None
    dry_run: bool = False


# -- the entry points -------------------------------------------------------------------------


def enforce_view(request: Any, view_func: Any) -> HttpResponse | None:
    """ThrottleMiddleware's process_view: the path rules, the URL name's and the view's
    @throttle scopes, in one decision."""
    state = _state(request)
    state.paths_decided = True
    return _enforce(request, _asked_by_view(request, view_func), _parts(state))


async def aenforce_view(
    request: Any, view_func: Any, view_args: Any = None, view_kwargs: Any = None
) -> HttpResponse | None:
    """enforce_view() on the event loop. It takes process_view's arguments: ThrottleMiddleware
    hands it to Django as its process_view, one coroutine fewer on every request."""
    state = _state(request)
    state.paths_decided = True
    decision = await _aadmit(request, _asked_by_view(request, view_func), _parts(state))
    return None if decision.allowed else rejected(request, decision)


def respond(request: Any, response: Any) -> Any:
    """ThrottleMiddleware's way out: the path rules of a request that reached no view (a 404,
    a redirect) decided now, their rejection answered; else the response finished (finish())."""
    state = _state(request)
    if not state.paths_decided:
        state.paths_decided = True
        rejection = _enforce(request, Asked(paths=True), _parts(state))
        if rejection is not None:
            return rejection
    return finish(request, response)


async def arespond(request: Any, response: Any) -> Any:
    state = _state(request)
    if not state.paths_decided:
        state.paths_decided = True
        decision = await _aadmit(request, Asked(paths=True), _parts(state))
        if not decision.allowed:
            return rejected(request, decision)
    return await afinish(request, response)


def enforce(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> HttpResponse | None:
    """The rejection response, or None once the request may go on (after holding it, for a
    delay rule)."""
    return _enforce(request, Asked(specs, paths, url_name), current.runtime.part(Parts))


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
    return await _aadmit(request, Asked(specs, paths, url_name), current.runtime.part(Parts))


class Options(TypedDict, total=False):
    """The keywords of evaluate() and aevaluate(): Asked's fields after ``specs``."""

    paths: bool
    url_name: str | None
    cost: int | None
    dry_run: bool


def evaluate(request: Any, specs: Iterable[ScopeSpec] = (), **options: Unpack[Options]) -> Decision:
    """Decide a request against what applies to it (sync)."""
    asked = Asked(specs, **options)
    parts = current.runtime.part(Parts)
    gathered = gather(request, asked, parts)
    decision = gathered.early or decide(
        gathered.checks, asked.dry_run, gathered.blocked, parts.store
    )
    return settle(request, gathered, decision, parts, asked.dry_run)


async def aevaluate(
    request: Any, specs: Iterable[ScopeSpec] = (), **options: Unpack[Options]
) -> Decision:
    """evaluate() for async callers: the store call never blocks the loop."""
    return await _aevaluate(request, Asked(specs, **options), current.runtime.part(Parts))


def preview(
    request: Any, view_func: Any = None, scopes: Iterable[str] = ()
) -> tuple[list[CompiledRule], Decision]:
    """What ThrottleMiddleware, and the view's throttles deciding ``scopes``, would meet for
    this request: the rules that apply to its client (overrides and exemptions applied) and
    their state, in one store call that consumes nothing; kept on no request, announced to
    no one."""
    asked = _asked_by_view(request, view_func)
    specs = [*asked.specs, *(ScopeSpec(scope, None, 1) for scope in scopes)]
    parts = current.runtime.part(Parts)
    gathered = gather(request, asked._replace(specs=specs, dry_run=True), parts)
    decision = gathered.early or decide(gathered.checks, True, gathered.blocked, parts.store)
    return [check.rule for check in gathered.checks], decision


def finish(request: Any, response: Any) -> Any:
    """Give back what the rules that do not count the response's status took, and write the
    rate-limit headers of the request's decisions on a response that has none: our own 429s
    have them; a view's response, or a 429 of DRF's, does not. Concurrency leases end when
    the response is closed (a streaming one: once streamed)."""
    state = _state(request)
    if state.taken and isinstance(response, HttpResponseBase):
        if state.by_response:
            count_outcome(state, response.status_code)
        if state.by_response or state.actual or response.streaming:
            settle_cost(request, state, response)  # a cost known after the response
    return _written(request, state, _parts(state), response)


async def afinish(request: Any, response: Any) -> Any:
    """finish() on an event loop: the give-back never blocks it."""
    state = _state(request)
    if state.taken and isinstance(response, HttpResponseBase):
        if state.by_response:
            await acount_outcome(state, response.status_code)
        if state.by_response or state.actual or response.streaming:
            await asettle_cost(request, state, response)
    return _written(request, state, _parts(state), response)


def failed(request: Any, error: BaseException) -> None:
    """The view raised: no response will be closed. What the rules that do not count the
    status Django answers with (500, or 404, 403, 400) took is given back; the leases end."""
    count_outcome(state_of(request), failed_status(error))
    view_failed(request)
    release_leases(request)


async def afailed(request: Any, error: BaseException) -> None:
    await acount_outcome(state_of(request), failed_status(error))
    view_failed(request)
    await arelease_leases(request)


# -- one decision, stage by stage --------------------------------------------------------------


def _enforce(request: Any, asked: Asked, parts: Parts) -> HttpResponse | None:
    # A wait in a thread of a WSGI server holds one of its few threads; under ASGI (a sync
    # view's thread is the request's own) it holds nothing shared.
    in_thread = not isinstance(request, ASGIRequest)
    gathered = gather(request, asked, parts)
    decision = gathered.early
    delays = parts.delays
    if decision is None and in_thread and delays.clients:
        turned = delays.turned_away_before(gathered.checks)
        if turned is not None:
            decision = from_results([turned])
    if decision is None:
        decision = decide(gathered.checks, False, gathered.blocked, parts.store)
    decision = settle(request, gathered, decision, parts)
    if not decision.allowed:
        return rejected(request, decision)
    wait = delay_of(decision) if decision.delay > 0 else 0.0
    if wait:
        held = Held(decision, wait, in_thread)
        if not delays.enter(held, parts.serving.most):
            give_back(taken(forget_taken(request, decision)))
            turned_decision = turned_away(decision, wait)
            announce(request, turned_decision, parts)
            return rejected(request, turned_decision)
        try:
            time.sleep(wait)
        finally:
            delays.leave(held)
    return None


async def _aadmit(request: Any, asked: Asked, parts: Parts) -> Decision:
    decision = await _aevaluate(request, asked, parts)
    if not decision.allowed:
        return decision
    wait = delay_of(decision) if decision.delay > 0 else 0.0
    if wait:
        delays = parts.delays
        held = Held(decision, wait, in_thread=False)  # an await holds no thread
        if not delays.enter(held, parts.serving.most):
            await agive_back(taken(forget_taken(request, decision)))
            turned = turned_away(decision, wait)
            announce(request, turned, parts)
            return turned
        try:
            await asyncio.sleep(wait)
        finally:
            delays.leave(held)
    return decision


async def _aevaluate(request: Any, asked: Asked, parts: Parts) -> Decision:
    """Refreshing the rules and working out some keys (request.user, a user's groups, a key
    function) may query the database, which Django forbids inside the event loop: then
    gathering runs in a thread; otherwise (fresh rules; ip, header, param, global keys; a user
    already loaded) on the loop, without that thread hop."""
    try:
        gathered = gather(request, asked, parts, on_loop=True)
    except NeedsThread:
        gathered = await sync_to_async(gather)(request, asked, parts)
    decision = gathered.early or await adecide(
        gathered.checks, asked.dry_run, gathered.blocked, parts.store
    )
    return settle(request, gathered, decision, parts, asked.dry_run)


# -- 1 and 2: identify the client, gather the checks -----------------------------------------


class Gathered:
    """The checks still to decide for a request, the results of rules that already counted
    it, or a decision already (a rule whose key cannot be computed and that fails closed);
    the block cache of the rules they come from, and the request's state."""

    __slots__ = ("blocked", "checks", "earlier", "early", "state")

    def __init__(
        self,
        checks: list[Check],
        earlier: list[Result],
        state: RequestState,
        early: Decision | None = None,
        blocked: Blocked | None = None,
    ) -> None:
        self.checks = checks
        self.earlier = earlier
        self.state = state
        self.early = early
        self.blocked = blocked


class NeedsThread(Exception):
    """Gathering must run in a thread: it may use the database."""


def gather(request: Any, asked: Asked, parts: Parts, on_loop: bool = False) -> Gathered:
    """What applies to this request and has not counted it yet, with the client each rule
    counts. ``on_loop``: called on an event loop, where the database must not be used;
    NeedsThread is raised, before anything about the request is changed, if the rules must be
    refreshed or a rule needs the user (not loaded yet), its groups or a key function."""
    state = _state(request)
    counted = state.counted
    specs, cost, dry_run = asked.specs, asked.cost, asked.dry_run
    decided_now: list[ScopeSpec] = []
    if specs and cost is None and not dry_run:
        decided = state.decided_specs
        specs = decided_now = [spec for spec in specs if id(spec) not in decided]
        if not specs and not asked.paths and not asked.url_name:
            return Gathered([], [], state)  # a decorator whose scopes the middleware decided
    checks: list[Check] = []
    earlier: list[Result] = []
    if on_loop:
        fresh = parts.rules.fresh()
        if fresh is None:
            raise NeedsThread  # a refresh may read the database
        ruleset = fresh
        user_loaded = hasattr(request, "_cached_user")  # AuthenticationMiddleware's cache
    else:
        ruleset = parts.rules.get()
    # Without EXEMPT_NETWORKS, a rule that counts everyone counts this request: no call to
    # counts() for it.
    anyone = not parts.exempt_networks
    # Whether the response will be seen (the middleware, or @throttle: its own decision, or a
    # check() inside its view) and its status counted then; if not, every call counts.
    settled = asked.paths or cost is None or state.middleware or bool(state.decided_specs)
    # The path rules' decision counts the client identified when the request came in
    # (begin()); the others identify it now (a view may have logged a user in meanwhile), its
    # address and user read when a rule first needs them.
    client: Client | None = state.client if asked.paths else None
    chosen = request_rules(ruleset, request, specs, paths=asked.paths, url_name=asked.url_name)
    for rule, rule_cost in chosen:
        if on_loop and rule.on_loop != ON_LOOP and not (rule.on_loop == WITH_USER and user_loaded):
            raise NeedsThread
        done = counted.get(rule.state_prefix)
        if done is not None and not dry_run:
            earlier.append(done)
            continue
        try:
            if client is None:
                client = Client(request)
            if not (anyone and rule.everyone) and not counts(
                rule, request, _address(client, parts)
            ):
                continue  # outside the rule's audience, or exempt
            who = identity(rule, client, parts)
        except Exception:
            current.runtime.part(KeyErrors).log(rule)
            if rule.fails_closed(parts.fail_open):
                return Gathered([], [], state, unavailable(rule, rule.period))
            continue
        if who is None:
            continue
        if rule.overrides is not None:  # tested here: most rules have none, and a call costs
            own = rule_for(rule, who)
            if own is None:
                continue  # this client is exempt from the rule
            rule = own  # this client's own limit, on the same state
        if rule.defers_block and not settled:
            rule = every_call(rule)
        checks.append(Check(rule, who, rule_cost if cost is None else cost))
    if decided_now:
        state.decided_specs.update(id(spec) for spec in decided_now)
    return Gathered(checks, earlier, state, None, ruleset.blocked)


def _address(client: Client, parts: Parts) -> str:
    """The client's address, read at its first need (ThrottleMiddleware read it in begin())."""
    address = client.ip
    if address is None:
        address = client.ip = client_ip(client.request, parts.trusted_proxies, parts.ipv6_prefix)
    return address


def param_value(request: Any, name: str) -> str:
    """The value a view reads: a form post's body first (a query string added to a POST
    must not choose the counter), else the query string. Missing or empty counts as the
    value "" (one counter shared by every request without it), so leaving the parameter
    out, or sending it empty, never escapes the rule."""
    if request.method == "POST":
        try:
            body = request.POST
        except Exception:  # a body Django cannot parse (too large, malformed): not counted in it
            body = {}
        value = body.get(name)
        if value:
            return str(value)
        if name in body:
            return ""  # present and empty in the body: the query string cannot replace it
    return str(request.GET.get(name) or "")


def user_pk(request: Any) -> str | None:
    """The primary key of the request's user, None when anonymous."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return str(user.pk)


# The kinds as plain strings: an enum member's lookup on its class costs more than the compare.
_IP, _USER, _GLOBAL = KeyKind.IP.value, KeyKind.USER.value, KeyKind.GLOBAL.value
_HEADER, _PARAM, _CUSTOM = KeyKind.HEADER.value, KeyKind.PARAM.value, KeyKind.CUSTOM.value
_ADDRESS_OR_USER = frozenset({_IP, _USER, KeyKind.USER_OR_IP.value})


def identity(rule: CompiledRule, client: Client, parts: Parts) -> str | None:
    """The identity this rule counts the client's request under, or None if the rule does not
    count it."""
    kind = rule.key_kind
    if kind == _GLOBAL:
        return "global"
    if kind in _ADDRESS_OR_USER:
        if kind != _IP:
            pk = client.user
            if pk is UNREAD_USER:
                pk = client.user = user_pk(client.request)
            if pk is not None:
                return "user:" + pk
            if kind == _USER:
                return None  # anonymous requests are not counted by a user rule
        return "ip:" + (client.ip or _address(client, parts))
    request = client.request
    if kind == _HEADER:
        value = request.META.get(rule.header_meta_key)
        return None if value is None or value == "" else "header:" + value
    if kind == _PARAM:
        return "param:" + param_value(request, rule.key_arg)
    if kind == _CUSTOM:
        assert rule.key_function is not None
        value = rule.key_function(request)
        return None if value is None else "custom:" + str(value)
    return None


KEY_ERROR_LOG_EVERY = 60.0  # seconds: a broken key function is logged, not once per request


class KeyErrors:
    """When the failure of each rule's key was last logged (by state prefix, monotonic)."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def log(self, rule: CompiledRule) -> None:
        now = time.monotonic()
        if now - self.logged.get(rule.state_prefix, -KEY_ERROR_LOG_EVERY) >= KEY_ERROR_LOG_EVERY:
            self.logged[rule.state_prefix] = now
            logger.exception(
                "django_throttle: the key of rule %r could not be computed; its fail mode "
                "applies (logged at most once a minute)",
                rule.name,
            )


# -- 3: decide in the store -------------------------------------------------------------------


def decide(
    checks: Sequence[Check],
    dry_run: bool = False,
    blocked: Blocked | None = None,
    store: GuardedStore | None = None,
) -> Decision:
    """One store call for these checks (none if there are none, or if the block cache knows
    one of their clients is rejected); ``store``: the runtime's, when the caller holds it."""
    known = _without_store(checks, dry_run, blocked)
    if known is not None:
        return known
    return _learn(checks, (store or get_store()).decide(checks, dry_run), dry_run, blocked)


async def adecide(
    checks: Sequence[Check],
    dry_run: bool = False,
    blocked: Blocked | None = None,
    store: GuardedStore | None = None,
) -> Decision:
    known = _without_store(checks, dry_run, blocked)
    if known is not None:
        return known
    return _learn(checks, await (store or get_store()).adecide(checks, dry_run), dry_run, blocked)


def _without_store(
    checks: Sequence[Check], dry_run: bool, blocked: Blocked | None
) -> Decision | None:
    """The decision when no store call is needed: no checks, or a rejection known (_known())."""
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    return _known(checks, dry_run, blocked)


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
    if known is None:
        return None
    if metrics.switch.on:
        metrics.block_cache_hit(known.rule.name)
    return from_results([known])


def _learn(
    checks: Sequence[Check],
    outcome: list[Result] | StoreUnavailable,
    dry_run: bool,
    blocked: Blocked | None,
) -> Decision:
    """The decision of a store call; the block cache keeps its rejections."""
    if isinstance(outcome, StoreUnavailable):
        for check in outcome.checks:  # those the store could not decide (a cluster: some)
            if check.rule.fails_closed(conf.FAIL_OPEN):
                return unavailable(check.rule, outcome.retry_after, check.identity)
        if outcome.results is None:
            return Decision(allowed=True)  # a fresh one: callers may keep it
        return from_results(outcome.results)
    decision = from_results(outcome)
    # Only an enforcing rule's rejection is remembered, and one makes the decision a rejection.
    if not decision.allowed and blocked is not None and not dry_run:
        remember(blocked, checks, outcome)
    return decision


def from_results(results: Sequence[Result]) -> Decision:
    """Sum up one store call: rejected if any enforcing rule rejected."""
    # One pass, no intermediate lists: this runs for every request.
    rejecting: Result | None = None
    deciding: Result | None = None
    delay = 0.0
    for result in results:
        rule = result.rule
        if not rule.enforcing:
            continue
        if not result.allowed:
            # The longest wait decides (the first of equals).
            if rejecting is None or result.retry_after > rejecting.retry_after:
                rejecting = result
        elif rejecting is None:
            # Fewest remaining, ties to the later reset (the first of equals).
            if deciding is None or (
                result.remaining < deciding.remaining
                or (result.remaining == deciding.remaining and result.reset_at > deciding.reset_at)
            ):
                deciding = result
            if rule.action == _DELAY and result.delay > delay:
                delay = result.delay
    if rejecting is not None:
        return _decision(False, rejecting, results, rejecting.retry_after)
    if deciding is None:
        return Decision(allowed=True, results=tuple(results))
    return _decision(True, deciding, results, 0.0, delay)


def _decision(
    allowed: bool,
    deciding: Result,
    results: Sequence[Result],
    retry_after: float,
    delay: float = 0.0,
) -> Decision:
    rule = deciding.rule
    # Positional (the field order of Decision): once per request, keywords cost twice as much.
    return Decision(
        allowed,
        deciding.limit,
        deciding.remaining,
        deciding.reset_at,
        retry_after,
        rule.name,
        rule.period,
        delay,
        False,  # unavailable
        None,  # identity
        tuple(results),
        deciding.at / US if deciding.at else None,  # decided_at
    )


# -- 4: settle ----------------------------------------------------------------------------------


def settle(
    request: Any, gathered: Gathered, decision: Decision, parts: Parts, dry_run: bool = False
) -> Decision:
    """Keep what was decided on the request, announce it, and return the decision over every
    rule that applied (the ones decided earlier included)."""
    if dry_run:
        return decision
    if gathered.checks or decision.unavailable:
        state = gathered.state
        by_response = state.by_response
        for result in decision.results:
            rule = result.rule
            state.counted[rule.state_prefix] = result
            if decision.allowed and result.allowed:
                state.taken[rule.state_prefix] = result
                if rule.count_statuses is not None or rule.cost_header:
                    by_response = True
                if rule.algorithm == _CONCURRENCY:
                    state.leases.append(result)
        state.by_response = by_response
        if decision.rule is not None:
            state.shown = _shown(state.shown, decision)
        announce(request, decision, parts)
    if gathered.earlier and not decision.unavailable:
        return from_results([*gathered.earlier, *decision.results])
    return decision


def _shown(shown: Decision | None, decision: Decision) -> Decision:
    """The decision whose figures the response shows, of the one shown so far and a new one:
    the first rejection, else the most constrained (fewest remaining; ties go to the later
    reset, then to the first)."""
    if shown is None or (shown.allowed and not decision.allowed):
        return decision
    if not shown.allowed or not decision.allowed:
        return shown
    if (decision.remaining, -(decision.reset_at or 0)) < (shown.remaining, -(shown.reset_at or 0)):
        return decision
    return shown


def announce(request: Any | None, decision: Decision, parts: Parts | None = None) -> None:
    """Count rejections for the dashboard and every decision in the metrics (``parts``: the
    runtime's, when the caller holds them), and send request_throttled for a rejection and
    for each would-be rejection of a log-only rule (not for a key decided without a request:
    ``request`` None)."""
    refused = not decision.allowed
    if not refused:
        for result in decision.results:
            if not result.allowed:  # a log-only rule's would-be rejection
                refused = True
                break
    if refused:
        rejection_log.note(decision)
    _sized(decision, parts)
    part = parts.metrics if parts is not None else current.runtime.part(metrics.Metrics)
    if part.on:
        metrics.decision_counted(part, decision)
    if request is None or not refused:
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


def _sized(decision: Decision, parts: Parts | None) -> None:
    """Sizing (rejection_log/sizing.py): an admitted fixed window's count of cost 1 that lands
    on a boundary is queued for the flusher here, on the request's path without a call; a
    costly or rejected one is counted by sizing.note_result(); other algorithms, nothing."""
    for result in decision.results:
        if result.rule.algorithm != _FIXED or result.local:
            continue
        if result.cost != 1 or not (result.allowed and decision.allowed):
            sizing.note_result(decision, result)
            continue
        count = result.limit - result.remaining
        if count in SIZE_BOUNDS or count == result.limit:
            log = parts.rejection_log if parts is not None else current.runtime.part(RejectionLog)
            log.crossed.append(result)
            if log.thread is None:
                log.wake()


# -- 5: answer ----------------------------------------------------------------------------------


def _written(request: Any, state: RequestState, parts: Parts, response: Any) -> Any:
    """The response with the rate-limit headers of the decision shown (if it has none: our own
    429s have them), its concurrency leases set to end when it is closed."""
    if not isinstance(response, HttpResponseBase):
        return response
    if state.leases and not state.release_armed:
        release_when_closed(request, state, response)
    decision = state.shown
    if decision is not None and (parts.headers or not decision.allowed):
        add_missing_headers(response, decision)
    return response


# -- what the stages share --------------------------------------------------------------------


def _state(request: Any) -> RequestState:
    """The request's state: made by begin() under the middleware, else by state_of()."""
    state: RequestState | None = getattr(getattr(request, "_request", request), ATTR, None)
    return state if state is not None else state_of(request)


def _parts(state: RequestState) -> Parts:
    """What the request uses of the runtime: fetched by begin() under the middleware."""
    parts = state.parts
    return parts if parts is not None else current.runtime.part(Parts)


def _asked_by_view(request: Any, view_func: Any) -> Asked:
    """The path rules, the URL name's rules and the view's @throttle scopes: on the function,
    or on a class-based view's dispatch (method_decorator copies the decorator's attributes
    onto it)."""
    specs = getattr(view_func, SPECS_ATTR, None)
    if specs is None:
        view_class = getattr(view_func, "view_class", None)
        specs = getattr(getattr(view_class, "dispatch", None), SPECS_ATTR, None)
    match = getattr(request, "resolver_match", None)
    return Asked(specs or [], True, match.view_name if match is not None else None)
