"""Blocks that grow (Rule.block_growth, BLOCK_MEMORY): each further block of a client while it is
remembered lasts block_growth times the one before, up to a week; the level lives in the store
beside the block (no extra round trip), is shown on the key page and forgotten by reset().
Redis runs on a wall clock the tests move forward (tests/clock_shift.py's MovableClock), so an
hour of a client ignoring its 429s takes no hour."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client, RequestFactory
from django.urls import reverse

from django_throttle import check
from django_throttle.compiled import build_rule
from django_throttle.models import Rule
from django_throttle.store import Check
from django_throttle.store.memory import MemoryStore
from django_throttle.store.redis import RedisStore
from tests.clock_shift import MovableClock
from tests.helpers import rule
from tests.redis_server import RedisServer

US = 1_000_000
CLIENT = "ip:203.0.113.9"
WEEK = 7 * 86400


def growing(
    limit: int = 5,
    period: int = 60,
    block: int = 60,
    growth: int = 4,
    algorithm: str = "fixed_window",
) -> Any:
    return build_rule(
        id=1,
        name="login",
        algorithm=algorithm,
        limit=limit,
        period=period,
        block=block,
        block_growth=growth,
    )


class RedisBackend:
    """A RedisStore on a real redis-server whose clock the test moves."""

    def __init__(self) -> None:
        self.clock = MovableClock()
        self.server = RedisServer(env=self.clock.env())
        self.server.start()
        self.client = self.server.client()
        self.store = RedisStore(self.client)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def close(self) -> None:
        self.client.close()
        self.server.close()
        self.clock.close()


class MemoryBackend:
    """The local fallback's MemoryStore on an injected clock."""

    def __init__(self) -> None:
        self.us = round(time.time() * US)
        self.store = MemoryStore(clock=lambda: self.us)

    def advance(self, seconds: float) -> None:
        self.us += round(seconds * US)

    def close(self) -> None:
        pass


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    made = RedisBackend() if request.param == "redis" else MemoryBackend()
    yield made
    made.close()


def test_the_movable_clock_moves_a_running_server() -> None:
    backend = RedisBackend()
    try:
        before = backend.client.time()[0]
        backend.client.set("k", "1", px=2000)
        backend.advance(3600)
        assert 3599 <= backend.client.time()[0] - before <= 3601
        assert backend.client.get("k") is None  # its TTL ran out on the moved clock
    finally:
        backend.close()


# A fixed window may admit up to twice its limit across a boundary, wherever blocks fall; these
# count a minute back from each request.
@pytest.mark.parametrize("algorithm", ["sliding_window_log", "token_bucket"])
def test_a_client_ignoring_429s_for_an_hour_is_admitted_20_times(
    backend: Any, algorithm: str
) -> None:
    """5 per minute, block 60 s, growth 4: 5 before each block of 60, 240, 960 and 3,840 s."""
    limit = growing(algorithm=algorithm)
    admitted, blocks = 0, []
    for _ in range(3600):  # one request a second, on the store's clock
        (result,) = backend.store.decide([Check(limit, CLIENT)])
        admitted += result.allowed
        if result.blocked and (not blocks or blocks[-1][1] < result.retry_after - 1):
            blocks.append((admitted, result.retry_after))
        backend.advance(1)
    assert admitted == 20
    # Each block starts when the 6th request of a window is rejected, after 5 admitted.
    assert [a for a, _ in blocks] == [5, 10, 15, 20]
    assert [round(s) for _, s in blocks] == [60, 240, 960, 3840]


def test_a_block_grows_up_to_a_week(backend: Any) -> None:
    limit = growing(limit=1, period=1, block=3600, growth=10)
    lengths = []
    for _ in range(4):
        backend.store.decide([Check(limit, CLIENT)])  # admitted in a new window
        (rejected,) = backend.store.decide([Check(limit, CLIENT)])
        lengths.append(round(rejected.retry_after))
        backend.advance(rejected.retry_after + 1)
    assert lengths == [3600, 36000, 360000, WEEK]
    assert backend.store.block_levels([Check(limit, CLIENT)]) == [4]


def test_a_client_remembered_no_longer_starts_again_from_the_first_block(
    backend: Any, settings: Any
) -> None:
    limit = growing(limit=1, period=1, block=10, growth=2)
    memory = 86400  # BLOCK_MEMORY's default: a day after the last block ended
    seconds = []
    # The level is forgotten BLOCK_MEMORY after the second block (20 s) ended.
    for pause in (11, 20 + memory + 1, 11, 21):
        backend.store.decide([Check(limit, CLIENT)])
        (rejected,) = backend.store.decide([Check(limit, CLIENT)])
        seconds.append(round(rejected.retry_after))
        backend.advance(pause if pause > rejected.retry_after else rejected.retry_after + 1)
    assert seconds == [10, 20, 10, 20]


