"""The ``Decision`` value: what throttling made of one request."""

from __future__ import annotations

from dataclasses import dataclass, field

from .compiled import CompiledRule
from .store import Result


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
