"""The first stage of a request: who its client is (``identify()``), what throttling knows about
the request (one ``RequestState`` on it), what it uses of the process (``Parts``, fetched once);
``begin()``, ThrottleMiddleware's first step, makes all three."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from ..choices import ALGORITHMS_WITH_BURST, Algorithm
from ..conf import conf
from ..decision import Decision
from ..metrics import Metrics
from ..networks import MAX_ADDRESS_CHARS, normalized
from ..rejection_log import RejectionLog
from ..rules import RuleCache, get_rules, scope_rules
from ..runtime import Runtime, current
from ..store import GuardedStore, Result
from .delays import Delays

ATTR = "_django_throttle"
SPECS_ATTR = "_throttle_specs"  # on a decorated view: its @throttle scopes, outermost first
_CONCURRENCY = str(Algorithm.CONCURRENCY)


UNKNOWN_IP = "unknown"
MAX_FORWARDED_ENTRIES = 64  # more hops than any real proxy chain; longer headers are cut
UNREAD_USER: Any = object()  # Client.user before a rule needed it


class Client:
    """Who sent a request, as every rule of a decision sees it: its address as keyed (None
    until read), and the primary key of its user (None: anonymous), read when a rule first
    needs it (reading request.user may query the database)."""

    __slots__ = ("ip", "request", "user")

    def __init__(self, request: Any, ip: str | None = None) -> None:
        self.request = request
        self.ip = ip
        self.user: str | None = UNREAD_USER


def identify(request: Any, trusted: int, prefix: int) -> Client:
    """The request's client, its address read now (``trusted``: TRUSTED_PROXIES, ``prefix``:
    IPV6_PREFIX)."""
    return Client(request, client_ip(request, trusted, prefix))


def client_ip(request: Any, trusted: int, prefix: int) -> str:
    """The client's address: REMOTE_ADDR, or with ``trusted`` proxies (TRUSTED_PROXIES) the
    N-th X-Forwarded-For entry from the right; IPv6 by its ``prefix`` (IPV6_PREFIX). A missing
    or malformed value falls back to REMOTE_ADDR."""
    meta = request.META
    remote = _normalize_ip(meta.get("REMOTE_ADDR") or "", prefix)
    if trusted > 0:
        forwarded = meta.get("HTTP_X_FORWARDED_FOR") or ""
        entries = forwarded.rsplit(",", MAX_FORWARDED_ENTRIES)[-MAX_FORWARDED_ENTRIES:]
        if len(entries) >= trusted and forwarded:
            candidate = _normalize_ip(entries[-trusted], prefix)
            if candidate is not None:
                return candidate
    return remote or UNKNOWN_IP


def _normalize_ip(text: str, prefix: int) -> str | None:
    """The address as it is keyed (IPv6 by its network ``prefix``), or None if it is not one."""
    if len(text) > MAX_ADDRESS_CHARS:
        return None
    return normalized(text, prefix)


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

    def handover(self, successor: Runtime) -> None:
        # The server's threads outlive a settings change.
        following = successor.part(Serving)
        following.most = max(following.most, self.most)


def serving() -> Serving:
    """This process's count of the threads serving requests (fetch it once per request)."""
    return current.runtime.part(Serving)


class Parts:
    """What a request uses of the runtime, fetched once per request and handed from stage to
    stage (a runtime part): the rule cache, the store, delays, the threads serving, metrics,
    the rejection log (sizing's queue), and the settings every request reads."""

    __slots__ = (
        "delays",
        "exempt_networks",
        "fail_open",
        "headers",
        "ipv6_prefix",
        "metrics",
        "rejection_log",
        "rules",
        "serving",
        "store",
        "trusted_proxies",
    )

    def __init__(self) -> None:
        runtime = current.runtime
        self.rules = runtime.part(RuleCache)
        self.store = runtime.part(GuardedStore)
        self.metrics = runtime.part(Metrics)
        self.rejection_log = runtime.part(RejectionLog)
        self.serving = runtime.part(Serving)
        self.delays = runtime.part(Delays)
        self.trusted_proxies = conf.TRUSTED_PROXIES
        self.ipv6_prefix = conf.IPV6_PREFIX
        self.exempt_networks = bool(conf.EXEMPT_NETWORKS)
        self.fail_open = conf.FAIL_OPEN
        self.headers = conf.HEADERS


