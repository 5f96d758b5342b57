"""Property tests of the engine: random timelines against slow, obviously correct models.

The models below follow the CONTRACT's words with exact arithmetic (Fractions
and whole milliseconds); the memory backend runs on an injected clock that
replays the timeline. Times are whole milliseconds since a fixed start.

Why exact models may be compared with the engine's integer/float arithmetic:
windows are keyed in whole seconds, which at whole-millisecond times and periods
of whole seconds is the same as the models' millisecond arithmetic, and the log
records each request at its own microsecond. Buckets are computed exactly, in
units of 1/limit microsecond, except that the stored arrival time is floored to a
whole microsecond: each admitted request of a backlog can make the bucket look up
to 1 us emptier than it is, so less than 40 us over a timeline of at most 40
requests, and only ever in the request's favour. At whole-millisecond times every
margin the models compare (time until the request fits) is a multiple of
1000 / limit us >= 50 us (limits <= 20): a decision the model takes by a non-zero
margin is taken by at least 50 us, more than the drift, and at exactly zero margin
(the request exactly fits) the engine is exact too. So no decision can differ.
Nor can ``remaining``, a whole number of tokens: the models' tokens are multiples
of 1/period_ms, and 40 us of drift is worth 0.04 * limit / period_ms < 1/period_ms
tokens.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_throttle.calendar_windows import CalendarWindows
from django_throttle.compiled import build_rule
from django_throttle.store import Check, MemoryStore, RedisStore, admitted
from tests.engine_helpers import ALGORITHMS, BUCKETS, HOUR, make_rule

START_MS = 1_700_000_000_000
MAX_REQUESTS = 40  # see the module docstring: bounds the buckets' drift below 50 us

PROPERTIES = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- the models ---------------------------------------------------------------


class FixedWindow:
    """At most ``limit`` per window aligned to multiples of the period since the epoch."""

    def __init__(self, limit: int, period_ms: int, burst: int) -> None:
        self.limit, self.period = limit, period_ms
        self.counts: dict[int, int] = {}

    def used(self, t: int) -> int:
        return self.counts.get(t // self.period, 0)

    def allows(self, t: int, cost: int) -> bool:
        return self.used(t) + cost <= self.limit

    def consume(self, t: int, cost: int) -> None:
        self.counts[t // self.period] = self.used(t) + cost

    def remaining(self, t: int) -> int:
        return max(0, self.limit - self.used(t))


class SlidingLog:
    """At most ``limit`` admitted in the trailing interval (t - period, t]."""

    def __init__(self, limit: int, period_ms: int, burst: int) -> None:
        self.limit, self.period = limit, period_ms
        self.admitted: list[int] = []  # one timestamp per unit of cost

    def used(self, t: int) -> int:
        return sum(1 for s in self.admitted if t - self.period < s <= t)

    def allows(self, t: int, cost: int) -> bool:
        return self.used(t) + cost <= self.limit

    def consume(self, t: int, cost: int) -> None:
        self.admitted += [t] * cost

    def remaining(self, t: int) -> int:
        return max(0, self.limit - self.used(t))


class SlidingCounter:
    """Current window's count plus the previous one's, weighted by its overlap with (t - period, t]."""

    def __init__(self, limit: int, period_ms: int, burst: int) -> None:
        self.limit, self.period = limit, period_ms
        self.counts: dict[int, int] = {}

    def used(self, t: int) -> Fraction:
        window = t // self.period
        window_start = window * self.period
        # The previous window is [window_start - period, window_start); the trailing interval
        # starts at t - period: they overlap over window_start - (t - period).
        overlap = Fraction(window_start - (t - self.period), self.period)
        return self.counts.get(window - 1, 0) * overlap + self.counts.get(window, 0)

    def allows(self, t: int, cost: int) -> bool:
        return self.used(t) + cost <= self.limit

    def consume(self, t: int, cost: int) -> None:
        window = t // self.period
        self.counts[window] = self.counts.get(window, 0) + cost

    def remaining(self, t: int) -> int:
        return max(0, math.floor(self.limit - self.used(t)))


class TokenBucket:
    """``burst`` tokens at most, refilled continuously at limit / period; a request takes ``cost``."""

    def __init__(self, limit: int, period_ms: int, burst: int) -> None:
        self.rate = Fraction(limit, period_ms)  # tokens per millisecond
        self.burst = burst
        self.tokens = Fraction(burst)
        self.at: int | None = None

    def current(self, t: int) -> Fraction:
        if self.at is None:
            return self.tokens
        return min(Fraction(self.burst), self.tokens + (t - self.at) * self.rate)

    def allows(self, t: int, cost: int) -> bool:
        return self.current(t) >= cost

    def consume(self, t: int, cost: int) -> None:
        self.tokens, self.at = self.current(t) - cost, t

    def remaining(self, t: int) -> int:
        return math.floor(self.current(t))


class LeakyBucket:
    """A bucket of size ``burst`` draining at limit / period; a request fits while there is room."""

    def __init__(self, limit: int, period_ms: int, burst: int) -> None:
        self.rate = Fraction(limit, period_ms)  # units drained per millisecond
        self.burst = burst
        self.level = Fraction(0)
        self.at: int | None = None

    def current(self, t: int) -> Fraction:
        if self.at is None:
            return self.level
        return max(Fraction(0), self.level - (t - self.at) * self.rate)

    def allows(self, t: int, cost: int) -> bool:
        return self.current(t) + cost <= self.burst

    def consume(self, t: int, cost: int) -> None:
        self.level, self.at = self.current(t) + cost, t

    def remaining(self, t: int) -> int:
        return math.floor(self.burst - self.current(t))


MODELS = {
    "fixed_window": FixedWindow,
    "sliding_window_log": SlidingLog,
    "sliding_window_counter": SlidingCounter,
    "token_bucket": TokenBucket,
    "leaky_bucket": LeakyBucket,
}


def model_of(rule: Any) -> Any:
    return MODELS[rule.algorithm](rule.limit, rule.period * 1000, rule.burst)


# -- timelines ----------------------------------------------------------------


@st.composite
def rules(draw: st.DrawFn, algorithm: str | None = None, rule_id: int = 1) -> Any:
    algorithm = algorithm or draw(st.sampled_from(ALGORITHMS))
    limit = draw(st.integers(1, 20))
    burst = draw(st.integers(1, 20)) if algorithm in BUCKETS else None
    period = draw(st.sampled_from([1, 60]))
    return make_rule(algorithm, limit, period, burst=burst, rule_id=rule_id)


def gaps(period_ms: int, limit: int) -> st.SearchStrategy[int]:
    """Milliseconds between two requests: simultaneous, random, or whole numbers of intervals
    (where a bucket has exactly refilled, a window exactly turned, an entry exactly expired)."""
    return st.one_of(
        st.just(0),
        st.just(period_ms),
        st.integers(0, 2 * period_ms),
        st.integers(1, 2 * limit).map(lambda k: k * period_ms // limit),
    )


@st.composite
def timelines(draw: st.DrawFn, period_ms: int, limit: int) -> list[tuple[int, int]]:
    """(time in ms since START_MS, cost) of each request, non-decreasing in time."""
    t = draw(st.integers(0, period_ms - 1))  # shifts the timeline against the windows
    steps = draw(
        st.lists(st.tuples(gaps(period_ms, limit), st.integers(1, 3)), max_size=MAX_REQUESTS)
    )
    timeline = []
    for gap, cost in steps:
        t += gap
        timeline.append((t, cost))
    return timeline


class Clock:
    """The memory backend's clock, set by the test (``ms``, or ``us`` for finer steps)."""

    def __init__(self) -> None:
        self.us = START_MS * 1000

    @property
    def ms(self) -> int:
        return self.us // 1000

    @ms.setter
    def ms(self, value: int) -> None:
        self.us = value * 1000

    def __call__(self) -> int:
        return self.us


