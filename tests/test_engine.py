"""Conformance suite of the engine: the same behaviours, held by the Redis and memory backends.

The memory backend runs on an injected clock, so time only moves when a test
moves it. The Redis backend runs on the server's clock: tests that depend on
time either use periods long enough that nothing refills while they run, or
wait on the server's clock (``wait``, ``wait_until``, ``align``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from django_throttle.compiled import build_rule, outcomes_rule
from django_throttle.store import Check, MemoryStore, RedisStore, Result, admitted, state_key
from django_throttle.store.redis import DECIDE_SHA
from tests.engine_helpers import ALGORITHMS, BUCKETS, HOUR, US, make_rule

CLIENT = "ip:203.0.113.7"


class MemoryBackend:
    """A MemoryStore whose clock moves only when the test moves it."""

    name = "memory"

    def __init__(self) -> None:
        self.clock_us = 1_700_000_000 * US + 250_000
        self.store = MemoryStore(clock=lambda: self.clock_us)

    def now(self) -> float:
        return self.clock_us / US

    def wait(self, seconds: float) -> None:
        self.clock_us += round(seconds * US)

    def wait_until(self, epoch: float) -> None:
        self.clock_us = max(self.clock_us, round(epoch * US))

    def keys(self) -> list[str]:
        return list(self.store._state)

    def log_size(self, key: str) -> int:
        entry = self.store._state.get(key)
        return 0 if entry is None else len(entry[0])

    def close(self) -> None:
        pass


class RedisBackend:
    """A RedisStore on the harness server; waits poll the server's clock (TIME)."""

    name = "redis"

    def __init__(self, server: Any) -> None:
        self.client = server.client()
        self.store = RedisStore(self.client)

    def now(self) -> float:
        seconds, micros = self.client.time()
        return seconds + micros / US

    def wait(self, seconds: float) -> None:
        self.wait_until(self.now() + seconds)

    def wait_until(self, epoch: float) -> None:
        while (left := epoch - self.now()) > 0:
            time.sleep(left)

    def keys(self) -> list[str]:
        return [key.decode() for key in self.client.keys("*")]

    def log_size(self, key: str) -> int:
        return self.client.zcount(key, "(0", "+inf")  # requests, not the tally of extra units

    def close(self) -> None:
        self.client.close()


Backend = MemoryBackend | RedisBackend


