"""The block cache (``BLOCK_CACHE``): clients known to be rejected until a known time, rejected
without a store call (docs/internals.md, "The block cache")."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..choices import Algorithm
from ..runtime import runtime
from ..store import Check, Result

MAX_ENTRIES = 10_000  # clients remembered per process; past it, new rejections are not
_CONCURRENCY = str(Algorithm.CONCURRENCY)

Blocked = dict[str, tuple[float, Result]]


class LastSweep:
    """When a full block cache was last swept of what has expired (monotonic)."""

    def __init__(self) -> None:
        self.at = 0.0


def _swept(blocked: Blocked, now: float) -> bool:
    """Make room by dropping what has expired, at most once a second (a full cache of live
    entries is not scanned at every rejection); whether there is room now."""
    last = runtime().part(LastSweep)
    if now - last.at >= 1.0:
        last.at = now
        # list() copies in one step under the GIL: other threads may add and pop meanwhile.
        for key, (until, _) in list(blocked.items()):
            if until <= now:
                blocked.pop(key, None)
    return len(blocked) < MAX_ENTRIES


def remembered(blocked: Blocked, checks: Sequence[Check]) -> Result | None:
    """The rejection of a client this process knows is rejected now, or None."""
    now = time.monotonic()
    for check in checks:
        rule = check.rule
        if not rule.enforcing:
            continue
        key = rule.state_prefix + check.identity
        entry = blocked.get(key)
        if entry is None:
            continue
        until, seen = entry
        if until <= now:
            blocked.pop(key, None)
            continue
        left = until - now
        # The store's clock now, from its time of the rejection and the time since.
        at = seen.at + round((now - (until - seen.retry_after)) * 1_000_000) if seen.at else 0
        return _rejection(check, seen.limit, seen.reset_at, left, seen.blocked, at)
    return None


def never_admitted(check: Check) -> Result:
    """The rejection of a check whose cost is more than its rule can ever admit: as the store
    would answer it (nothing remaining counted, ask again in a window), without asking."""
    rule = check.rule
    return _rejection(check, rule.limit, time.time() + rule.period, float(rule.period))


def _rejection(
    check: Check,
    limit: int,
    reset_at: float,
    retry_after: float,
    blocked: bool = False,
    at: int = 0,
) -> Result:
    """A rejection of ``check`` known in this process, as the store would answer it: nothing
    remaining."""
    return Result(
        rule=check.rule,
        identity=check.identity,
        allowed=False,
        limit=limit,
        remaining=0,
        reset_at=reset_at,
        retry_after=retry_after,
        delay=0.0,
        blocked=blocked,
        at=at,
        cost=check.cost,
    )


def remember(blocked: Blocked, checks: Sequence[Check], results: Sequence[Result]) -> None:
    """Keep the rejections whose end is known, from one store call."""
    now = 0.0
    for check, result in zip(checks, results, strict=True):
        rule = result.rule
        if (
            result.allowed
            or not rule.enforcing
            or result.retry_after <= 0
            or rule.algorithm == _CONCURRENCY
            or not (result.blocked or (check.cost == 1 and result.remaining == 0))
        ):
            continue
        now = now or time.monotonic()
        if len(blocked) >= MAX_ENTRIES and not _swept(blocked, now):
            return
        blocked[rule.state_prefix + check.identity] = (now + result.retry_after, result)
