"""The ``Decision`` value: what throttling made of one request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .choices import Action
from .compiled import CompiledRule
from .store import Result

US = 1_000_000
_DELAY = Action.DELAY.value  # an enum member's lookup on its class costs more than the compare


@dataclass(slots=True)  # built for every request: a frozen dataclass costs several times more
class Decision:
    """``allowed``, and the figures of the deciding rule: the rejecting one, else the most
    constrained (fewest remaining; ties go to the later reset)."""

    allowed: bool
    limit: int | None = None
    remaining: int | None = None
    reset_at: float | None = None  # Unix time, seconds
    retry_after: float = 0.0  # seconds
    rule: str | None = None
    period: int | None = None  # seconds: the deciding rule's window, for RateLimit-Policy
    delay: float = 0.0  # seconds to hold an admitted request (leaky bucket, action delay)
    unavailable: bool = False  # rejected because the store is down and the rule fails closed
    identity: str | None = None  # of an unavailable decision: the client, if it is known
    results: tuple[Result, ...] = field(default=(), repr=False)
    # The store's time of the decision (Unix seconds); None when no store was asked. What a
    # response or the dashboard says about time is reckoned from it, not the local clock.
    decided_at: float | None = None


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


def unavailable(rule: CompiledRule, retry_after: float, identity: str | None = None) -> Decision:
    """A fail-closed rule while the store is unreachable (or its key cannot be computed)."""
    return Decision(
        allowed=False,
        limit=rule.limit,
        remaining=0,
        retry_after=retry_after,
        rule=rule.name,
        period=rule.period,
        unavailable=True,
        identity=identity,
    )