def align(backend: Backend, offset: float, period: int = 1) -> None:
    """Wait until ``offset`` seconds after the next multiple of ``period`` since the epoch."""
    boundary = (math.floor(backend.now()) // period + 1) * period
    backend.wait_until(boundary + offset)


def clear_of_boundary(backend: Backend, period: int) -> None:
    """Make sure the next few seconds stay inside one window of ``period`` (at most a short wait)."""
    if period - backend.now() % period < 5:
        align(backend, 0.0, period)


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        made: Backend = MemoryBackend()
    else:
        made = RedisBackend(request.getfixturevalue("redis_server"))
    yield made
    made.close()


def one(backend: Backend, rule: Any, cost: int = 1, identity: str = CLIENT, **kw: Any) -> Result:
    [result] = backend.store.decide([Check(rule, identity, cost)], **kw)
    return result


def flood(backend: Backend, rule: Any, attempts: int, cost: int = 1) -> list[Result]:
    return [one(backend, rule, cost) for _ in range(attempts)]


# -- limits -------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_admits_exactly_limit_then_rejects(backend, algorithm):
    rule = make_rule(algorithm, limit=5)
    clear_of_boundary(backend, HOUR)
    for expected_remaining in (4, 3, 2, 1, 0):
        result = one(backend, rule)
        assert result.allowed
        assert result.limit == 5
        assert result.remaining == expected_remaining
        assert result.retry_after == 0
        assert result.reset_at > backend.now()
    for _ in range(3):  # rejections consume nothing, so they keep being rejected the same way
        result = one(backend, rule)
        assert not result.allowed
        assert result.remaining == 0
        assert result.retry_after > 0
        assert result.reset_at > backend.now()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_recovers_after_retry_after(backend, algorithm):
    rule = make_rule(algorithm, limit=10, period=1)
    align(backend, 0.0, 1)  # the flood within one window, even on a loaded machine
    results = flood(backend, rule, 40)
    rejected = next(r for r in results if not r.allowed)
    assert 0 < rejected.retry_after <= 2
    backend.wait(rejected.retry_after)
    if algorithm == "fixed_window":
        # A new window: the whole limit is back.
        assert [r.allowed for r in flood(backend, rule, 11)] == [True] * 10 + [False]
    else:
        assert one(backend, rule).allowed
    if algorithm == "sliding_window_log":
        # Admitting dropped the entries that left the window: the log stays within the limit.
        assert backend.log_size(state_key(rule, CLIENT)) <= 10


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_counts_against_the_limit(backend, algorithm):
    rule = make_rule(algorithm, limit=10)
    clear_of_boundary(backend, HOUR)
    first, second, third = flood(backend, rule, 3, cost=4)
    assert (first.allowed, first.remaining) == (True, 6)
    assert (second.allowed, second.remaining) == (True, 2)
    assert (third.allowed, third.remaining) == (False, 2)
    assert third.retry_after > 0
    last = one(backend, rule, cost=2)
    assert (last.allowed, last.remaining) == (True, 0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_above_limit_is_never_admitted(backend, algorithm):
    rule = make_rule(algorithm, limit=3)
    clear_of_boundary(backend, HOUR)
    big = one(backend, rule, cost=4)
    assert not big.allowed
    assert big.remaining == 3
    assert big.retry_after > 0
    # It consumed nothing: the whole limit is still there.
    assert [r.allowed for r in flood(backend, rule, 4)] == [True, True, True, False]
    assert not one(backend, rule, cost=4).allowed


# -- buckets ------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_bucket_burst_then_one_per_interval(backend, algorithm):
    rule = make_rule(algorithm, limit=1, period=1, burst=3)
    results = flood(backend, rule, 4)
    assert [r.allowed for r in results] == [True, True, True, False]
    assert 0 < results[-1].retry_after <= 1
    if backend.name == "memory":
        assert results[-1].retry_after == 1
    backend.wait(results[-1].retry_after)
    assert [r.allowed for r in flood(backend, rule, 2)] == [True, False]


# Each of these rejected a request that exactly fitted before the fix, at the memory backend's
# starting time (1_700_000_000.25 s); on Redis the time is whatever the server's clock says.
@pytest.mark.parametrize(
    ("limit", "period", "burst"),
    [(6, 1, 1), (7, 1, 1), (9, 60, 1), (13, HOUR, 13), (17, HOUR, 17), (34, HOUR, 34)],
)
@pytest.mark.parametrize("algorithm", BUCKETS)
def test_bucket_with_exactly_enough_room_admits(backend, algorithm, limit, period, burst):
    """Regression: where period / limit is not a whole number of microseconds, floating point
    at the scale of the epoch rejected a request that exactly filled the bucket."""
    rule = make_rule(algorithm, limit=limit, period=period, burst=burst)
    assert [r.allowed for r in flood(backend, rule, burst + 1)] == [True] * burst + [False]


def test_leaky_bucket_delays_each_admitted_request_by_its_turn(backend):
    interval = 15.0  # 4 per minute
    rule = make_rule("leaky_bucket", limit=4, period=60)
    started = backend.now()
    results = flood(backend, rule, 5)
    # On Redis the server's clock moves between calls, and the wait shrinks by as much.
    elapsed = backend.now() - started
    assert [r.allowed for r in results] == [True, True, True, True, False]
    for turn, result in enumerate(results[:4]):
        assert turn * interval - elapsed - 1e-6 <= result.delay <= turn * interval
    assert results[0].delay == 0
    assert results[4].delay == 0


def test_token_bucket_never_delays(backend):
    rule = make_rule("token_bucket", limit=4, period=60)
    assert [r.delay for r in flood(backend, rule, 5)] == [0, 0, 0, 0, 0]


# -- windows ------------------------------------------------------------------


def test_sliding_window_log_keeps_only_admitted_requests(backend):
    rule = make_rule("sliding_window_log", limit=5)
    key = state_key(rule, CLIENT)
    assert sum(r.allowed for r in flood(backend, rule, 20)) == 5
    assert backend.log_size(key) == 5

    costly = make_rule("sliding_window_log", limit=10, rule_id=2)
    costly_key = state_key(costly, CLIENT)
    assert [r.allowed for r in flood(backend, costly, 4, cost=3)] == [True, True, True, False]
    # A costly request is one entry (its units counted in it), not one entry per unit.
    assert backend.log_size(costly_key) == 3
    assert one(backend, costly, dry_run=True).remaining == 1


def test_sliding_window_counter_weights_the_previous_window(backend):
    """10 per second, 10 used in window w; 0.42 s into w+1 the previous window still counts
    10 * 0.58 = 5.8, so 4 more fit (5.8 + 4 <= 10), not 5."""
    rule = make_rule("sliding_window_counter", limit=10, period=1)
    for _attempt in range(5):
        backend.store.reset(rule, CLIENT)
        window = math.floor(backend.now())
        exhausting = flood(backend, rule, 11)
        align(backend, 0.42)
        start = backend.now()
        results = flood(backend, rule, 6)
        end = backend.now()
        # Retry unless the first burst ran in one window and the second 0.42 to 0.5 s into
        # the next one (the server's clock is not ours to stop).
        if math.floor(start) == math.floor(end) == window + 1 and end % 1 < 0.5:
            break
    else:
        pytest.fail("could not run 6 requests within 80 ms in five attempts")
    assert [r.allowed for r in exhausting] == [True] * 10 + [False]
    assert [r.allowed for r in results] == [True] * 4 + [False] * 2
    if backend.name == "memory":
        assert [r.remaining for r in results] == [3, 2, 1, 0, 0, 0]


@pytest.mark.parametrize(("elapsed", "fits"), [(0, 0), (0.1, 1), (0.35, 3), (0.5, 5), (0.99, 9)])
def test_sliding_window_counter_weight_is_the_overlap(elapsed, fits):
    """Exact, on an injected clock: after 10 in window w, ``elapsed`` into w+1 fits 10 * elapsed."""
    backend = MemoryBackend()
    rule = make_rule("sliding_window_counter", limit=10, period=1)
    align(backend, 0.0)
    assert sum(r.allowed for r in flood(backend, rule, 11)) == 10
    align(backend, elapsed)
    assert sum(r.allowed for r in flood(backend, rule, 11)) == fits


# -- several rules in one request ---------------------------------------------


def remaining(backend: Backend, rules: list[Any]) -> list[int]:
    results = backend.store.decide([Check(rule, CLIENT) for rule in rules], dry_run=True)
    return [r.remaining for r in results]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_rejected_request_consumes_from_no_rule(backend, algorithm):
    roomy = make_rule(algorithm, limit=10, rule_id=1)
    other = make_rule(algorithm, limit=10, rule_id=2)
    tight = make_rule(algorithm, limit=1, rule_id=3)
    rules = [roomy, other, tight]
    clear_of_boundary(backend, HOUR)
    first = backend.store.decide([Check(rule, CLIENT) for rule in rules])
    assert admitted(first)
    assert [r.remaining for r in first] == [9, 9, 0]
    second = backend.store.decide([Check(rule, CLIENT) for rule in rules])
    assert not admitted(second)
    assert [r.allowed for r in second] == [True, True, False]
    assert [r.remaining for r in second] == [9, 9, 0]
    assert remaining(backend, rules) == [9, 9, 0]
    # The roomy rules alone still admit, from where they were.
    alone = backend.store.decide([Check(roomy, CLIENT), Check(other, CLIENT)])
    assert [r.remaining for r in alone] == [8, 8]


def test_all_or_nothing_across_every_algorithm(backend):
    rules = [
        make_rule(algorithm, limit=1 if algorithm == "leaky_bucket" else 5, rule_id=i)
        for i, algorithm in enumerate(ALGORITHMS, start=1)
    ]
    clear_of_boundary(backend, HOUR)
    assert admitted(backend.store.decide([Check(rule, CLIENT) for rule in rules]))
    assert remaining(backend, rules) == [4, 4, 4, 4, 0]
    for _ in range(3):
        results = backend.store.decide([Check(rule, CLIENT) for rule in rules])
        assert not admitted(results)
        assert [r.allowed for r in results] == [True, True, True, True, False]
    assert remaining(backend, rules) == [4, 4, 4, 4, 0]
    assert backend.log_size(state_key(rules[1], CLIENT)) == 1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_same_key_twice_in_one_call_is_counted_once(backend, algorithm):
    """A request is never counted twice, even if a caller passes one rule twice."""
    rule = make_rule(algorithm, limit=10)
    clear_of_boundary(backend, HOUR)
    results = backend.store.decide([Check(rule, CLIENT), Check(rule, CLIENT)])
    assert [r.remaining for r in results] == [9, 9]
    assert remaining(backend, [rule]) == [9]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_shadow_rule_reports_but_never_blocks(backend, algorithm):
    enforcing = make_rule(algorithm, limit=10, rule_id=1)
    shadow = make_rule(algorithm, limit=1, action="log", rule_id=2)
    checks = [Check(enforcing, CLIENT), Check(shadow, CLIENT)]
    clear_of_boundary(backend, HOUR)
    first = backend.store.decide(checks)
    assert [r.allowed for r in first] == [True, True]
    for expected_remaining in (8, 7, 6):
        results = backend.store.decide(checks)
        assert [r.allowed for r in results] == [True, False]
        assert admitted(results)
        assert results[0].remaining == expected_remaining  # the enforcing rule was consumed
        assert results[1].remaining == 0
        assert results[1].retry_after > 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_shadow_rule_is_not_consumed_by_a_rejected_request(backend, algorithm):
    enforcing = make_rule(algorithm, limit=1, rule_id=1)
    shadow = make_rule(algorithm, limit=10, action="log", rule_id=2)
    checks = [Check(enforcing, CLIENT), Check(shadow, CLIENT)]
    clear_of_boundary(backend, HOUR)
    assert admitted(backend.store.decide(checks))
    for _ in range(3):
        assert not admitted(backend.store.decide(checks))
    assert remaining(backend, [enforcing, shadow]) == [0, 9]


def test_a_log_only_fixed_window_counts_on_past_its_limit(backend):
    """What sizing reads: the window's count past the limit (Result.past), in one check or
    among others; a dry run writes nothing and tells nothing past."""
    shadow = make_rule("fixed_window", limit=3, action="log", rule_id=2)
    roomy = make_rule("fixed_window", limit=100, rule_id=1)
    clear_of_boundary(backend, HOUR)
    alone = flood(backend, shadow, 5)
    assert [r.allowed for r in alone] == [True, True, True, False, False]
    assert [(r.remaining, r.past) for r in alone] == [(2, 0), (1, 0), (0, 0), (0, 1), (0, 2)]
    assert one(backend, shadow, dry_run=True).past == 0
    both = backend.store.decide([Check(roomy, CLIENT), Check(shadow, CLIENT, 2)])
    assert admitted(both) and [r.past for r in both] == [0, 4]
    assert one(backend, shadow).past == 5


def test_a_log_only_window_past_its_limit_is_given_back_with_a_rejected_request(backend):
    shadow = make_rule("fixed_window", limit=1, action="log", rule_id=2)
    tight = make_rule("fixed_window", limit=1, rule_id=1)
    clear_of_boundary(backend, HOUR)
    assert admitted(backend.store.decide([Check(tight, CLIENT), Check(shadow, CLIENT)]))
    for _ in range(3):
        rejected = backend.store.decide([Check(tight, CLIENT), Check(shadow, CLIENT)])
        assert not admitted(rejected)
        assert [(r.remaining, r.past) for r in rejected] == [(0, 0), (0, 0)]
    # The shadow window holds the first request only: the next one is 1 past its limit.
    assert one(backend, shadow).past == 1


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "fixed_window"])
def test_other_log_only_rules_stop_at_their_limit(backend, algorithm):
    shadow = make_rule(algorithm, limit=2, action="log", rule_id=2)
    clear_of_boundary(backend, HOUR)
    flood(backend, shadow, 4)
    assert one(backend, shadow).past == 0
    assert remaining(backend, [shadow]) == [0]


