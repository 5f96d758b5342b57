"""Costs charged after the work (charge_key(), refund.lua's negative costs): counted now, even
past a limit, on every algorithm but concurrency; later decisions wait until it drains, with the
Retry-After that says how long. Against a real Redis and the local fallback's memory store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_throttle import acharge_key, charge_key, check_key
from django_throttle.compiled import build_rule
from django_throttle.store import Check
from django_throttle.store.memory import MemoryStore
from django_throttle.store.redis import RedisStore
from tests.engine_helpers import ALGORITHMS
from tests.helpers import room_in_the_minute, rule, run

CLIENT = "user:42"
US = 1_000_000
CHARGED = [a for a in ALGORITHMS if a != "concurrency"]


class Memory:
    def __init__(self) -> None:
        self.us = round(time.time() * US)
        self.store = MemoryStore(clock=lambda: self.us)


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest, redis_server: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield Memory().store
        return
    client = redis_server.client()
    client.flushall()
    yield RedisStore(client)
    client.close()


WINDOWS = ("fixed_window", "sliding_window_counter")
BUCKETS = ("token_bucket", "leaky_bucket")  # an hour's bucket holds still while a test runs


def tokens_rule(algorithm: str, limit: int = 1000, period: int = 60) -> Any:
    return build_rule(id=7, name="tokens", algorithm=algorithm, limit=limit, period=period)


@pytest.mark.parametrize("algorithm", CHARGED)
def test_a_charge_counts_what_a_decision_did_not_take(store: Any, algorithm: str) -> None:
    """1,000 per minute, each call taking 1 and charged 99 more: ten admitted, the 11th not."""
    if algorithm in WINDOWS:
        room_in_the_minute()
    limit = tokens_rule(algorithm, period=3600 if algorithm in BUCKETS else 60)
    admitted = []
    for _ in range(11):
        (result,) = store.decide([Check(limit, CLIENT)])
        admitted.append(result.allowed)
        if result.allowed:
            store.refund([Check(limit, CLIENT, -99)])
    assert admitted == [True] * 10 + [False]


@pytest.mark.parametrize("algorithm", CHARGED)
def test_a_charge_goes_past_the_limit_and_later_requests_wait_until_it_drains(
    store: Any, algorithm: str
) -> None:
    if algorithm in WINDOWS:
        room_in_the_minute()
    limit = tokens_rule(algorithm, limit=100)
    assert store.decide([Check(limit, CLIENT)])[0].allowed
    store.refund([Check(limit, CLIENT, -149)])  # 150 of 100 used: the work is done
    (refused,) = store.decide([Check(limit, CLIENT)])
    assert not refused.allowed
    assert refused.remaining == 0
    if algorithm in ("token_bucket", "leaky_bucket"):
        # 50 units past a bucket of 100 refilling 100 a minute: 31 s before one more fits.
        assert 30 <= refused.retry_after <= 31
    elif algorithm == "sliding_window_log":
        assert 59 <= refused.retry_after <= 60  # until the charged entry leaves the minute
    else:
        assert 0 < refused.retry_after <= 120


def test_a_concurrency_rule_is_never_charged(store: Any) -> None:
    slots = build_rule(id=8, name="slots", algorithm="concurrency", limit=2, period=60)
    assert store.decide([Check(slots, CLIENT)])[0].allowed
    store.refund([Check(slots, CLIENT, -5)])
    assert store.decide([Check(slots, CLIENT)])[0].allowed  # the second slot is still free


@pytest.mark.django_db
def test_charge_key_charges_every_rule_of_the_scope_but_concurrency() -> None:
    rule("llm-minute", "llm", 1000, unit="minute", algorithm="sliding_window_log")
    rule("llm-day", "llm", 20_000, unit="day", algorithm="fixed_window")
    rule("llm-slots", "llm", 2, algorithm="concurrency")
    assert check_key("llm", CLIENT).allowed
    assert charge_key("llm", CLIENT, 999) == 2
    refused = check_key("llm", CLIENT)
    assert not refused.allowed and refused.rule == "llm-minute"
    assert charge_key("nothing-here", CLIENT, 5) == 0


@pytest.mark.django_db
def test_acharge_key_is_the_same_from_async_code() -> None:
    rule("llm", "llm", 10, unit="minute", algorithm="token_bucket")

    async def body() -> tuple[int, bool]:
        charged = await acharge_key("llm", CLIENT, 10)
        return charged, check_key("llm", CLIENT, dry_run=True).allowed

    assert run(body) == (1, False)


@pytest.mark.django_db
@pytest.mark.parametrize("cost", [0, -3, 2.5, "7", True])
def test_a_charge_is_a_positive_whole_number(cost: Any) -> None:
    with pytest.raises(ValueError, match="cost"):
        charge_key("llm", CLIENT, cost)