# -- one rule against its model -----------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@PROPERTIES
@given(data=st.data())
def test_every_decision_matches_the_model(algorithm, data):
    rule = data.draw(rules(algorithm))
    timeline = data.draw(timelines(rule.period * 1000, rule.limit))
    clock = Clock()
    store = MemoryStore(clock=clock)
    model = model_of(rule)
    for offset, cost in timeline:
        clock.ms = t = START_MS + offset  # models take epoch milliseconds: windows align to it
        [result] = store.decide([Check(rule, "client", cost)])
        expected = model.allows(t, cost)
        assert result.allowed == expected, (t, cost)
        if expected:
            model.consume(t, cost)
        assert result.remaining == model.remaining(t), (t, cost)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@PROPERTIES
@given(data=st.data())
def test_retry_after_is_exactly_when_the_request_fits(algorithm, data):
    """After a rejection, the same request fits at now + retry_after and not 1 us earlier
    (unless it can never fit: cost above the limit, or the burst of a bucket)."""
    rule = data.draw(rules(algorithm))
    timeline = data.draw(timelines(rule.period * 1000, rule.limit))
    capacity = rule.burst if algorithm in BUCKETS else rule.limit
    clock = Clock()
    store = MemoryStore(clock=clock)
    for done, (t, cost) in enumerate(timeline, start=1):
        clock.ms = START_MS + t
        [result] = store.decide([Check(rule, "client", cost)])
        if result.allowed or cost > capacity:
            continue
        retry_us = round(result.retry_after * 1_000_000)
        assert retry_us > 0
        # Probe a replica, so the timeline itself never sees time go backwards.
        probe_clock, probe = replay(rule, timeline[:done])
        check = Check(rule, "client", cost)
        probe_clock.us = (START_MS + t) * 1000 + retry_us - 1
        assert not probe.decide([check], dry_run=True)[0].allowed
        probe_clock.us += 1
        assert probe.decide([check], dry_run=True)[0].allowed


