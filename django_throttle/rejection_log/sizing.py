"""Sizing a limit from real traffic: how far clients' counts go in each window of a rule.

A fixed window's count is one integer in the store, and each decision it admits returns what
is left of it, so the count after the decision is exact (limit - remaining) and grows by the
request's cost. A decision whose count passes a boundary of ``BOUNDS`` (1, 2, ..., 20, then
5% apart) adds one to (rule, hour, boundary) in this process's rejection log: each crossing is
seen by exactly one decision, in one process, whatever the number of processes. The counts
travel with the rejection counts (through Redis to the database, no round trip of a request's
own) into ``SizingCount``; a rejected request, which the window does not count, adds its cost
to boundary 0 instead: the requests past the rule's own limit. A log-only rule's window goes
on counting past its limit (decide.lua: its remaining then tells how far past, ``Result.past``),
so its crossings are counted there too and nothing about it is unknown.

From the sums over a period, N(b) is the number of client windows whose count reached b, and
so the peaks' percentiles and what a lower limit would have rejected follow, within one
boundary step (5%): any limit for a log-only rule, one below its own for an enforcing rule.
Other algorithms have no count per window to read: no sizing.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..choices import Algorithm
from ..compiled import MAX_LIMIT
from ..decision import Decision
from ..runtime import runtime
from ..store import Result
from .buffer import RejectionLog, window_hour
from .database import OVER

__all__ = ("BOUNDS", "SIZE_BOUNDS", "Sizing", "bounds_up_to", "note_result", "sizing")

logger = logging.getLogger("django_throttle")

STEP = 1.05  # boundaries 5% apart: every figure is within one step of the exact one


def _bounds(top: int) -> tuple[int, ...]:
    bounds = [1]
    while bounds[-1] < top:
        bounds.append(max(bounds[-1] + 1, math.ceil(bounds[-1] * STEP)))
    return tuple(bounds)


BOUNDS = _bounds(MAX_LIMIT)  # up to any limit a rule can have: 394 boundaries
SIZE_BOUNDS = frozenset(BOUNDS)  # read on the engine's path
_FIXED = Algorithm.FIXED_WINDOW.value


def bounds_up_to(limit: int, log_only: bool = False) -> tuple[int, ...]:
    """The boundaries a rule of this limit counts: those below it, and the limit itself, and
    for a ``log_only`` rule, whose windows count on past the limit, those above it too (its
    rows per hour, at most, with boundary 0)."""
    below = (*BOUNDS[: bisect_left(BOUNDS, limit)], limit)
    return (*below, *BOUNDS[bisect_right(BOUNDS, limit) :]) if log_only else below


# -- from a decision to counts (the hot path) ---------------------------------------------------


def note_result(decision: Decision, result: Result) -> None:
    """Count what one fixed window's result crossed, past the usual case the engine's path
    queues itself (an admitted decision of cost 1): a costly request's boundaries, or a
    rejected one's cost as requests past the rule's own limit (and, a log-only rule's window
    counting on past it, the boundaries its count crossed there)."""
    try:
        if result.allowed:
            if decision.allowed and result.cost > 1:  # else rejected by another rule: nothing
                _costly(result, result.limit - result.remaining)
        else:
            hour = window_hour(result)
            sizes = [((result.rule.name, hour, OVER), result.cost)]
            if result.past and decision.allowed:
                count = result.limit + result.past
                sizes += [
                    ((result.rule.name, hour, bound), 1)
                    for bound in _crossed(count - result.cost, count, result.limit)
                ]
            runtime().part(RejectionLog).add_sizes(sizes)
    except Exception:
        log = runtime().part(RejectionLog)
        if not log.note_failed:
            log.note_failed = True
            logger.exception("django_throttle: a decision could not be counted for sizing")


def _crossed(before: int, after: int, limit: int) -> tuple[int, ...]:
    """The boundaries a window's count passed going from ``before`` to ``after``: those of
    ``BOUNDS`` and the rule's ``limit``, in (before, after]."""
    crossed: tuple[int, ...] = BOUNDS[bisect_right(BOUNDS, before) : bisect_right(BOUNDS, after)]
    if before < limit <= after and limit not in SIZE_BOUNDS:
        crossed = tuple(sorted((*crossed, limit)))
    return crossed


