"""Concurrency limits: at most N requests in flight per key, decided in the request's one store
call; each slot a lease that ends when the response is finished (streamed, failed, or its
client gone) or, if its process died, after per x unit."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connection
from django.test import Client

from django_throttle import check_key
from django_throttle.store import Check, MemoryStore, RedisStore
from tests import views
from tests.engine_helpers import lease_holder, make_rule
from tests.helpers import rule, run
from tests.traffic import asgi_get, database_kept_open, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

US = 1_000_000
WHO = "ip:203.0.113.7"


# -- the algorithm, on both backends --------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.us = 1_700_000_000 * US

    def __call__(self) -> int:
        return self.us


@pytest.fixture(params=["memory", "redis"])
def store_and_clock(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """A store, and a way to let time pass (the memory store's clock, or waiting)."""
    if request.param == "memory":
        clock = FakeClock()

        def advance(seconds: float) -> None:
            clock.us += round(seconds * US)

        yield MemoryStore(clock=clock), advance
    else:
        client = request.getfixturevalue("redis_server").client()
        yield RedisStore(client), time.sleep
        client.close()


def test_at_most_n_in_flight_and_a_release_frees_a_slot(store_and_clock: Any) -> None:
    store, _ = store_and_clock
    limited = make_rule("concurrency", 2, period=60)
    first, second = (store.decide([Check(limited, WHO)])[0] for _ in range(2))
    third = store.decide([Check(limited, WHO)])[0]
    assert (first.allowed, second.allowed, third.allowed) == (True, True, False)
    assert third.remaining == 0 and 0 < third.retry_after <= 1  # ask again soon
    store.refund([Check(limited, WHO)], first.at)  # the first request finished
    assert store.decide([Check(limited, WHO)])[0].allowed
    assert not store.decide([Check(limited, WHO)])[0].allowed


def test_a_lease_whose_process_died_ends_after_its_period(store_and_clock: Any) -> None:
    store, let_pass = store_and_clock
    limited = make_rule("concurrency", 1, period=1)
    assert store.decide([Check(limited, WHO)])[0].allowed  # never released
    assert not store.decide([Check(limited, WHO)])[0].allowed
    let_pass(1.05)
    assert store.decide([Check(limited, WHO)])[0].allowed


def test_a_rejected_request_holds_no_slot(store_and_clock: Any) -> None:
    """Decided with the request's other rules: one that rejects means no lease is taken."""
    store, _ = store_and_clock
    limited = make_rule("concurrency", 1, period=60, rule_id=1)
    tight = make_rule("fixed_window", 1, rule_id=2)
    assert [r.allowed for r in store.decide([Check(tight, WHO)])] == [True]
    results = store.decide([Check(limited, WHO), Check(tight, WHO)])
    assert [r.allowed for r in results] == [True, False]
    assert store.decide([Check(limited, WHO)])[0].allowed  # the slot was never taken


# -- through the middleware -----------------------------------------------------------------


@pytest.fixture
def in_flight_rule() -> Iterator[None]:
    views.HOLD.clear()
    yield
    views.HOLD.set()  # whatever the test did, no request stays held


def held_requests(count: int) -> tuple[list[threading.Thread], list[int]]:
    statuses: list[int] = []

    def one() -> None:
        try:
            statuses.append(Client().get("/inflight/held/").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, statuses


def in_flight(redis_client: Any) -> int:
    return sum(int(redis_client.zcard(key)) for key in redis_client.keys("thr:*n:{*"))


@pytest.mark.django_db(transaction=True)
def test_requests_in_flight_are_limited_and_released_when_done(
    in_flight_rule: None, redis_client: Any
) -> None:
    rule("in flight", "/inflight/", 2, algorithm="concurrency")
    threads, statuses = held_requests(2)
    wait_until(lambda: in_flight(redis_client) == 2, within=5)
    response = Client().get("/inflight/held/")
    assert response.status_code == 429 and response["Retry-After"] == "1"
    views.HOLD.set()
    for thread in threads:
        thread.join()
    assert statuses == [200, 200]
    assert in_flight(redis_client) == 0  # both released when their responses were closed
    assert Client().get("/inflight/held/").status_code == 200


def test_a_streaming_response_holds_its_slot_until_streamed(
    client: Any, in_flight_rule: None, redis_client: Any
) -> None:
    rule("in flight", "/inflight/", 1, algorithm="concurrency")
    streaming = client.get("/inflight/streaming/")
    assert streaming.status_code == 200
    assert client.get("/inflight/held/").status_code == 429  # still streaming
    views.HOLD.set()
    assert b"".join(streaming.streaming_content) == b"first last"  # closes it
    assert in_flight(redis_client) == 0
    assert client.get("/inflight/held/").status_code == 200


def test_a_view_that_raises_releases_its_slot(client: Any, redis_client: Any) -> None:
    rule("in flight", "/inflight/", 1, algorithm="concurrency")
    client.raise_request_exception = False
    assert [client.get("/inflight/raising/").status_code for _ in range(3)] == [500] * 3
    assert in_flight(redis_client) == 0


@pytest.mark.django_db(transaction=True)
def test_asgi_a_client_that_goes_away_releases_its_slot(redis_client: Any) -> None:
    rule("in flight", "/inflight/", 1, algorithm="concurrency")

    async def body() -> list[Any]:
        with database_kept_open():
            app = ASGIHandler()
            statuses = [(await asgi_get(app, "/inflight/async/"))[0]]
            statuses.append((await asgi_get(app, "/inflight/async-slow/", 0.2))[0])
            statuses.append((await asgi_get(app, "/inflight/async/"))[0])
            return statuses

    assert run(body) == [200, None, 200]  # the slow one's client left: no response
    assert in_flight(redis_client) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
def test_asgi_a_slot_the_view_takes_after_its_client_left_ends_with_the_view(
    redis_client: Any,
) -> None:
    """The client leaves before the sync view has taken its slot (check() in the view): the
    slot still ends when the view returns, not a lease's period later."""
    rule("inview", "inview", 1, algorithm="concurrency", unit="minute")

    async def body() -> Any:
        with database_kept_open():
            app = ASGIHandler()
            await asgi_get(app, "/plain/")  # URLs and rules loaded: the view starts at once
            return (await asgi_get(app, "/late-check/", 0.1))[0]

    assert run(body) is None  # the client left: no response
    time.sleep(1.0)  # the view (0.5 s) has long returned
    assert in_flight(redis_client) == 0


@pytest.mark.django_db(transaction=True)
def test_asgi_requests_in_flight_are_limited(redis_client: Any) -> None:
    rule("in flight", "/inflight/", 1, algorithm="concurrency")

    async def body() -> list[Any]:
        import asyncio

        with database_kept_open():
            app = ASGIHandler()
            slow = asyncio.ensure_future(asgi_get(app, "/inflight/async-slow/", 0.5))
            await asyncio.sleep(0.2)
            during = (await asgi_get(app, "/inflight/async/"))[0]
            await slow
            after = (await asgi_get(app, "/inflight/async/"))[0]
            return [during, after]

    assert run(body) == [429, 200]


def test_the_admin_explains_a_concurrency_rule() -> None:
    exports = rule(
        "exports", "export", 3, key_kind="user", algorithm="concurrency", per=10, unit="minute"
    )
    assert exports.explanation == (
        "at most 3 requests in flight per user (anonymous requests not counted) "
        "(a slot lasts 10 minutes at most)"
    )
    assert exports.rate_description == "3 in flight"


@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_s_slot_frees_when_its_lease_ends(redis_server: Any) -> None:
    rule("exports", "exports", 1, key_kind="user", algorithm="concurrency", per=2, unit="second")
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    worker = context.Process(
        target=lease_holder, args=(redis_server.url, dict(connection.settings_dict), ready)
    )
    worker.start()
    try:
        assert ready.get(timeout=30) is True  # it holds the slot
        worker.kill()
        worker.join()
        assert not check_key("exports", "user:7").allowed  # dead, and still holding it
        wait_until(lambda: check_key("exports", "user:7", dry_run=True).allowed, within=3)
        assert check_key("exports", "user:7").allowed
    finally:
        worker.kill()
        worker.join()


def test_a_response_replaced_by_an_outer_middleware_still_releases(
    client: Any, settings: Any, redis_client: Any
) -> None:
    """ConditionalGetMiddleware answers 304 instead of the view's response, which is then
    never closed: the slot ends with the request all the same."""
    settings.MIDDLEWARE = ["django.middleware.http.ConditionalGetMiddleware", *settings.MIDDLEWARE]
    rule("in flight", "/inflight/", 1, algorithm="concurrency")
    statuses = [
        client.get("/inflight/etag/", HTTP_IF_NONE_MATCH='"v1"').status_code for _ in range(3)
    ]
    assert statuses == [304, 304, 304]
    assert in_flight(redis_client) == 0


def test_slots_taken_from_the_local_fallback_are_given_back_to_it(
    client: Any, settings: Any, redis_server: Any
) -> None:
    """Redis is down: the fail-open rule counts in the process, and each finished request
    ends its slot there."""
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "TIMEOUT": 0.2,
        "CONNECT_TIMEOUT": 0.2,
        "BREAKER_INTERVAL": 30,
    }
    rule("in flight", "/inflight/", 1, algorithm="concurrency", fail_mode="open")
    views.HOLD.set()
    assert client.get("/inflight/held/").status_code == 200
    redis_server.pause()
    try:
        assert [client.get("/inflight/held/").status_code for _ in range(4)] == [200] * 4
    finally:
        redis_server.resume()