def replay(rule: Any, timeline: list[tuple[int, int]]) -> tuple[Any, MemoryStore]:
    clock = Clock()
    store = MemoryStore(clock=clock)
    for t, cost in timeline:
        clock.ms = START_MS + t
        store.decide([Check(rule, "client", cost)])
    return clock, store


# -- several rules in one request ---------------------------------------------


@st.composite
def rule_sets(draw: st.DrawFn) -> list[Any]:
    count = draw(st.integers(2, 4))
    drawn = [draw(rules(rule_id=n)) for n in range(1, count + 1)]
    actions = draw(st.lists(st.sampled_from(["reject", "reject", "log"]), min_size=count))
    return [
        make_rule(r.algorithm, r.limit, r.period, burst=r.burst, action=a, rule_id=r.id)
        for r, a in zip(drawn, actions, strict=False)
    ]


@PROPERTIES
@given(data=st.data())
def test_all_or_nothing_across_rules(data):
    """Every enforcing rule admits and every admitting rule is consumed (and a log-only fixed
    window that would reject), or nothing changes."""
    rule_list = data.draw(rule_sets())
    shortest = min(rule_list, key=lambda r: r.period)
    timeline = data.draw(timelines(shortest.period * 1000, max(r.limit for r in rule_list)))
    clock = Clock()
    store = MemoryStore(clock=clock)
    models = [model_of(rule) for rule in rule_list]
    for offset, cost in timeline:
        clock.ms = t = START_MS + offset  # models take epoch milliseconds: windows align to it
        checks = [Check(rule, "client", cost) for rule in rule_list]
        before = [r.remaining for r in store.decide(checks, dry_run=True)]
        results = store.decide(checks)
        expected = [model.allows(t, cost) for model in models]
        assert [r.allowed for r in results] == expected
        let_through = all(
            ok or rule.action == "log" for ok, rule in zip(expected, rule_list, strict=True)
        )
        assert admitted(results) == let_through
        after = [r.remaining for r in store.decide(checks, dry_run=True)]
        if let_through:
            for model, ok, rule in zip(models, expected, rule_list, strict=True):
                # A log-only fixed window counts on past its limit (what sizing reads).
                if ok or (rule.action == "log" and rule.algorithm == "fixed_window"):
                    model.consume(t, cost)
        else:
            assert after == before
        assert after == [model.remaining(t) for model in models]


# -- Redis and memory agree -----------------------------------------------------


@pytest.fixture(scope="module")
def redis_store(redis_server: Any) -> Any:
    client = redis_server.client()
    yield RedisStore(client)
    client.close()


@st.composite
def hourly_rule_sets(draw: st.DrawFn) -> list[Any]:
    count = draw(st.integers(1, 3))
    return [
        make_rule(
            algorithm,
            draw(st.integers(1, 20)),
            HOUR,
            burst=draw(st.integers(1, 20)) if algorithm in BUCKETS else None,
            action=draw(st.sampled_from(["reject", "reject", "log"])),
            rule_id=n,
        )
        for n, algorithm in enumerate(
            [draw(st.sampled_from(ALGORITHMS)) for _ in range(count)], start=1
        )
    ]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(PROPERTIES, max_examples=30)