def _costly(result: Result, count: int) -> None:
    """The boundaries a request of cost > 1 crossed: any between its count before and after."""
    crossed = _crossed(count - result.cost, count, result.limit)
    if crossed:
        hour = window_hour(result)
        runtime().part(RejectionLog).add_sizes(
            [((result.rule.name, hour, bound), 1) for bound in crossed]
        )


# -- figures ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizing:
    """The peaks of client windows (p50, p90, p99, max) and what ``limit`` would have
    rejected. Past an enforcing rule's ``rule_limit`` a window's count is not known: a figure
    there is that limit, a lower bound (``censored``)."""

    windows: int  # client windows seen
    p50: int
    p90: int
    p99: int
    max: int
    rule_limit: int
    censored: bool
    limit: int | None = None
    clients_rejected: int | None = None
    requests_rejected: int | None = None

    def as_json(self, rule: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "rule": rule,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
        }
        if self.limit is not None:
            data["limit"] = self.limit
            data["clients_rejected"] = self.clients_rejected
            data["requests_rejected"] = self.requests_rejected
        data["rule_limit"] = self.rule_limit
        return data


def sizing(
    sums: Mapping[int, int], rule_limit: int, limit: int | None = None, log_only: bool = False
) -> Sizing:
    """The figures from boundary sums (``read_sizes``); ``limit`` below ``rule_limit``, or any
    for a ``log_only`` rule, whose windows are counted past its limit."""
    over = sums.get(OVER, 0)
    bounds = bounds_up_to(rule_limit, log_only)
    reached = [sums.get(b, 0) for b in bounds]
    # A window's crossings may be spread over processes' flushes: keep N non-increasing.
    for i in range(len(reached) - 2, -1, -1):
        reached[i] = max(reached[i], reached[i + 1])
    windows = reached[0] if reached else 0
    censored = over > 0 and not log_only

    def at_least(c: float) -> float:
        """How many windows reached c, interpolated between boundaries."""
        if c <= 1:
            return float(windows)
        i = bisect_right(bounds, c) - 1
        if i >= len(bounds) - 1:
            return float(reached[-1]) if c == bounds[-1] else 0.0
        b0, b1 = bounds[i], bounds[i + 1]
        return reached[i] + (reached[i + 1] - reached[i]) * (c - b0) / (b1 - b0)

    def quantile(p: float) -> int:
        """The peak of the ceil(p * windows)-th smallest window (nearest rank)."""
        if not windows:
            return 0
        above = windows - math.ceil(p * windows)  # windows allowed to peak higher
        for i in range(1, len(bounds)):
            if reached[i] <= above:
                b0, b1 = bounds[i - 1], bounds[i]
                n0, n1 = reached[i - 1], reached[i]
                # N(x) falls from n0 at b0 to n1 at b1, linearly between them; the peak
                # sought is x - 1 where N(x) passes ``above`` (each window halfway between
                # two counts of N: the last one in the middle of its step, not at its end).
                x = b0 + (n0 - above - 0.5) * (b1 - b0) / (n0 - n1)
                return max(b0, math.ceil(x) - 1)
        return bounds[-1]

    figures = Sizing(
        windows=windows,
        p50=quantile(0.5),
        p90=quantile(0.9),
        p99=quantile(0.99),
        max=quantile(1.0),
        rule_limit=rule_limit,
        censored=censored,
    )
    if limit is None:
        return figures
    clients = round(at_least(limit + 1))
    # Requests past the limit: sum of N(c) for c from limit + 1 to the rule's limit, or to the
    # last boundary for a log-only rule (N linear within a step: each step's part is an
    # arithmetic series), then those past an enforcing rule's own limit.
    requests = 0.0
    for i, b in enumerate(bounds):
        low = max(b, limit + 1)
        high = bounds[i + 1] - 1 if i + 1 < len(bounds) else b
        if low <= high:
            requests += (high - low + 1) * (at_least(low) + at_least(high)) / 2
    return Sizing(
        windows=figures.windows,
        p50=figures.p50,
        p90=figures.p90,
        p99=figures.p99,
        max=figures.max,
        rule_limit=rule_limit,
        censored=censored,
        limit=limit,
        clients_rejected=clients,
        requests_rejected=round(requests + (0 if log_only else over)),
    )
