"""MAX_DELAYED: a process holds at most that many requests for delay rules at once; past it a
request is rejected with 429 at once (what it took given back), so one client cannot hold
every worker thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from django_throttle.rules import rule_cache
from tests.helpers import rule

pytestmark = [pytest.mark.usefixtures("throttle_middleware")]


@pytest.mark.django_db(transaction=True)
def test_requests_past_the_cap_are_turned_away_at_once(settings: Any) -> None:
    # Five requests of one client: the cap per client (1 by default) is lifted, to see the
    # cap of the process alone.
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "MAX_DELAYED": 2,
        "MAX_DELAYED_PER_CLIENT": None,
    }
    rule(
        "queued",
        "/api/",
        1,
        unit="second",
        algorithm="leaky_bucket",
        burst=20,
        action="delay",
    )
    assert Client().get("/api/items/").status_code == 200  # rules loaded, the bucket started
    barrier = threading.Barrier(5)
    done: list[tuple[float, int, str | None]] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        try:
            response = Client().get("/api/items/")
        finally:
            connection.close()
        with lock:
            done.append((time.monotonic(), response.status_code, response.get("Retry-After")))

    threads = [threading.Thread(target=one) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.sort()
    statuses = [status for _, status, _ in done]
    # Two held (each for its turn, 1 and 2 s away), three turned away: and those answered
    # before any held request was let through.
    assert statuses == [429, 429, 429, 200, 200]
    assert all(int(retry or 0) >= 1 for _, status, retry in done if status == 429)


@pytest.mark.django_db
def test_zero_turns_every_delayed_request_away(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "MAX_DELAYED": 0}
    rule("queued", "/api/", 1, unit="minute", algorithm="leaky_bucket", burst=5, action="delay")
    statuses = [client.get("/api/items/").status_code for _ in range(3)]
    # The first has no wait; the next would wait their turn, and are turned away instead,
    # giving back what they took: the bucket holds one request, not three.
    assert statuses == [200, 429, 429]
    response = client.get("/api/items/")
    assert response.status_code == 429 and response["X-RateLimit-Remaining"] == "4"


@pytest.mark.django_db
def test_a_request_turned_away_is_a_rejection_on_the_dashboard(client: Any, settings: Any) -> None:
    from django_throttle.models import Rejection
    from django_throttle.rejection_log import flush

    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "MAX_DELAYED": 0}
    rule("queued", "/api/", 1, unit="minute", algorithm="leaky_bucket", burst=5, action="delay")
    assert [client.get("/api/items/").status_code for _ in range(3)] == [200, 429, 429]
    flush()
    assert sum(Rejection.objects.filter(rule="queued").values_list("count", flat=True)) == 2


@pytest.mark.django_db(transaction=True)
def test_a_turned_away_request_is_not_announced_to_every_process(
    settings: Any, redis_client: Any
) -> None:
    """What a turned-away delay gives back is not announced as a reset: a flood of them must not
    empty every process's block cache and cost a store call each."""
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "MAX_DELAYED": 0}
    rule("queued", "/api/", 1, unit="second", algorithm="leaky_bucket", burst=20, action="delay")
    client = Client()
    assert client.get("/api/items/").status_code == 200
    blocks_key = rule_cache().version.blocks_key
    before = redis_client.get(blocks_key)
    statuses = [client.get("/api/items/").status_code for _ in range(10)]
    assert statuses == [429] * 10  # each admitted with a delay, then turned away
    assert redis_client.get(blocks_key) == before