# -- dry runs and resets ------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_dry_run_consumes_nothing_and_reports_what_remains(backend, algorithm):
    rule = make_rule(algorithm, limit=10)
    clear_of_boundary(backend, HOUR)
    fresh = one(backend, rule, dry_run=True)
    assert (fresh.allowed, fresh.remaining) == (True, 10)
    assert backend.keys() == []
    flood(backend, rule, 3)
    for _ in range(3):
        result = one(backend, rule, dry_run=True)
        assert (result.allowed, result.remaining) == (True, 7)
    assert one(backend, rule).remaining == 6
    flood(backend, rule, 6)
    for _ in range(3):
        result = one(backend, rule, dry_run=True)
        assert (result.allowed, result.remaining) == (False, 0)
        assert result.retry_after > 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reset_forgets_one_client(backend, algorithm):
    rule = make_rule(algorithm, limit=3)
    other = "ip:198.51.100.1"
    clear_of_boundary(backend, HOUR)
    flood(backend, rule, 4)
    for _ in range(4):
        one(backend, rule, identity=other)
    backend.store.reset(rule, CLIENT)
    after = one(backend, rule)
    assert (after.allowed, after.remaining) == (True, 2)
    assert not one(backend, rule, identity=other).allowed
    backend.store.reset(rule, "ip:192.0.2.99")  # a client without state: nothing to do