class RequestState:
    """Every decision made for the request, and the result of each rule that counted it."""

    __slots__ = (
        "actual",
        "by_response",
        "client",
        "counted",
        "decided_specs",
        "leases",
        "middleware",
        "parts",
        "paths_decided",
        "release_armed",
        "settled",
        "shown",
        "taken",
    )

    def __init__(self) -> None:
        # Rule (by its state prefix) -> its result: a request is counted at most once per
        # rule, whichever entry points (middleware, decorator, check(), DRF) see it.
        self.counted: dict[str, Result] = {}
        # What admitted decisions committed, by rule (refund() gives it back), and the
        # concurrency leases the request holds until its response is finished.
        self.taken: dict[str, Result] = {}
        self.leases: list[Result] = []
        self.release_armed = False
        # A rule that took something looks at the response: counts only some statuses
        # (count_statuses, outcomes.py) or reads its cost from a header (cost_header,
        # settlements.py).
        self.by_response = False
        # The decision whose figures the response shows: the first rejection, else the most
        # constrained (fewest remaining; ties go to the later reset).
        self.shown: Decision | None = None
        # @throttle scopes already decided (by id): the decorator skips what the middleware
        # decided, without selecting their rules again.
        self.decided_specs: set[int] = set()
        self.middleware = False  # ThrottleMiddleware is in the chain: it writes the headers
        self.paths_decided = False  # the path rules were decided before the view
        # settle(): the request's actual cost by rule (state prefix), applied once when the
        # response ends (settled).
        self.actual: dict[str, int] | None = None  # made by the first settle()
        self.settled = False
        # What the middleware's hooks use of the runtime, and the client as identified when
        # the request came in: the ban check and the path rules' decision use it (begin()).
        self.parts: Parts | None = None
        self.client: Client | None = None


def begin(request: Any, in_thread: bool = True) -> Serving | None:
    """ThrottleMiddleware's first step: the request's state, marked as the middleware's (it
    writes the headers and ends leases), with what the request will use of the runtime and
    its client identified; in a server's thread (``in_thread``), the thread counted among
    those serving (MAX_DELAYED). Returns the Serving to leave() once the response is out, if
    this call counted the thread."""
    parts = current.runtime.part(Parts)
    state = state_of(request)
    state.middleware = True
    state.parts = parts
    state.client = identify(request, parts.trusted_proxies, parts.ipv6_prefix)
    if in_thread and parts.serving.enter():
        return parts.serving
    return None


def state_of(request: Any) -> RequestState:
    """The request's state, made on first use. A DRF Request shares its HttpRequest's."""
    request = getattr(request, "_request", request)
    state: RequestState | None = getattr(request, ATTR, None)
    if state is None:
        state = RequestState()
        setattr(request, ATTR, state)
    return state


def forget_taken(request: Any, decision: Decision) -> list[Result]:
    """What an admitted decision took, no longer the request's (it is being given back)."""
    state = state_of(request)
    given = [r for r in decision.results if state.taken.pop(r.rule.state_prefix, None) is r]
    state.leases = [lease for lease in state.leases if lease not in given]
    return given


def take_back(request: Any, scope: str, cost: int) -> list[Result]:
    """``cost`` of what the request's admitted decisions committed under ``scope``'s rules
    (at most what each took), no longer the request's (refund()). A concurrency slot is not
    given back here: it ends with the response."""
    state = state_of(request)
    results = []
    for rule in scope_rules(get_rules(), scope):
        result = state.taken.get(rule.state_prefix)
        if result is None or result.rule.algorithm == _CONCURRENCY:
            continue
        part, kept = split(result, cost)
        if kept is None:
            del state.taken[rule.state_prefix]
            state.counted.pop(rule.state_prefix, None)  # a later check() counts again
        else:
            state.taken[rule.state_prefix] = kept
        results.append(part)
    return results


def split(result: Result, cost: int) -> tuple[Result, Result | None]:
    """``cost`` of what an admitted decision took (at most all of it), and what it still
    holds after that is given back (None: nothing)."""
    given = min(cost, result.cost)
    if given == result.cost:
        return result, None
    kept = result.cost - given
    reset_at = result.reset_at
    rule = result.rule
    if rule.algorithm in ALGORITHMS_WITH_BURST:
        # A bucket gives back the newest part of the request's time: what it keeps ends
        # that much earlier, so a later give-back returns only what is left of it.
        reset_at -= given * rule.period / rule.limit
    return replace(result, cost=given), replace(result, cost=kept, reset_at=reset_at)


def under_middleware(request: Any) -> bool:
    return state_of(request).middleware
