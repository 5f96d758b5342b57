"""What a client's state costs in Redis: one key, and for the counters and buckets the least a
key can be, an integer with a TTL (decide.lua's header describes every form); a sliding window
counter written in its former form ("window:current:previous") is read on, so an upgrade
loses no count."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_throttle.store import Check, RedisStore, state_key
from tests.engine_helpers import HOUR, make_rule

CLIENT = "ip:198.51.100.7"
INTEGER_STATES = ("sliding_window_counter", "token_bucket", "leaky_bucket")


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
    """The number of the server's current window of ``period`` seconds."""
    return int(redis_client.time()[0]) // period


@pytest.mark.parametrize("algorithm", INTEGER_STATES)
def test_a_counter_or_bucket_is_one_integer_key_at_the_floor(
    store: RedisStore, redis_client: Any, algorithm: str
) -> None:
    rule = make_rule(algorithm, limit=1000)
    for _ in range(37):
        assert store.decide([Check(rule, CLIENT)])[0].allowed
    key = state_key(rule, CLIENT)
    assert redis_client.keys("*") == [key.encode()]
    assert redis_client.object("encoding", key) == b"int"
    assert redis_client.pttl(key) > 0
    assert redis_client.memory_usage(key, samples=0) == floor_bytes(redis_client, len(key))


def test_the_counter_reads_its_former_form_and_writes_the_integer(
    store: RedisStore, redis_client: Any
) -> None:
    rule = make_rule("sliding_window_counter", limit=10)
    key = state_key(rule, CLIENT)
    w = window(redis_client, HOUR)
    redis_client.set(key, f"{w}:3:0", px=HOUR * 1000)  # 3 counted before the upgrade
    assert store.decide([Check(rule, CLIENT)])[0].remaining == 6
    assert redis_client.object("encoding", key) == b"int"
    assert store.decide([Check(rule, CLIENT, 6)])[0].remaining == 0
    assert not store.decide([Check(rule, CLIENT)])[0].allowed


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
    redis_client.set(key, f"{w - 2}:999:5", px=HOUR * 1000)
    assert store.decide([Check(rule, CLIENT)], dry_run=True)[0].remaining == 1000


def test_counts_of_six_digits_keep_the_string_form(store: RedisStore, redis_client: Any) -> None:
    rule = make_rule("sliding_window_counter", limit=1_000_000)
    key = state_key(rule, CLIENT)
    assert store.decide([Check(rule, CLIENT, 99_999)])[0].remaining == 900_001
    assert redis_client.object("encoding", key) == b"int"
    assert store.decide([Check(rule, CLIENT, 2)])[0].remaining == 899_999
    assert redis_client.get(key).endswith(b":100001:0")
    store.refund([Check(rule, CLIENT, 2)])
    assert redis_client.object("encoding", key) == b"int"  # back under 10^5
    assert store.decide([Check(rule, CLIENT)], dry_run=True)[0].remaining == 900_001


def test_a_refund_gives_back_in_the_integer_form(store: RedisStore, redis_client: Any) -> None:
    rule = make_rule("sliding_window_counter", limit=10)
    key = state_key(rule, CLIENT)
    results = [store.decide([Check(rule, CLIENT)])[0] for _ in range(3)]
    assert results[-1].remaining == 7
    ttl = redis_client.pttl(key)
    store.refund([Check(rule, CLIENT)], results[-1].at)
    assert redis_client.object("encoding", key) == b"int"
    assert 0 < redis_client.pttl(key) <= ttl  # the TTL kept
    assert store.decide([Check(rule, CLIENT)], dry_run=True)[0].remaining == 8
