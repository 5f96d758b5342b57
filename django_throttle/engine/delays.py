"""Holding a request for a delay rule, within MAX_DELAYED and MAX_DELAYED_PER_CLIENT."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from ..choices import Action
from ..conf import conf
from ..decision import Decision
from ..store import Check, Result

_DELAY = str(Action.DELAY)

AUTO_MAX_DELAYED = 10  # MAX_DELAYED "auto": the most held at once, in threads or not


def delay_of(decision: Decision) -> float:
    """How long to hold an admitted request; never longer than its rule's queue allows."""
    if decision.delay <= 0:
        return 0.0
    longest = max(
        (r.rule.burst * r.rule.period / r.rule.limit for r in decision.results), default=0.0
    )
    return min(decision.delay, longest)


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

    def enter(self, held: Held, threads: int) -> bool:
        """Hold ``held`` if the caps leave room (``threads``: the most seen serving at once)."""
        cap = conf.MAX_DELAYED
        per_client = conf.MAX_DELAYED_PER_CLIENT
        with self._lock:
            if cap == "auto":
                if self.held >= AUTO_MAX_DELAYED:
                    return False
                if held.in_thread and self.in_threads >= max(1, threads // 2):
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

    def turned_away_before(self, checks: Sequence[Check]) -> Result | None:
        """The rejection of a request whose client has MAX_DELAYED_PER_CLIENT requests held in
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
            return Result(
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
        return None


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
