"""The block cache (``BLOCK_CACHE``): a process that saw a client rejected until a known time
rejects that client itself until then, without a store call.

Only rejections whose end does not depend on what comes next are remembered: a client
blocked by a rule's block duration, or rejected at a cost of 1 with nothing remaining (then
no request of that client fits before ``retry_after``). Concurrency rules are never
remembered: a lease ends whenever its request finishes. The memory is the RuleSet's, so a
rule change, or a reset (announced as one), empties it in every process within
RULES_REFRESH.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..choices import Algorithm
from ..decision import Decision, from_results
from ..store import Check, Result

MAX_ENTRIES = 10_000  # clients remembered per process; past it, new rejections are not
_CONCURRENCY = str(Algorithm.CONCURRENCY)

Blocked = dict[str, tuple[float, Result]]


def remembered(blocked: Blocked, checks: Sequence[Check]) -> Decision | None:
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
        result = Result(
            rule=rule,
            identity=check.identity,
            allowed=False,
            limit=seen.limit,
            remaining=0,
            reset_at=seen.reset_at,
            retry_after=left,
            delay=0.0,
            blocked=seen.blocked,
            cost=check.cost,
        )
        return from_results([result])
    return None


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
        if len(blocked) >= MAX_ENTRIES:
            for key in [k for k, (until, _) in blocked.items() if until <= now]:
                blocked.pop(key, None)
            if len(blocked) >= MAX_ENTRIES:
                return
        blocked[rule.state_prefix + check.identity] = (now + result.retry_after, result)