# -- keys ---------------------------------------------------------------------


def test_key_length_does_not_depend_on_the_identity(backend):
    rule = make_rule("fixed_window", limit=5)
    identities = [
        "ip:1.2.3.4",
        "header:" + "x" * 10_240,
        "header:ünïcødé 日本語 \u2028 🚦",
        "header:a\r\nSET evil 1\r\n",
        "param:\x00\udcff",  # NUL and a lone surrogate, as a badly decoded request can carry
    ]
    for identity in identities:
        assert one(backend, rule, identity=identity).allowed
    keys = backend.keys()
    assert len(keys) == len(identities)
    expected = len(keys[0])  # a state key, or with the Redis backend a window's key under it
    assert len(state_key(rule, "ip:1.2.3.4")) <= expected <= len(state_key(rule, "ip:1")) + 11
    for key in keys:
        assert len(key) == expected
        assert key.isascii() and key.isprintable() and " " not in key


@pytest.fixture
def redis_store(redis_server: Any) -> Any:
    client = redis_server.client()
    yield RedisStore(client)
    client.close()


def test_every_redis_key_expires(redis_store, redis_client):
    """A workload over every algorithm, period, cost and outcome leaves no key without a TTL."""
    store = redis_store
    rules = [
        make_rule(algorithm, limit=3, period=period, action=action, rule_id=n)
        for n, (algorithm, period, action) in enumerate(
            (
                (algorithm, period, action)
                for algorithm in ALGORITHMS
                for period in (1, 60, 86400)
                for action in ("reject", "log")
            ),
            start=1,
        )
    ]
    for rule in rules:
        for client in ("ip:a", "ip:b"):
            for cost in (1, 2, 1, 3, 4, 1):
                store.decide([Check(rule, client, cost)])
            store.decide([Check(rule, client)], dry_run=True)
    # Several rules in one request, admitted and rejected.
    for _ in range(4):
        store.decide([Check(rule, "ip:c") for rule in rules[::5]])
    # Keys that must still be there: a fixed window's key lives only to its window's end,
    # which can fall within this test (a minute boundary), so those are left out here; every
    # key found is still checked for a TTL below.
    # A sliding window counter's key of a window lives to the end of the next one: the key of
    # this window or of the one before is there.
    keys = set(redis_client.scan_iter(count=1000))
    lasting = set()
    for rule in rules:
        if rule.period == 1 or rule.algorithm == "fixed_window":
            continue
        for client in ("ip:a", "ip:b"):
            key = state_key(rule, client)
            if rule.algorithm == "sliding_window_counter":
                w = int(redis_client.time()[0]) // rule.period
                found = {f"{key}:{n}".encode() for n in (w - 1, w)} & keys
                assert found, key
                lasting |= found
            else:
                lasting.add(key.encode())
    assert lasting <= keys
    for key in keys:
        ttl = redis_client.pttl(key)
        assert ttl != -1, key  # -1: no expiry (-2: a one-second key that expired since the scan)
        if key in lasting:
            assert ttl > 0, key


