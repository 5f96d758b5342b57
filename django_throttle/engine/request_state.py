"""What throttling knows about one request, kept in one object on the request."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..choices import ALGORITHMS_WITH_BURST, Algorithm
from ..decision import Decision
from ..rules import ScopeSpec, get_rules, scope_rules
from ..store import Result

ATTR = "_django_throttle"
SPECS_ATTR = "_throttle_specs"  # on a decorated view: its @throttle scopes, outermost first
_CONCURRENCY = str(Algorithm.CONCURRENCY)


class RequestState:
    """Every decision made for the request, and the result of each rule that counted it."""

    __slots__ = (
        "actual",
        "counted",
        "decided_specs",
        "decisions",
        "leases",
        "middleware",
        "paths_decided",
        "release_armed",
        "settled",
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
        self.decisions: list[Decision] = []
        # @throttle scopes already decided (by id): the decorator skips what the middleware
        # decided, without selecting their rules again.
        self.decided_specs: set[int] = set()
        self.middleware = False  # ThrottleMiddleware is in the chain: it writes the headers
        self.paths_decided = False  # the path rules were decided before the view
        # settle(): the request's actual cost by rule (state prefix), applied once when the
        # response ends (settled).
        self.actual: dict[str, int] = {}
        self.settled = False

    def for_headers(self) -> Decision | None:
        """The decision whose figures the response shows: a rejection, else the most
        constrained (fewest remaining; ties go to the later reset)."""
        decisions = [d for d in self.decisions if d.rule is not None]
        if not decisions:
            return None
        for decision in decisions:
            if not decision.allowed:
                return decision
        return min(decisions, key=lambda d: (d.remaining, -(d.reset_at or 0)))


def state_of(request: Any) -> RequestState:
    """The request's state, made on first use. A DRF Request shares its HttpRequest's."""
    request = getattr(request, "_request", request)
    state: RequestState | None = getattr(request, ATTR, None)
    if state is None:
        state = RequestState()
        setattr(request, ATTR, state)
    return state


def view_specs(view_func: Any) -> list[ScopeSpec]:
    """The @throttle scopes of a view: on the function, or on a class-based view's dispatch
    (method_decorator copies the decorator's attributes onto it)."""
    specs = getattr(view_func, SPECS_ATTR, None)
    if specs is None:
        view_class = getattr(view_func, "view_class", None)
        specs = getattr(getattr(view_class, "dispatch", None), SPECS_ATTR, None)
    return specs or []


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


def seen_by_middleware(request: Any) -> None:
    """ThrottleMiddleware is in the request's chain: it writes the headers and ends leases."""
    state_of(request).middleware = True


def under_middleware(request: Any) -> bool:
    return state_of(request).middleware
