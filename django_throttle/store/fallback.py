"""What the fail modes make of a store call: ``StoreUnavailable``, and the pieces of a cluster
request decided by the masters that answered and by the fail modes for the others."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.exceptions import TryAgainError

from ..compiled import CompiledRule
from ..conf import conf
from .base import Check, Result
from .breaker import CLOSED, Breaker
from .cluster import Plan, assemble
from .errors import STORE_ERRORS


@dataclass(frozen=True, slots=True)
class StoreUnavailable:
    """The store could not decide ``checks`` (all of the request's, or on a cluster those
    whose master failed); ``results`` are the local fallback's for the fail-open rules among
    them, and the store's for the others."""

    results: list[Result] | None
    retry_after: float
    checks: Sequence[Check] = ()


def fails_closed(rule: CompiledRule) -> bool:
    return rule.fails_closed(conf.FAIL_OPEN)


def allow(guards: Sequence[Breaker]) -> list[int | None]:
    """Each group's token; the groups of one master share one (a recovering master's one
    probe carries all of them, rather than the second group finding the probe taken)."""
    given: dict[int, int | None] = {}
    tokens = []
    for guard in guards:
        key = id(guard)
        if key not in given:
            given[key] = guard.allow()
        tokens.append(given[key])
    return tokens


def abandon(guards: Sequence[Breaker], tokens: Sequence[int | None]) -> None:
    for guard, token in zip(guards, tokens, strict=True):
        if token is not None:
            guard.abandoned(token)


def report(
    guards: Sequence[Breaker], tokens: Sequence[int | None], replies: Sequence[object]
) -> tuple[list[int], bool]:
    """Tell each master's breaker how its group went: the groups not decided in Redis, and
    whether a breaker moved."""
    failed = []
    moved = False
    for number, (guard, token, reply) in enumerate(zip(guards, tokens, replies, strict=True)):
        if token is None:
            failed.append(number)  # its master failed moments ago: not sent
        elif isinstance(reply, BaseException):
            failed.append(number)
            if isinstance(reply, STORE_ERRORS) and not isinstance(reply, TryAgainError):
                guard.failed(reply, token)
                moved = True
            else:  # a slot migrating (this request only), or not the store's doing
                guard.abandoned(token)
        elif guard.state != CLOSED:  # this call may be the probe that closes the breaker
            guard.succeeded(token)
            moved = True
    return failed, moved


def not_the_store(replies: Sequence[object]) -> BaseException | None:
    """A group's error that is not the store's (a bug): raised, as without a breaker."""
    for reply in replies:
        if isinstance(reply, BaseException) and not isinstance(reply, STORE_ERRORS):
            return reply
    return None


def checks_of(plan: Plan, numbers: Sequence[int]) -> list[Check]:
    """The checks of these groups, in the request's order."""
    return [plan.checks[i] for i in sorted(i for n in numbers for i in plan.groups[n])]


def partly(
    plan: Plan,
    replies: list[object],
    refunded: set[int],
    local: list[Result] | None,
    retry_after: float,
    lost: Sequence[Check],
) -> StoreUnavailable:
    """A request decided partly in Redis, partly by the fail modes of fail-open rules; the
    results in the order of the checks."""
    results = assemble(plan, replies, refunded)
    if local:
        at = {(id(c.rule), c.identity): i for i, c in enumerate(plan.checks)}
        results = sorted([*results, *local], key=lambda r: at[id(r.rule), r.identity])
    return StoreUnavailable(results, retry_after, lost)