# -- the Redis connection ------------------------------------------------------


def test_script_is_reloaded_after_script_flush(redis_store, redis_client):
    store = redis_store
    rule = make_rule("token_bucket", limit=10)
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 9
    redis_client.script_flush()
    assert redis_client.script_exists(DECIDE_SHA) == [False]
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 8
    assert redis_client.script_exists(DECIDE_SHA) == [True]


def test_decides_after_a_redis_restart(redis_server, redis_store):
    store = redis_store
    rule = make_rule("sliding_window_log", limit=10)
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 9
    redis_server.restart()  # without persistence: the state is gone, the script cache too
    result = store.decide([Check(rule, CLIENT)])[0]
    assert (result.allowed, result.remaining) == (True, 9)


# -- windows of any length -----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_window_of_fifteen_minutes(backend, algorithm):
    """100 per 15 minutes is limit 100, period 900: every algorithm admits the limit and then
    asks to wait within the window; a fixed window resets at a multiple of 15 minutes."""
    period = 15 * 60
    rule = make_rule(algorithm, limit=3, period=period)
    clear_of_boundary(backend, period)
    results = flood(backend, rule, 4)
    assert [r.allowed for r in results] == [True, True, True, False]
    # A sliding window counter weighs the previous window: its wait can reach into the next.
    longest = 2 * period if algorithm == "sliding_window_counter" else period
    assert 0 < results[-1].retry_after <= longest
    assert results[0].reset_at - backend.now() <= 2 * period
    if algorithm == "fixed_window":
        assert round(results[0].reset_at) % period == 0


