"""What a client's state costs in Redis: the least a key can be, an integer with a TTL (decide.lua's
header describes every form): a key per window for the fixed window and the sliding window
counter, one key for a bucket. The state key's forms before windows had keys of their own
("window:count", the counter's "window:current:previous" and its packed integer) are read on and
moved to the window's key, so an upgrade loses no count."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_throttle.store import Check, RedisStore, state_key
from tests.engine_helpers import HOUR, make_rule

CLIENT = "ip:198.51.100.7"
WINDOWS = ("fixed_window", "sliding_window_counter")
INTEGER_STATES = (*WINDOWS, "token_bucket", "leaky_bucket")


@pytest.fixture
def store(redis_server: Any) -> Iterator[RedisStore]:
    client = redis_server.client()
    yield RedisStore(client)
    client.close()


def floor_bytes(redis_client: Any, key_length: int) -> int:
    """MEMORY USAGE of a string key of this length holding an integer, with a TTL."""
    key = "k" * key_length
    redis_client.set(key, 1764000123456, px=HOUR * 1000)
    try:
        return int(redis_client.memory_usage(key, samples=0))
    finally:
        redis_client.delete(key)


def window(redis_client: Any, period: int) -> int:
    """The number of the server's current window of ``period`` seconds, once at least five
    seconds are left of it (a short wait at most): a test's calls stay in that window."""
    seconds, micros = redis_client.time()
    left = period - (seconds % period + micros / 1e6)
    if left < 5:
        time.sleep(left + 0.01)
    return int(redis_client.time()[0]) // period


def packed(window: int, current: int, previous: int) -> int:
    """The counter's former integer form (counts below 10): d * 10^15 + (current * 10 +
    previous) * 10^13 + window % 10^13, d = 1."""
    return 10**15 + (current * 10 + previous) * 10**13 + window % 10**13


@pytest.mark.parametrize("algorithm", INTEGER_STATES)
def test_a_state_is_one_integer_key_at_the_floor(
    store: RedisStore, redis_client: Any, algorithm: str
) -> None:
    rule = make_rule(algorithm, limit=1000)
    w = window(redis_client, HOUR)
    for _ in range(37):
        assert store.decide([Check(rule, CLIENT)])[0].allowed
    key = state_key(rule, CLIENT)
    if algorithm in WINDOWS:
        key = f"{key}:{w}"
        assert int(redis_client.get(key)) == 37
    assert redis_client.keys("*") == [key.encode()]
    assert redis_client.object("encoding", key) == b"int"
    assert redis_client.pttl(key) > 0
    assert redis_client.memory_usage(key, samples=0) == floor_bytes(redis_client, len(key))


def test_the_fixed_window_reads_its_former_form(store: RedisStore, redis_client: Any) -> None:
    rule = make_rule("fixed_window", limit=10)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, f"{w}:3", px=HOUR * 1000)  # 3 counted before the upgrade
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 6
    assert redis_client.get(key) is None  # moved, once
    assert int(redis_client.get(f"{key}:{w}")) == 4
    assert store.decide([Check(rule, CLIENT, 6)])[0].remaining == 0
    assert not store.decide([Check(rule, CLIENT)])[0].allowed


def test_a_former_state_of_another_window_counts_nothing(
    store: RedisStore, redis_client: Any
) -> None:
    rule = make_rule("fixed_window", limit=10)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, f"{w - 1}:9", px=HOUR * 1000)
    assert store.decide([Check(rule, CLIENT)], dry_run=True)[0].remaining == 10
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 9


def test_a_dry_run_reads_the_former_form_and_writes_nothing(
    store: RedisStore, redis_client: Any
) -> None:
    rule = make_rule("fixed_window", limit=10)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, f"{w}:3", px=HOUR * 1000)
    assert store.decide([Check(rule, CLIENT)], dry_run=True)[0].remaining == 7
    assert redis_client.keys("*") == [key.encode()]
    assert redis_client.get(key) == f"{w}:3".encode()


def test_the_counter_reads_its_former_string_form(store: RedisStore, redis_client: Any) -> None:
    rule = make_rule("sliding_window_counter", limit=10)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, f"{w}:3:0", px=HOUR * 1000)  # 3 counted before the upgrade
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 6
    assert redis_client.get(key) is None
    assert redis_client.object("encoding", f"{key}:{w}") == b"int"
    assert store.decide([Check(rule, CLIENT, 6)])[0].remaining == 0
    assert not store.decide([Check(rule, CLIENT)])[0].allowed


