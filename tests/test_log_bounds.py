"""The sliding log's work per decision is bounded whatever its size: the same Redis commands for
a log of 1,000 or 50,000 entries, at most a fixed number of dead entries read or removed per
call, and still exact where docs/bounds.md says it is (logs built in decide.lua's state format
on the harness's redis-server, commands counted by INFO commandstats)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from django_throttle.store import Check, RedisStore, Result, state_key
from tests.engine_helpers import US, make_rule

CLIENT = "ip:198.51.100.9"
DAY = 86400
LIMIT = 1_000_000
STEP = 100  # decide.lua's STEP: entries one read touches at most
PER_CALL = 5 * STEP  # decide.lua's BATCHES * STEP: dead entries one call reads at most
NOT_SCRIPT = {
    "evalsha",
    "eval",
    "script|load",
    "config|resetstat",
    "info",
    "hello",
    "client|setinfo",
}

Entry = tuple[int, int]  # (time in µs, units)


@pytest.fixture
def store(redis_client: Any) -> Iterator[RedisStore]:
    yield RedisStore(redis_client)


def server_now(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * US + int(micros)


def build(client: Any, key: str, entries: list[Entry]) -> None:
    """A log as decide.lua writes it: one member per request (the microsecond, a 3-digit
    sequence, "x<units>" when costly) and the tally "#" of extra units; pipelined ZADDs."""
    extra = sum(units - 1 for _, units in entries)
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(entries), 10_000):
        chunk = entries[start : start + 10_000]
        pipe.zadd(key, {f"{at}000" + (f"x{u}" if u > 1 else ""): at for at, u in chunk})
    if extra:
        pipe.zadd(key, {"#": -extra})
    pipe.pexpire(key, DAY * 1000)
    pipe.execute()


def spaced(first: int, n: int, step: int = 10, units: int = 1) -> list[Entry]:
    """``n`` entries of ``units`` each, ``step`` µs apart from ``first``."""
    return [(first + i * step, units) for i in range(n)]


def decided(client: Any, store: RedisStore, check: Check, **kw: Any) -> tuple[Result, Counter[str]]:
    """One decision and the Redis commands it ran (commandstats, reset right before)."""
    client.config_resetstat()
    [result] = store.decide([check], **kw)
    stats = client.info("commandstats")
    made = Counter(
        {
            name.removeprefix("cmdstat_"): int(s["calls"])
            for name, s in stats.items()
            if name.removeprefix("cmdstat_") not in NOT_SCRIPT
        }
    )
    return result, made


def assert_bounded_reads(made: Counter[str]) -> None:
    """A few commands, each reading by rank (decide.lua's ZRANGEs take STEP entries at most), a
    count (ZCARD: the size Redis keeps) or one member: no read by score, whose LIMIT offset
    walks the set one entry at a time."""
    assert sum(made.values()) <= 30, made
    reads = {"zrange", "zcount", "zcard", "zscore"}
    writes = {"zadd", "zincrby", "zrem", "zremrangebyscore", "pexpire"}
    assert set(made) <= reads | writes | {"time", "pttl"}, made


def true_wait(live: list[Entry], limit: int, cost: int, now: int) -> float:
    """The exact retry time: until enough of the oldest live units have expired (the memory
    store's own walk)."""
    need = sum(u for _, u in live) + cost - limit
    for at, units in live:
        need -= units
        if need <= 0:
            return (at + DAY * US - now) / US
    raise AssertionError("the request never fits")


# -- the same commands, whatever the log's size ---------------------------------------------


def rejected_costly(client: Any, store: RedisStore, m: int) -> tuple[Result, Counter[str], float]:
    """M entries of one unit, the newest one costly so that the log is full; a request of cost
    M / 2 needs about half of the log to expire."""
    rule = make_rule("sliding_window_log", LIMIT, period=DAY)
    key = state_key(rule, CLIENT)
    now = server_now(client)
    live = spaced(now - 3600 * US, m - 1)
    live.append((now - US, LIMIT - (m - 1)))
    build(client, key, live)
    result, made = decided(client, store, Check(rule, CLIENT, m // 2))
    return result, made, true_wait(live, LIMIT, m // 2, result.at)


def test_a_rejected_costly_request_makes_the_same_commands_on_a_log_of_any_size(
    store: RedisStore, redis_client: Any
) -> None:
    small, small_made, small_wait = rejected_costly(redis_client, store, 1_000)
    redis_client.flushall()
    big, big_made, big_wait = rejected_costly(redis_client, store, 50_000)
    for result, wait in ((small, small_wait), (big, big_wait)):
        assert not result.allowed and result.remaining == 0
        # Past the oldest STEP entries, none costly until the newest: still exact.
        assert result.retry_after == pytest.approx(wait, abs=1e-6)
    assert big_made == small_made
    assert_bounded_reads(big_made)


def admitted_among_dead(
    client: Any, store: RedisStore, m: int, costly: bool
) -> tuple[Result, Counter[str], int]:
    """M dead entries (every tenth of 5 units when ``costly``), 10 live ones; a request of 2."""
    rule = make_rule("sliding_window_log", 20, period=DAY)
    key = state_key(rule, CLIENT)
    now = server_now(client)
    dead = [
        (at, 5 if costly and i % 10 == 0 else 1)
        for i, (at, _) in enumerate(spaced(now - DAY * US - 3600 * US, m))
    ]
    build(client, key, [*dead, *spaced(now - 60 * US, 10)])
    result, made = decided(client, store, Check(rule, CLIENT, 2))
    left = client.zcount(key, "(0", now - DAY * US)
    return result, made, left


@pytest.mark.parametrize("costly", [False, True], ids=["no tally", "tally"])
def test_an_admitted_request_removes_a_bounded_number_of_dead_entries(
    store: RedisStore, redis_client: Any, costly: bool
) -> None:
    small, small_made, small_left = admitted_among_dead(redis_client, store, 1_000, costly)
    redis_client.flushall()
    big, big_made, big_left = admitted_among_dead(redis_client, store, 50_000, costly)
    for result in (small, big):
        assert result.allowed and result.remaining == 8  # 10 live + 2: the dead count nothing
    # One call reads (with a tally) or trims (without) a bounded part of the backlog.
    removed = 50_000 - big_left
    assert 0 < removed <= (PER_CALL if costly else STEP + 1)
    assert small_left == 1_000 - removed
    assert big_made == small_made
    assert_bounded_reads(big_made)


# -- exact where it was, with a backlog of dead entries -------------------------------------


def test_with_few_live_entries_a_dead_backlog_leaves_the_decision_exact(
    store: RedisStore, redis_client: Any
) -> None:
    """5,000 dead entries whose costly ones hold 25,000 units in the tally, more than one call
    reads; 50 live entries, one of 51 units: 100 live units, counted exactly."""
    rule = make_rule("sliding_window_log", 130, period=DAY)
    key = state_key(rule, CLIENT)
    now = server_now(redis_client)
    dead = spaced(now - DAY * US - 3600 * US, 5_000, units=6)
    live = [*spaced(now - 60 * US, 49), (now - US, 51)]
    build(redis_client, key, [*dead, *live])
    check = Check(rule, CLIENT, 30)
    assert store.decide([check], dry_run=True)[0].remaining == 30
    assert store.decide([check])[0].allowed  # 100 + 30: exactly the limit
    rejected = store.decide([Check(rule, CLIENT)])[0]
    assert not rejected.allowed
    # The oldest live entry frees one unit: what a request of 1 needs.
    assert rejected.retry_after == pytest.approx((live[0][0] + DAY * US - rejected.at) / US)
    # One batch read per call: the count was exact after it.
    assert redis_client.zcount(key, "(0", now - DAY * US) == 5_000 - 3 * STEP


def test_while_costly_dead_entries_are_unread_nothing_is_admitted_beyond_the_limit(
    store: RedisStore, redis_client: Any
) -> None:
    """2,000 dead entries, the newest 100 of them costly (900 units in the tally), 500 live
    ones: until a call has read those 100, the live count is known only between 500 and 1,400
    and a request that fits the true count is rejected; once read, admitted exactly."""
    rule = make_rule("sliding_window_log", 600, period=DAY)
    key = state_key(rule, CLIENT)
    now = server_now(redis_client)
    dead = spaced(now - DAY * US - 3600 * US, 2_000)
    dead[-100:] = [(at, 10) for at, _ in dead[-100:]]
    build(redis_client, key, [*dead, *spaced(now - 3000 * US, 500)])
    check = Check(rule, CLIENT, 100)  # 500 + 100: exactly the limit
    outcomes = [store.decide([check])[0] for _ in range(4)]
    assert [r.allowed for r in outcomes] == [False, False, False, True]  # PER_CALL read a call
    for rejected in outcomes[:3]:
        # Never earlier than the true time (the oldest live entry's expiry).
        assert rejected.retry_after >= (now - 3000 * US + DAY * US - rejected.at) / US
    assert not store.decide([Check(rule, CLIENT)])[0].allowed
    assert redis_client.zscore(key, "#") == -99  # the dead entries' units read: the new one's


# -- Retry-After ----------------------------------------------------------------------------


def test_retry_after_is_exact_among_the_oldest_entries_and_never_early_past_them(
    store: RedisStore, redis_client: Any
) -> None:
    """50,000 live entries, every tenth of 3 units (60,000 units: the limit): a request that
    needs the oldest STEP entries to expire gets the exact time; one that needs more, a time
    no earlier than the true one (an entry's units past the first STEP are not read); both
    with a few bounded reads."""
    rule = make_rule("sliding_window_log", 60_000, period=DAY)
    key = state_key(rule, CLIENT)
    now = server_now(redis_client)
    live = [
        (at, 3 if i % 10 == 0 else 1) for i, (at, _) in enumerate(spaced(now - 3600 * US, 50_000))
    ]
    build(redis_client, key, live)
    near, near_made = decided(redis_client, store, Check(rule, CLIENT, 100))
    far, far_made = decided(redis_client, store, Check(rule, CLIENT, 30_000))
    assert not near.allowed and not far.allowed
    assert near.retry_after == pytest.approx(true_wait(live, 60_000, 100, near.at), abs=1e-6)
    exact = true_wait(live, 60_000, 30_000, far.at)
    assert exact - 1e-6 <= far.retry_after <= (live[-1][0] + DAY * US - far.at) / US
    # However far the answer lies: one more read by rank at most.
    assert sum(far_made.values()) <= sum(near_made.values()) + 1
    assert_bounded_reads(far_made)
