"""The in-process backend: decide.lua's semantics in Python, line for line, for one process
(the embedded default without Redis, and the local fallback while Redis is unreachable)."""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

from ..choices import Algorithm
from ..compiled import GROWN_BLOCK_CAP, CompiledRule, outcomes_rule
from ..conf import conf
from .base import Check, Result, block_key, level_key, state_key

US = 1_000_000
SWEEP_EVERY = 1024  # writes between two sweeps of expired state
DEFAULT_MAX_KEYS = 100_000


def _clamp(value: float) -> int:
    return 0 if value < 0 else math.floor(value + 1e-9)


def _fixed_window(rule: CompiledRule, now_s: int) -> tuple[int, int, int]:
    """The fixed window holding ``now_s``: its number (a calendar window's: its start), its
    start and its end, in seconds."""
    if rule.calendar is None:
        w = now_s // rule.period
        return w, w * rule.period, (w + 1) * rule.period
    starts, ends = rule.calendar.window(now_s)
    return starts, starts, ends


def _time(entry: tuple[int, int]) -> int:
    return entry[0]


def _without(entries: list[tuple[int, int]], at: int, cost: int) -> list[tuple[int, int]]:
    """A log with ``cost`` units given back from the entries of a decision at ``at`` (0: from
    the newest entries), as refund.lua does."""
    kept = list(entries)
    left = cost
    j = len(kept) - 1
    while left > 0 and j >= 0:
        logged, units = kept[j]
        if at and logged != at:
            if logged < at:
                break
            j -= 1
            continue
        if units <= left:
            del kept[j]
            left -= units
        else:
            kept[j] = (logged, units - left)
            left = 0
        j -= 1
    return kept


def _now_us() -> int:
    return time.time_ns() // 1000


Commit = Callable[[], None] | None
Evaluation = tuple[bool, int, int, float, float, float, Commit]