# -- block duration ----------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_rejection_starts_a_block(backend, algorithm):
    rule = make_rule(algorithm, limit=2, period=60, block=600)  # the block outlasts the window
    clear_of_boundary(backend, 60)
    results = flood(backend, rule, 4)
    assert [r.allowed for r in results] == [True, True, False, False]
    assert [r.blocked for r in results] == [False, False, True, True]
    assert 599 < results[2].retry_after <= 600
    assert results[3].retry_after <= results[2].retry_after
    backend.store.reset(rule, CLIENT)  # the dashboard's reset clears the block too
    assert one(backend, rule).allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_rule_counting_some_statuses_starts_its_block_from_counted_outcomes(backend, algorithm):
    """With count_statuses, a rejection starts no block (shares in flight may have caused it);
    the outcomes state, one short of the rule, rejects the outcome that fills the limit, which
    starts the rule's own block (its key), and a reset clears both."""
    rule = build_rule(
        id=1, name="r", algorithm=algorithm, limit=2, period=HOUR, block=600,
        count_statuses=frozenset({401}),
    )  # fmt: skip
    clear_of_boundary(backend, HOUR)
    assert [r.allowed for r in flood(backend, rule, 3)] == [True, True, False]
    assert not one(backend, rule, dry_run=True).blocked
    outcomes = outcomes_rule(rule)
    assert one(backend, outcomes).allowed  # the first counted outcome: room for one more
    assert not one(backend, rule, dry_run=True).blocked
    filled = one(backend, outcomes)
    assert not filled.allowed and filled.blocked
    probe = one(backend, rule, dry_run=True)
    assert probe.blocked and 599 < probe.retry_after <= 600
    backend.store.reset(rule, CLIENT)
    assert one(backend, outcomes).allowed  # its outcomes were forgotten with it
    assert one(backend, rule).allowed