@given(
    extra_rules=hourly_rule_sets(),
    limit=st.integers(1, 20),
    burst=st.integers(1, 20),
    costs=st.lists(st.integers(1, 3), min_size=1, max_size=30),
)
def test_redis_and_memory_agree_on_a_burst(
    redis_store, algorithm, extra_rules, limit, burst, costs
):
    """Both backends decide a burst of requests the same way, alone and with other rules.

    Redis keeps its own time, so the sequence must not depend on it: per hour, the
    quickest refill (20 per hour, one every 180 s) is far slower than a burst of
    30 requests, and the burst is kept inside one hour-long window.
    """
    rule = make_rule(
        algorithm, limit, HOUR, burst=burst if algorithm in BUCKETS else None, rule_id=9
    )
    rule_list = [rule, *extra_rules]
    redis_store.client.flushdb()
    seconds, _ = redis_store.client.time()
    if HOUR - seconds % HOUR < 5:  # about to turn the hour: wait for the next one
        time.sleep(HOUR - seconds % HOUR)
    memory = MemoryStore()
    for cost in costs:
        checks = [Check(r, "client", cost) for r in rule_list]
        from_redis = redis_store.decide(checks)
        from_memory = memory.decide(checks)
        assert [(r.allowed, r.remaining) for r in from_redis] == [
            (r.allowed, r.remaining) for r in from_memory
        ]
        assert admitted(from_redis) == admitted(from_memory)


# -- give-backs: what stays counted never exceeds what the rule allows ------------------------
#
# Requests are admitted and some of their costs given back later (count_statuses' give-back of
# an uncounted response, refund()), by the engine's own path: split() and taken(), then the
# store's refund. After every step the requests' counted costs (what they took less what they
# gave back) are held to the rule's bound, in exact integers of microseconds:
#   fixed window        at most limit per window;
#   sliding window log  at most limit in any trailing interval (t - period, t];
#   counter             at each admission, the counted costs of its window and the previous
#                       one's, weighted by its overlap, within limit (what it admitted by);
#   buckets             any run of admissions i..j counts at most burst + (t_j - t_i) / interval
#                       (GCRA's conformance: a bucket fed the counted requests alone admits
#                       every one of them).
# Periods and limits are drawn so that an interval is a whole number of microseconds: the
# stored arrival time is floored to one, which would otherwise admit up to 1 us early.


def exceeded(rule: Any, taken: list[tuple[int, int]]) -> str | None:
    """Where the counted requests, (admission time in us, counted cost) in admission order,
    break the rule's bound; None if nowhere."""
    limit, period = rule.limit, rule.period * 1_000_000
    counted = [(t, c) for t, c in taken if c > 0]
    if rule.algorithm == "fixed_window":
        windows: dict[int, int] = {}
        for t, c in counted:
            if rule.calendar is not None:
                w = rule.calendar.window(t // 1_000_000)[0]
            else:
                w = t // 1_000_000 // rule.period
            windows[w] = windows.get(w, 0) + c
            if windows[w] > limit:
                return f"window {w} counts {windows[w]}"
    elif rule.algorithm == "sliding_window_log":
        for end, _ in counted:
            inside = sum(c for t, c in counted if end - period < t <= end)
            if inside > limit:
                return f"{inside} in the period up to {end}"
    elif rule.algorithm == "sliding_window_counter":
        for j, (now, _) in enumerate(taken):
            if taken[j][1] == 0:
                continue
            w = now // 1_000_000 // rule.period
            left = (w + 1) * period - now
            so_far = [(t // 1_000_000 // rule.period, c) for t, c in taken[: j + 1]]
            current = sum(c for tw, c in so_far if tw == w)
            previous = sum(c for tw, c in so_far if tw == w - 1)
            if previous * left + current * period > limit * period:
                return f"the admission at {now} counts {current} + {previous} weighted"
    else:
        for j in range(len(counted)):
            units = 0
            for i in range(j, -1, -1):
                units += counted[i][1]
                span = counted[j][0] - counted[i][0]
                if (units - rule.burst) * period > span * limit:
                    return f"{units} between {counted[i][0]} and {counted[j][0]}"
    return None


@st.composite
def exact_rules(draw: st.DrawFn, algorithm: str) -> Any:
    if algorithm == "calendar":
        # A fixed window of a calendar week (Monday 00:00 UTC), whose windows the plan's
        # gaps of up to two periods cross.
        return build_rule(
            id=1,
            name="weekly",
            algorithm="fixed_window",
            limit=draw(st.integers(1, 10)),
            period=WEEK,
            calendar=CalendarWindows("week", 1, "UTC"),
        )
    period = draw(st.sampled_from([1, 60]))
    limit = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 10, 16, 20]))
    if period * 1_000_000 % limit:
        limit = 4
    burst = draw(st.integers(1, 4)) if algorithm in BUCKETS else None
    return make_rule(algorithm, limit, period, burst=burst)