def test_the_counter_reads_its_former_integer_form(store: RedisStore, redis_client: Any) -> None:
    """Both counts of the packed integer move: this window's to its key, the previous one's to
    the previous window's key (with the TTL it would have had), where every later decision of
    the window weighs it."""
    rule = make_rule("sliding_window_counter", limit=100)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, packed(w, 3, 8), px=HOUR * 1000)
    first = store.decide([Check(rule, CLIENT)])[0]
    left = (w + 1) * HOUR * 1_000_000 - first.at
    weighted = 8 * left / (HOUR * 1_000_000)
    assert first.remaining == pytest.approx(100 - 4 - weighted, abs=1)
    assert int(redis_client.get(f"{key}:{w}")) == 4
    assert int(redis_client.get(f"{key}:{w - 1}")) == 8
    assert 0 < redis_client.pttl(f"{key}:{w - 1}") <= (left // 1000) + 1
    second = store.decide([Check(rule, CLIENT)])[0]
    assert second.remaining == pytest.approx(100 - 5 - weighted, abs=1)


def test_the_former_previous_window_still_weighs(store: RedisStore, redis_client: Any) -> None:
    """A former-form state of the window before: its count is the previous window's, weighted
    by what is left of this one; of the window before that, it weighs nothing."""
    rule = make_rule("sliding_window_counter", limit=1000)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, f"{w - 1}:999:5", px=HOUR * 1000)
    result = store.decide([Check(rule, CLIENT)])[0]
    left = (w + 1) * HOUR * 1_000_000 - result.at
    assert result.allowed
    assert result.remaining == pytest.approx(1000 - 1 - 999 * left / (HOUR * 1_000_000), abs=1)
    assert int(redis_client.get(f"{key}:{w - 1}")) == 999  # weighs on, in the window's key
    other = "ip:198.51.100.8"
    redis_client.set(state_key(rule, other), f"{w - 2}:999:5", px=HOUR * 1000)
    assert store.decide([Check(rule, other)], dry_run=True)[0].remaining == 1000


def test_large_counts_stay_integers(store: RedisStore, redis_client: Any) -> None:
    rule = make_rule("sliding_window_counter", limit=1_000_000)
    key = f"{state_key(rule, CLIENT)}:{window(redis_client, HOUR)}"
    assert store.decide([Check(rule, CLIENT, 99_999)])[0].remaining == 900_001
    assert store.decide([Check(rule, CLIENT, 2)])[0].remaining == 899_999
    assert redis_client.object("encoding", key) == b"int"
    assert int(redis_client.get(key)) == 100_001
    store.refund([Check(rule, CLIENT, 2)])
    assert int(redis_client.get(key)) == 99_999
    assert store.decide([Check(rule, CLIENT)], dry_run=True)[0].remaining == 900_001


@pytest.mark.parametrize("algorithm", WINDOWS)
def test_a_refund_keeps_the_integer_and_its_ttl(
    store: RedisStore, redis_client: Any, algorithm: str
) -> None:
    rule = make_rule(algorithm, limit=10)
    key = f"{state_key(rule, CLIENT)}:{window(redis_client, HOUR)}"
    results = [store.decide([Check(rule, CLIENT)])[0] for _ in range(3)]
    assert results[-1].remaining == 7
    ttl = redis_client.pttl(key)
    store.refund([Check(rule, CLIENT)], results[-1].at)
    assert redis_client.object("encoding", key) == b"int"
    assert 0 < redis_client.pttl(key) <= ttl  # the TTL kept
    assert store.decide([Check(rule, CLIENT)], dry_run=True)[0].remaining == 8
    store.refund([Check(rule, CLIENT, 5)], results[-1].at)
    assert int(redis_client.get(key)) == 0  # never below empty


def test_a_refund_of_a_decision_made_before_the_upgrade(
    store: RedisStore, redis_client: Any
) -> None:
    rule = make_rule("fixed_window", limit=10)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, f"{w}:5", px=HOUR * 1000)
    store.refund([Check(rule, CLIENT, 2)])
    assert redis_client.get(key) == f"{w}:3".encode()
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 6