def test_a_blocked_client_stays_blocked_after_the_window(backend):
    rule = make_rule("fixed_window", limit=2, period=1, block=2)
    align(backend, 0.0, 1)
    assert [r.allowed for r in flood(backend, rule, 3)] == [True, True, False]
    backend.wait(1.1)  # a new window: the algorithm alone would admit
    blocked = one(backend, rule)
    assert not blocked.allowed and blocked.blocked and 0 < blocked.retry_after <= 1
    backend.wait(blocked.retry_after)
    assert one(backend, rule).allowed


def test_a_dry_run_starts_no_block(backend):
    rule = make_rule("fixed_window", limit=1, period=HOUR, block=600)
    clear_of_boundary(backend, HOUR)
    assert one(backend, rule).allowed
    assert not one(backend, rule, dry_run=True).allowed
    probe = one(backend, rule, dry_run=True)
    assert not probe.blocked  # rejected by the window only: no block was started


# -- a costly request in the log: one entry, whatever its cost ------------------------------


@pytest.mark.parametrize("algorithm", ["sliding_window_log", "concurrency"])
def test_a_request_of_a_million_units_is_one_entry(backend: Backend, algorithm: str) -> None:
    rule = make_rule(algorithm, 1_000_000, period=86400)
    key = state_key(rule, CLIENT)
    assert one(backend, rule, cost=1_000_000).allowed
    assert backend.log_size(key) == 1
    rejected = one(backend, rule)
    assert not rejected.allowed and rejected.remaining == 0
    if isinstance(backend, RedisBackend):
        assert backend.client.memory_usage(key) < 300  # bytes: not 118 MB
        assert backend.client.zscore(key, "#") == -999_999  # the extra units, in the tally


def test_costly_entries_give_their_units_back_when_they_expire(backend: Backend) -> None:
    rule = make_rule("sliding_window_log", 4, period=1)
    align(backend, 0.05)
    assert one(backend, rule, cost=3).allowed
    assert [r.allowed for r in flood(backend, rule, 2)] == [True, False]
    backend.wait(1.0)  # past the costly entry and the other one
    assert one(backend, rule, cost=4).allowed  # every unit back
    if isinstance(backend, RedisBackend):
        assert backend.client.zscore(state_key(rule, CLIENT), "#") == -3  # the new one's only


def test_the_retry_time_counts_the_units_of_costly_entries(backend: Backend) -> None:
    rule = make_rule("sliding_window_log", 4, period=HOUR)
    first = one(backend, rule, cost=3)
    backend.wait(0.5)
    second = one(backend, rule)
    assert first.allowed and second.allowed
    # 2 more units need 2 of the 4 to expire: the first entry's 3 are enough.
    rejected = one(backend, rule, cost=2)
    assert not rejected.allowed
    assert rejected.retry_after == pytest.approx(first.at / US + HOUR - rejected.at / US, abs=1e-6)


def test_a_costly_entry_is_given_back_in_part(backend: Backend) -> None:
    rule = make_rule("sliding_window_log", 10, period=HOUR)
    taken = one(backend, rule, cost=5)
    backend.store.refund([Check(rule, CLIENT, 2)], taken.at)
    assert one(backend, rule, dry_run=True).remaining == 7
    backend.store.refund([Check(rule, CLIENT, 5)], taken.at)  # only 3 were left: never below
    assert one(backend, rule, dry_run=True).remaining == 10
    assert backend.log_size(state_key(rule, CLIENT)) == 0
    if isinstance(backend, RedisBackend):
        assert backend.client.zscore(state_key(rule, CLIENT), "#") is None