WEEK = 7 * 86400


def steps(period_ms: int, limit: int) -> st.SearchStrategy[list[tuple[str, int, int, int]]]:
    """(what, gap in us, cost or which request, how much): admissions and give-backs, the gaps
    often whole intervals (a bucket's request has just ended its interval, a window turned)."""
    interval = period_ms * 1000 // limit
    gap = st.one_of(
        st.just(0),
        st.integers(1, 3).map(lambda k: k * interval),
        st.integers(1, 20_000),
        st.integers(0, 2 * period_ms * 1000),
    )
    step = st.tuples(
        st.sampled_from(["admit", "admit", "give"]),
        gap,
        st.integers(0, 3),  # a cost; or which request gives back: 0 the oldest still holding
        st.integers(1, 3),  # how much it gives back
    )
    return st.lists(step, max_size=MAX_REQUESTS)


def play(store: Any, rule: Any, plan: Any, advance: Any) -> None:
    """Admissions and give-backs of ``plan`` against ``store``, held to the rule's bound after
    every step; ``advance(us)`` moves the store's clock (or waits, for Redis)."""
    from django_throttle.engine.refunds import taken
    from django_throttle.engine.request_state import split

    admissions: list[list[Any]] = []  # [admission time, counted cost, what it still holds]
    for what, gap, n, amount in plan:
        advance(gap)
        if what == "admit":
            [result] = store.decide([Check(rule, "client", n + 1)])
            if result.allowed:
                admissions.append([result.at, n + 1, result])
        else:
            holding = [a for a in admissions if a[2] is not None]
            if not holding:
                continue
            entry = holding[n % len(holding)]
            part, entry[2] = split(entry[2], amount)
            entry[1] -= part.cost
            for at, _, checks in taken([part]):
                store.refund(checks, at)
        broken = exceeded(rule, [(at, c) for at, c, _ in admissions])
        assert broken is None, broken


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, "calendar"])
@settings(PROPERTIES, max_examples=300)
@given(data=st.data())
def test_give_backs_never_let_the_counted_requests_exceed_the_rule(algorithm, data):
    """Memory backend, its clock stepped by the plan."""
    rule = data.draw(exact_rules(algorithm))
    plan = data.draw(steps(rule.period * 1000, rule.limit))
    clock = Clock()
    clock.us += data.draw(st.integers(0, rule.period * 1_000_000 - 1))

    def advance(us: int) -> None:
        clock.us += us

    play(MemoryStore(clock=clock), rule, plan, advance)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(PROPERTIES, max_examples=6)
@given(data=st.data())
def test_give_backs_never_let_the_counted_requests_exceed_the_rule_on_redis(
    redis_store, algorithm, data
):
    """Redis keeps its own time: the plan's gaps are slept (scaled down to 1-second periods
    with intervals of 50 to 100 ms), and the bound is checked at the times Redis decided at,
    so what the sleeps come to changes which requests are admitted, never the assertion."""
    limit = data.draw(st.sampled_from([10, 20]))
    burst = data.draw(st.integers(1, 4)) if algorithm in BUCKETS else None
    rule = make_rule(algorithm, limit, 1, burst=burst, rule_id=7)
    plan = data.draw(steps(1000, limit).map(lambda s: s[:20]))
    redis_store.client.flushdb()
    play(redis_store, rule, plan, lambda us: time.sleep(min(us, 120_000) / 1_000_000))
