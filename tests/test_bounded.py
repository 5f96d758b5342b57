"""Bounded work per decision and one clock: a cost no rule can ever admit is rejected without a
store call; what responses and the dashboard say about time is reckoned from the store's
clock (a real redis-server whose clock is an hour behind this process's)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from django_throttle import check
from django_throttle.models import Rejection
from django_throttle.rejection_log import flush
from tests.clock_shift import shifted
from tests.helpers import rule
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

HOUR = 3600


@pytest.mark.parametrize("algorithm", ["sliding_window_log", "fixed_window", "token_bucket"])
def test_a_cost_above_what_a_rule_can_ever_admit_costs_no_store_call(
    client: Any, store_calls: Any, algorithm: str
) -> None:
    rule("heavy", "heavy", 5, unit="hour", algorithm=algorithm)
    calls = store_calls.decisions
    response = client.get("/heavy/?n=6")
    assert response.status_code == 429
    assert int(response["Retry-After"]) == HOUR  # a whole window: it will never fit
    assert store_calls.decisions == calls
    assert client.get("/heavy/?n=5").status_code == 200  # as much as it can hold: admitted


@pytest.fixture
def an_hour_behind(settings: Any) -> Iterator[RedisServer]:
    """The test settings' Redis replaced by one whose clock reads an hour before ours."""
    server = RedisServer(env=shifted(-HOUR))
    server.start()
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": server.url},
    }
    yield server
    server.close()


def server_now(server: RedisServer) -> float:
    client = server.client()
    try:
        seconds, micros = client.time()
        return float(seconds) + micros / 1e6
    finally:
        client.close()


def test_headers_count_down_on_the_store_s_clock(client: Any, an_hour_behind: RedisServer) -> None:
    rule("hourly", "/api/", 1, unit="hour", algorithm="fixed_window")
    response = client.get("/api/items/")
    now = server_now(an_hour_behind)
    reset = int(response["X-RateLimit-Reset"])
    assert reset == (int(now) // HOUR + 1) * HOUR  # the server's window
    seconds = int(re.search(r";t=(\d+)", response["RateLimit"]).group(1))  # type: ignore[union-attr]
    assert abs(seconds - (reset - now)) <= 2  # not 0, as the local clock would say
    assert seconds > 0 or reset - now < 2


def test_rejections_are_filed_at_the_store_s_minute(
    client: Any, an_hour_behind: RedisServer
) -> None:
    rule("hourly", "/api/", 1, unit="hour", algorithm="fixed_window")
    assert [client.get("/api/items/").status_code for _ in range(2)] == [200, 429]
    flush()
    minute = Rejection.objects.get(rule="hourly").minute
    server_minute = datetime.fromtimestamp(server_now(an_hour_behind) // 60 * 60, timezone.utc)
    assert abs((minute - server_minute).total_seconds()) <= 60
    assert minute < datetime.fromtimestamp(time.time() - HOUR / 2, timezone.utc)


def test_a_check_reports_the_store_s_time() -> None:
    rule("hourly", "hourly", 1, unit="hour", algorithm="fixed_window")
    from django.test import RequestFactory

    before = time.time()
    decision = check(RequestFactory().get("/"), "hourly")
    assert decision.decided_at is not None and before - 1 < decision.decided_at < time.time() + 1


def test_the_dashboard_s_last_hour_is_the_store_s(
    admin_client: Any, client: Any, an_hour_behind: RedisServer
) -> None:
    """Filed at the store's minute, an hour before this host's: still in the last hour."""
    rule("hourly", "/api/", 1, unit="hour", algorithm="fixed_window")
    assert [client.get("/api/items/").status_code for _ in range(3)] == [200, 429, 429]
    totals = admin_client.get("/admin/django_throttle/dashboard/data/?period=hour").json()
    assert {t["rule"]: t["total"] for t in totals["totals"]} == {"hourly": 2}