def test_block_memory_is_a_setting(backend: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BLOCK_MEMORY": 30}
    limit = growing(limit=1, period=1, block=10, growth=2)  # compiled under the new setting
    seconds = []
    for pause in (11, 20 + 29, 40 + 31):  # 29 s after the 2nd block: remembered; 31: not
        backend.store.decide([Check(limit, CLIENT)])
        (rejected,) = backend.store.decide([Check(limit, CLIENT)])
        seconds.append(round(rejected.retry_after))
        backend.advance(pause)
    backend.store.decide([Check(limit, CLIENT)])
    (rejected,) = backend.store.decide([Check(limit, CLIENT)])
    seconds.append(round(rejected.retry_after))
    assert seconds == [10, 20, 40, 10]


def test_reset_forgets_the_level(backend: Any) -> None:
    limit = growing(limit=1, period=1, block=10, growth=3)
    for _ in range(2):
        backend.store.decide([Check(limit, CLIENT)])
        backend.store.decide([Check(limit, CLIENT)])
        backend.advance(40)
    assert backend.store.block_levels([Check(limit, CLIENT)]) == [2]
    backend.store.reset(limit, CLIENT)
    assert backend.store.block_levels([Check(limit, CLIENT)]) == [0]
    backend.store.decide([Check(limit, CLIENT)])
    (rejected,) = backend.store.decide([Check(limit, CLIENT)])
    assert round(rejected.retry_after) == 10


def test_a_rule_without_growth_blocks_as_long_every_time_and_keeps_no_level(backend: Any) -> None:
    limit = growing(limit=1, period=1, block=10, growth=1)
    for _ in range(3):
        backend.store.decide([Check(limit, CLIENT)])
        (rejected,) = backend.store.decide([Check(limit, CLIENT)])
        assert round(rejected.retry_after) == 10
        backend.advance(11)
    assert backend.store.block_levels([Check(limit, CLIENT)]) == [0]


def test_growth_is_one_round_trip(redis_server: RedisServer) -> None:
    client = redis_server.client()
    store = RedisStore(client)
    limit = growing(limit=1, period=60, block=5, growth=2)
    try:
        store.decide([Check(limit, CLIENT)])
        # The slow log records each command sent, and a script's own (from the address ?:0).
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
        (rejected,) = store.decide([Check(limit, CLIENT)])  # starts the block and its level
        entries = client.slowlog_get(20)
        sent = [e["command"].split()[0] for e in entries if e["client_address"] != b"?:0"]
        in_script = [e["command"].split()[0] for e in entries if e["client_address"] == b"?:0"]
        assert rejected.blocked
        assert [c for c in sent if c != b"SLOWLOG"] == [b"EVALSHA"]
        assert in_script.count(b"SET") == 2  # the block and its level
        assert store.block_levels([Check(limit, CLIENT)]) == [1]
    finally:
        client.close()


# -- the model, the admin and the key page --------------------------------------------------------


@pytest.mark.django_db
def test_growth_needs_a_block_duration_and_a_sane_factor() -> None:
    with pytest.raises(ValidationError) as caught:
        Rule(name="g", scope="*", limit=5, block_growth=4).full_clean()
    assert "block_growth" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        Rule(name="g", scope="*", limit=5, block_seconds=60, block_growth=0).full_clean()
    assert "block_growth" in caught.value.message_dict
    with pytest.raises(ValidationError):
        Rule(name="g", scope="*", limit=5, block_seconds=60, block_growth=10_000).full_clean()
    made = rule("g", "*", 5, block_seconds=60, block_growth=4)
    assert "4 times longer each time it comes back" in made.explanation


@pytest.mark.django_db
def test_the_key_page_shows_the_level_and_unblock_forgets_it(admin_client: Client) -> None:
    growing_rule = rule("grows", "grows", 1, block_seconds=60, block_growth=4)
    requests = [RequestFactory().get("/", REMOTE_ADDR="198.51.100.7") for _ in range(2)]
    assert [check(request, "grows").allowed for request in requests] == [True, False]
    url = f"{reverse('admin:django_throttle_dashboard_key')}?rule={growing_rule.pk}&key=ip:198.51.100.7"
    html = admin_client.get(url).content.decode()
    assert "blocked 1 time while remembered" in html
    (state,) = admin_client.get(url).context["states"]
    assert state.block_level == 1
    admin_client.post(
        reverse("admin:django_throttle_dashboard_key"),
        {"rule": growing_rule.pk, "key": "ip:198.51.100.7"},
    )
    html = admin_client.get(url).content.decode()
    assert "while remembered" not in html and "throttle-blocked" not in html