class MemoryStore:
    """Thread-safe, with bounded memory: expired state is swept, and past ``max_keys`` the
    least recently written state is dropped (which can only admit more, never fewer)."""

    def __init__(
        self, clock: Callable[[], int] = _now_us, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        self._clock = clock
        self.max_keys = max_keys
        self._lock = threading.Lock()
        # key -> [state, expires_at_us]; dict order is write order, oldest first.
        self._state: dict[str, list[Any]] = {}
        self._writes = 0

    def __len__(self) -> int:
        return len(self._state)

    def clear(self) -> None:
        with self._lock:
            self._state.clear()

    # -- the store interface ------------------------------------------------

    def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        with self._lock:
            now = self._clock()
            evaluations = []
            blocks = []
            admitted = True
            for check in checks:
                rule = check.rule
                key = state_key(rule, check.identity)
                bkey = block_key(rule, check.identity)
                evaluation, blocked = self._blocked(bkey, now)
                if evaluation is None:
                    evaluation = self._evaluate(rule, key, now, check.cost)
                    if not evaluation[0] and rule.block and not rule.defers_block and not dry_run:
                        evaluation, blocked = self._block(rule, bkey, now, evaluation), True
                if not evaluation[0] and rule.enforcing:
                    admitted = False
                evaluations.append(evaluation)
                blocks.append(blocked)
            commit = admitted and not dry_run
            results = []
            for check, blocked, (ok, rem_after, rem_now, reset_after, retry, delay, write) in zip(
                checks, blocks, evaluations, strict=True
            ):
                # A rejection may write too: a log-only window counted past its limit.
                counted = False
                if commit and write is not None:
                    write()
                    counted = True
                remaining = rem_after if counted else rem_now
                results.append(
                    Result(
                        rule=check.rule,
                        identity=check.identity,
                        allowed=ok,
                        limit=check.rule.limit,
                        remaining=max(remaining, 0),
                        reset_at=(now + math.ceil(reset_after)) / US,
                        retry_after=math.ceil(retry) / US,
                        delay=math.ceil(delay) / US,
                        blocked=blocked,
                        at=now,
                        cost=check.cost,
                        past=max(-remaining, 0),
                    )
                )
            return results

    def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        """refund.lua's semantics: the decision's window, its log entries, what is left of the
        bucket's time the decision took; a negative cost charges (_charge)."""
        with self._lock:
            now = self._clock()
            moment = at or now
            for check in checks:
                rule = check.rule
                key = state_key(rule, check.identity)
                if check.cost < 0:
                    self._charge(rule, key, now, -check.cost)
                    continue
                entry = self._state.get(key)
                if entry is None or entry[1] <= now:
                    continue
                state, cost = entry[0], check.cost
                algorithm = rule.algorithm
                if algorithm == Algorithm.FIXED_WINDOW:
                    w = _fixed_window(rule, moment // US)[0]
                    if state[0] == w:
                        entry[0] = (w, max(0, state[1] - cost))
                elif algorithm == Algorithm.SLIDING_WINDOW_COUNTER:
                    w = (moment // US) // rule.period
                    if state[0] == w:
                        entry[0] = (w, max(0, state[1] - cost), state[2])
                    elif state[0] == w + 1:
                        entry[0] = (state[0], state[1], max(0, state[2] - cost))
                elif algorithm in (Algorithm.SLIDING_WINDOW_LOG, Algorithm.CONCURRENCY):
                    entry[0] = _without(state, at, cost)
                else:
                    held = math.floor(cost * rule.period * US / rule.limit)
                    if check.until and at:
                        held = min(held, check.until - now)  # what is left of its interval
                    if held <= 0:
                        continue
                    back = state - held
                    if back <= now:
                        del self._state[key]
                    else:
                        entry[0], entry[1] = back, back

    def _charge(self, rule: CompiledRule, key: str, now: int, cost: int) -> None:
        """refund.lua's charge: ``cost`` units more, counted now, even past the limit."""
        algorithm = rule.algorithm
        stored = self._get(key, now)
        if algorithm == Algorithm.FIXED_WINDOW:
            w, _starts, ends = _fixed_window(rule, now // US)
            count = stored[1] if stored is not None and stored[0] == w else 0
            self._set(key, (w, count + cost), now, ends * US - now)
        elif algorithm == Algorithm.SLIDING_WINDOW_COUNTER:
            period = rule.period * US
            w = (now // US) // rule.period
            cur = prev = 0
            if stored is not None:
                if stored[0] == w:
                    cur, prev = stored[1], stored[2]
                elif stored[0] == w - 1:
                    prev = stored[1]
            self._set(key, (w, cur + cost, prev), now, (w + 2) * period - now)
        elif algorithm == Algorithm.SLIDING_WINDOW_LOG:
            floor = now - rule.period * US
            entries: list[tuple[int, int]] = stored or []
            kept = [*entries[bisect_right(entries, (floor, math.inf)) :], (now, cost)]
            kept.sort(key=_time)
            self._set(key, kept, now, kept[-1][0] - now + rule.period * US)
        elif algorithm in (Algorithm.TOKEN_BUCKET, Algorithm.LEAKY_BUCKET):
            tat = max(stored or 0, now) + math.floor(cost * rule.period * US / rule.limit)
            self._set(key, tat, now, tat - now)

    def block(self, checks: Sequence[Check], seconds: int) -> None:
        """block.lua's semantics: each check's client rejected under its rule for ``seconds``."""
        with self._lock:
            now = self._clock()
            for check in checks:
                self._set(block_key(check.rule, check.identity), 1, now, seconds * US)

    def reset(self, rule: CompiledRule, identity: str) -> None:
        with self._lock:
            self._state.pop(state_key(rule, identity), None)
            self._state.pop(block_key(rule, identity), None)
            self._state.pop(level_key(rule, identity), None)
            if rule.defers_block:
                self._state.pop(state_key(outcomes_rule(rule), identity), None)

    # -- block durations (see decide.lua) ---------------------------------------

    def _blocked(self, bkey: str, now: int) -> tuple[Evaluation | None, bool]:
        """A rejection while the client is blocked under this rule (by a rejection of a rule
        with a block duration, or by block()), else (None, False)."""
        entry = self._state.get(bkey)
        if entry is None or entry[1] <= now:
            return None, False
        left = math.ceil((entry[1] - now) / 1000) * 1000  # whole milliseconds, as PTTL
        return (False, 0, 0, left, left, 0.0, None), True

    def _block(self, rule: CompiledRule, bkey: str, now: int, rejected: Evaluation) -> Evaluation:
        """Start the block of a client this rule has just rejected."""
        block = (self._grown(rule, bkey, now) if rule.block_growth > 1 else rule.block) * US
        self._set(bkey, 1, now, block)
        ok, rem_after, rem_now, reset_after, retry, delay, write = rejected
        retry = max(retry, block)
        return ok, rem_after, rem_now, max(reset_after, retry), retry, delay, write

    def _grown(self, rule: CompiledRule, bkey: str, now: int) -> int:
        """As decide.lua starts a growing block: the seconds of this block, the client's level
        kept beside the block for the block and BLOCK_MEMORY."""
        lkey = bkey + "g"
        level: int = self._get(lkey, now) or 0
        # Past 64 levels any growth of 2 or more has reached the cap.
        seconds = rule.block * int(rule.block_growth ** min(level, 64))
        seconds = min(seconds, max(GROWN_BLOCK_CAP, rule.block))
        self._set(lkey, level + 1, now, (seconds + conf.BLOCK_MEMORY) * US)
        return seconds

    def block_levels(self, checks: Sequence[Check]) -> list[int]:
        with self._lock:
            now = self._clock()
            return [self._get(level_key(c.rule, c.identity), now) or 0 for c in checks]

    # -- state ----------------------------------------------------------------

    def _get(self, key: str, now: int) -> Any:
        entry = self._state.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._state[key]
            return None
        return entry[0]

    def _set(self, key: str, value: Any, now: int, ttl_us: float) -> None:
        state = self._state
        state.pop(key, None)
        state[key] = [value, now + max(1000, math.ceil(ttl_us / 1000) * 1000)]
        self._writes += 1
        if self._writes % SWEEP_EVERY == 0:
            self._sweep(now)
        while len(state) > self.max_keys:
            del state[next(iter(state))]

    def _sweep(self, now: int) -> None:
        for key in [k for k, (_, expires) in self._state.items() if expires <= now]:
            del self._state[key]

    # -- the algorithms (see decide.lua for the reasoning) ---------------------

    def _evaluate(self, rule: CompiledRule, key: str, now: int, cost: int) -> Evaluation:
        limit, period = rule.limit, rule.period * US
        algorithm = rule.algorithm
        if algorithm == Algorithm.FIXED_WINDOW:
            window = _fixed_window(rule, now // US)  # in whole seconds, as decide.lua
            return self._fixed_window(key, now, limit, window, cost, not rule.enforcing)
        if algorithm == Algorithm.SLIDING_WINDOW_LOG:
            return self._sliding_window_log(key, now, limit, period, cost)
        if algorithm == Algorithm.CONCURRENCY:
            # The log's state, whose entries (leases) refund() ends early.
            ok, rem_after, rem_now, reset_after, retry, delay, write = self._sliding_window_log(
                key, now, limit, period, cost
            )
            return ok, rem_after, rem_now, reset_after, min(retry, US), delay, write
        if algorithm == Algorithm.SLIDING_WINDOW_COUNTER:
            return self._sliding_window_counter(key, now, limit, period, cost)
        return self._bucket(
            key, now, limit, period, rule.burst, cost, algorithm == Algorithm.LEAKY_BUCKET
        )

    def _fixed_window(
        self,
        key: str,
        now: int,
        limit: int,
        window: tuple[int, int, int],
        cost: int,
        log_only: bool = False,
    ) -> Evaluation:
        """``window``: its number (a calendar window's: its start), start and end, in seconds.
        A ``log_only`` rule's window goes on counting past its limit (decide.lua)."""
        w, starts, ends = window
        stored = self._get(key, now)
        count = stored[1] if stored is not None and stored[0] == w else 0
        reset_after = ends * US - now

        def write() -> None:
            self._set(key, (w, count + cost), now, reset_after)

        if count + cost <= limit:
            return True, limit - count - cost, limit - count, reset_after, 0, 0, write
        retry = (ends - starts) * US if cost > limit else reset_after
        remaining = _clamp(limit - count)
        if log_only:
            return False, limit - count - cost, remaining, reset_after, retry, 0, write
        return False, remaining, remaining, reset_after, retry, 0, None

    def _sliding_window_log(
        self, key: str, now: int, limit: int, period: int, cost: int
    ) -> Evaluation:
        # (time, units) per admitted request, as decide.lua keeps one member per request.
        floor = now - period
        entries: list[tuple[int, int]] = self._get(key, now) or []
        live = entries[bisect_right(entries, (floor, math.inf)) :]
        count = sum(units for _, units in live)
        if count + cost <= limit:

            def write() -> None:
                kept = [*live, (now, cost)]
                kept.sort(key=_time)  # already sorted, unless the clock stepped back
                self._set(key, kept, now, kept[-1][0] - now + period)

            return True, limit - count - cost, limit - count, period, 0, 0, write
        reset_after = live[-1][0] + period - now if live else 0
        retry = period
        if cost <= limit:
            need = count + cost - limit  # units that must expire first
            for logged, units in live:
                need -= units
                if need <= 0:
                    retry = logged + period - now
                    break
        remaining = _clamp(limit - count)
        return False, remaining, remaining, reset_after, retry, 0, None

    def _sliding_window_counter(
        self, key: str, now: int, limit: int, period: int, cost: int
    ) -> Evaluation:
        w = (now // US) // (period // US)  # in whole seconds, as decide.lua
        cur = prev = 0
        stored = self._get(key, now)
        if stored is not None:
            if stored[0] == w:
                cur, prev = stored[1], stored[2]
            elif stored[0] == w - 1:
                prev = stored[1]
        elapsed = now - w * period
        left = period - elapsed
        weighted = prev * left / period
        ttl = (w + 2) * period - now
        if prev * left + (cur + cost) * period <= limit * period:

            def write() -> None:
                self._set(key, (w, cur + cost, prev), now, ttl)

            return (
                True,
                _clamp(limit - cur - cost - weighted),
                _clamp(limit - cur - weighted),
                ttl,
                0,
                0,
                write,
            )
        reset_after = left if cur == 0 else ttl
        if cost > limit:
            retry: float = ttl
        elif cur + cost <= limit:
            retry = math.ceil(period - (limit - cur - cost) * period / prev) - elapsed
        else:
            retry = left + max(0, math.ceil(period - (limit - cost) * period / cur))
        remaining = _clamp(limit - cur - weighted)
        return False, remaining, remaining, reset_after, retry, 0, None

    def _bucket(
        self,
        key: str,
        now: int,
        limit: int,
        period: int,
        burst: int,
        cost: int,
        is_leaky: bool,
    ) -> Evaluation:
        # In units of 1/limit microsecond, as decide.lua: exact arithmetic.
        tat = self._get(key, now) or 0
        backlog = (tat - now) * limit if tat > now else 0
        tau = burst * period
        new_backlog = backlog + cost * period
        remaining_now = _clamp((tau - backlog) / period)
        if new_backlog <= tau:

            def write() -> None:
                self._set(key, now + math.floor(new_backlog / limit), now, new_backlog / limit)

            delay = backlog / limit if is_leaky else 0
            return (
                True,
                _clamp((tau - new_backlog) / period),
                remaining_now,
                new_backlog / limit,
                0,
                delay,
                write,
            )
        retry = period if cost > burst else (new_backlog - tau) / limit
        return False, remaining_now, remaining_now, backlog / limit, retry, 0, None
