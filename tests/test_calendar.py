"""Calendar quotas: weeks from Monday 00:00 and months from the 1st 00:00 in TIME_ZONE, counted
by the fixed window, on both backends.

The Redis backend is a real redis-server whose wall clock is moved to the moment under test
(tests/clock_shift.py), so the window is chosen by the server's TIME, months away from this
process's clock; the memory backend runs on an injected clock set to the same moment.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError

from django_throttle import check
from django_throttle.calendar_windows import CalendarWindows
from django_throttle.checks import check_settings
from django_throttle.compiled import build_rule
from django_throttle.conf import E_TIME_ZONE
from django_throttle.decorators import throttle
from django_throttle.rates import UNIT_SECONDS, parse_rate
from django_throttle.store import Check, MemoryStore, RedisStore, Result
from django_throttle.store.redis import DECIDE_SOURCE
from tests.clock_shift import shifted
from tests.helpers import rule
from tests.redis_server import RedisServer

US = 1_000_000
CLIENT = "ip:203.0.113.7"
HOUR = 3600


def at(text: str, zone: str, fold: int = 0) -> float:
    """Epoch seconds of a local time, ``"2027-03-28 01:59:59.000"`` in ``zone``
    (Python 3.10 reads fractions of three or six digits only)."""
    local = datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone), fold=fold)
    return local.timestamp()


def utc(text: str) -> float:
    return datetime.fromisoformat(text + "+00:00").timestamp()


def calendar_rule(unit: str, limit: int, zone: str, per: int = 1, rule_id: int = 1) -> Any:
    return build_rule(
        id=rule_id,
        name=f"{per} {unit}",
        algorithm="fixed_window",
        limit=limit,
        period=per * UNIT_SECONDS[unit],
        calendar=CalendarWindows(unit, per, zone),
    )


class MemoryAt:
    """A MemoryStore on an injected clock, started at ``moment``."""

    def __init__(self, moment: float) -> None:
        self.clock_us = round(moment * US)
        self.store = MemoryStore(clock=lambda: self.clock_us)

    def now(self) -> float:
        return self.clock_us / US

    def wait_until(self, moment: float) -> None:
        self.clock_us = max(self.clock_us, round(moment * US))

    def close(self) -> None:
        pass


class RedisAt:
    """A real redis-server whose wall clock reads ``moment`` now, and a RedisStore on it."""

    def __init__(self, moment: float) -> None:
        self.server = RedisServer(env=shifted(moment - time.time()))
        self.server.start()
        self.client = self.server.client()
        self.store = RedisStore(self.client)

    def now(self) -> float:
        seconds, micros = self.client.time()
        return seconds + micros / US

    def wait_until(self, moment: float) -> None:
        while (left := moment - self.now()) > 0:
            time.sleep(left)

    def close(self) -> None:
        self.client.close()
        self.server.close()


@pytest.fixture(params=["memory", "redis"])
def backend_at(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Makes a backend whose clock reads the moment given."""
    made: list[MemoryAt | RedisAt] = []

    def make(moment: float) -> MemoryAt | RedisAt:
        backend = MemoryAt(moment) if request.param == "memory" else RedisAt(moment)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def decide(backend: Any, *rules: Any, dry_run: bool = False) -> list[Result]:
    return backend.store.decide([Check(r, CLIENT) for r in rules], dry_run=dry_run)  # type: ignore[no-any-return]


def test_a_month_starts_again_at_midnight_on_the_first(backend_at: Any) -> None:
    zone = "Europe/Berlin"
    backend = backend_at(at("2026-12-31 23:59:58.800", zone))
    month = calendar_rule("month", 3, zone)
    new_year = at("2027-01-01 00:00:00", zone)
    assert [decide(backend, month)[0].allowed for _ in range(4)] == [True] * 3 + [False]
    rejected = decide(backend, month)[0]
    assert rejected.reset_at == pytest.approx(new_year, abs=1e-6)
    assert 0 < rejected.retry_after <= 1.2  # decided between 23:59:58.8 and midnight
    backend.wait_until(new_year + 0.05)
    first = decide(backend, month)[0]
    assert first.allowed and first.remaining == 2
    assert first.reset_at == pytest.approx(at("2027-02-01 00:00:00", zone), abs=1e-6)


@pytest.mark.parametrize(
    ("zone", "before", "unit", "reset_utc"),
    [
        # Spring forward at 02:00 CET: the month that began at +01:00 ends at +02:00.
        ("Europe/Berlin", "2027-03-28 01:59:59", "month", "2027-03-31 22:00:00"),
        # The week of the change has 167 hours: it began Monday 22 March 00:00 CET.
        ("Europe/Berlin", "2027-03-28 01:59:59", "week", "2027-03-28 22:00:00"),
        # Fall back at 02:00 EDT to 01:00 EST: that week has 169 hours.
        ("America/New_York", "2026-11-01 01:59:59", "week", "2026-11-02 05:00:00"),
        # Southern hemisphere: daylight saving ends in April, a month that began at +11:00.
        ("Australia/Sydney", "2027-04-04 02:59:59", "month", "2027-04-30 14:00:00"),
    ],
)
def test_a_window_across_a_daylight_saving_change_ends_at_local_midnight(
    backend_at: Any, zone: str, before: str, unit: str, reset_utc: str
) -> None:
    backend = backend_at(at(before, zone))
    limited = calendar_rule(unit, 4, zone)
    assert [decide(backend, limited)[0].allowed for _ in range(2)] == [True, True]
    backend.wait_until(at(before, zone) + 1.2)  # past the change of offset
    results = [decide(backend, limited)[0] for _ in range(3)]
    # The same window on both sides of the change: the count goes on.
    assert [r.allowed for r in results] == [True, True, False]
    assert [r.remaining for r in results] == [1, 0, 0]
    assert results[-1].reset_at == pytest.approx(utc(reset_utc), abs=1e-6)


def test_quarters_and_fortnights(backend_at: Any) -> None:
    """``per`` calendar units: 3 months are the quarters of the year, 2 weeks start on every
    other Monday counted from the first Monday of 1970."""
    zone = "UTC"
    backend = backend_at(at("2027-02-14 12:00:00", zone))
    quarter = calendar_rule("month", 5, zone, per=3, rule_id=1)
    fortnight = calendar_rule("week", 5, zone, per=2, rule_id=2)
    q, f = decide(backend, quarter, fortnight)
    assert q.reset_at == pytest.approx(utc("2027-04-01 00:00:00"), abs=1e-6)
    # Monday 2027-02-15 is 2,980 weeks after Monday 1970-01-05, an even number.
    assert f.reset_at == pytest.approx(utc("2027-02-15 00:00:00"), abs=1e-6)


def evalsha_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_store_clock_far_from_this_process_costs_one_call_more_once() -> None:
    """This process's clock is months from the server's: the first decision finds the windows
    sent wrong and is sent again with windows around the server's time; the next ones are
    right at once."""
    zone = "Europe/Berlin"
    backend = RedisAt(at("2027-07-15 12:00:00", zone))
    try:
        month = calendar_rule("month", 10, zone)
        fixed = build_rule(id=2, name="minute", algorithm="fixed_window", limit=10, period=60)
        backend.client.script_load(DECIDE_SOURCE)  # a first EVALSHA would get NOSCRIPT
        before = evalsha_calls(backend.client)
        first = decide(backend, fixed, month)
        assert evalsha_calls(backend.client) - before == 2
        # Nothing was counted by the call that found the windows wrong.
        assert [r.remaining for r in first] == [9, 9]
        assert first[1].reset_at == pytest.approx(at("2027-08-01 00:00:00", zone), abs=1e-6)
        decide(backend, fixed, month)
        assert evalsha_calls(backend.client) - before == 3
    finally:
        backend.close()


def test_the_call_that_finds_the_windows_wrong_writes_nothing() -> None:
    """A rule that rejects and blocks comes before the calendar check: its block is written by
    the call sent again only (decide.lua makes every write after evaluating every check)."""
    backend = RedisAt(at("2027-07-15 12:00:00", "UTC"))
    try:
        backend.client.script_load(DECIDE_SOURCE)
        blocking = build_rule(
            id=1, name="b", algorithm="fixed_window", limit=1, period=60, block=HOUR
        )
        month = calendar_rule("month", 10, "UTC", rule_id=2)
        results = backend.store.decide([Check(blocking, CLIENT, 2), Check(month, CLIENT)])
        assert [(r.allowed, r.blocked) for r in results] == [(False, True), (True, False)]
        stats = backend.client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 2
        assert stats["cmdstat_set"]["calls"] == 1  # the block; the rejected request counts nothing
    finally:
        backend.close()


# -- through the public surface -------------------------------------------------------------


@pytest.fixture
def berlin_at_new_year(settings: Any) -> Iterator[RedisServer]:
    """The test settings' Redis replaced by one whose clock is 2 s before 2027 in Berlin."""
    server = RedisServer(env=shifted(at("2026-12-31 23:59:58", "Europe/Berlin") - time.time()))
    server.start()
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": server.url},
    }
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIME_ZONE": "Europe/Berlin"}
    yield server
    server.close()


@pytest.mark.django_db
@pytest.mark.usefixtures("throttle_middleware")
def test_headers_show_the_true_reset_of_a_monthly_quota(
    client: Any, berlin_at_new_year: RedisServer
) -> None:
    rule("api", "/api/", 2, unit="month", algorithm="fixed_window")
    new_year = int(at("2027-01-01 00:00:00", "Europe/Berlin"))
    responses = [client.get("/api/items/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    for response in responses:
        assert response["X-RateLimit-Reset"] == str(new_year)
        assert response["X-RateLimit-Limit"] == "2"
    assert 1 <= int(responses[-1]["Retry-After"]) <= 2


@pytest.mark.django_db
def test_check_counts_a_calendar_week_of_a_code_default(
    rf: Any, berlin_at_new_year: RedisServer
) -> None:
    """``@throttle(rate="2/week")``: a calendar week, fixed window unless told otherwise."""
    throttle("calendar-weekly", rate="2/week", key="ip")
    decisions = [check(rf.get("/"), "calendar-weekly") for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    # 2026-12-31 is a Thursday: the week ends on Monday 4 January 2027, 00:00 in Berlin.
    assert decisions[-1].reset_at == pytest.approx(at("2027-01-04 00:00:00", "Europe/Berlin"))


# -- what a calendar unit accepts ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "unit", "per"),
    [
        ("10000/month", 10000, "month", 1),
        ("10000/mo", 10000, "month", 1),
        ("300/3 months", 300, "month", 3),
        ("50/w", 50, "week", 1),
        ("50/2weeks", 50, "week", 2),
    ],
)
def test_rates_per_week_and_month(text: str, limit: int, unit: str, per: int) -> None:
    rate = parse_rate(text)
    assert (rate.limit, rate.unit, rate.per, rate.calendar) == (limit, unit, per, True)


def test_the_decorator_counts_calendar_units_with_the_fixed_window_only() -> None:
    with pytest.raises(ValueError, match="only algorithm fixed_window"):
        throttle("calendar-bad", rate="10/month", algorithm="token_bucket")


@pytest.mark.django_db
def test_a_calendar_rule_must_use_the_fixed_window() -> None:
    with pytest.raises(ValidationError) as info:
        rule("monthly", "/api/", 10000, unit="month", algorithm="sliding_window_counter")
    assert "calendar windows" in str(info.value.message_dict["algorithm"])
    made = rule("monthly", "/api/", 10000, unit="month", algorithm="fixed_window")
    assert made.explanation.startswith(
        "at most 10000 requests per month per client IP (counted from the 1st of a month, "
        "00:00 UTC)"
    )


def test_a_compiled_calendar_rule_refuses_other_algorithms() -> None:
    with pytest.raises(ValueError, match="fixed window only"):
        build_rule(
            id=1,
            name="x",
            algorithm="token_bucket",
            limit=1,
            period=UNIT_SECONDS["week"],
            calendar=CalendarWindows("week", 1, "UTC"),
        )


def test_an_unknown_time_zone_is_reported(settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIME_ZONE": "Mars/Olympus_Mons"}
    errors = [e for e in check_settings() if e.id == E_TIME_ZONE]
    assert len(errors) == 1 and "Mars/Olympus_Mons" in errors[0].msg


@pytest.mark.django_db
def test_a_calendar_rule_in_an_unknown_zone_is_skipped_not_a_500(
    client: Any, settings: Any, throttle_middleware: None, caplog: Any
) -> None:
    """The rule cannot be compiled; requests go on, under the other rules."""
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIME_ZONE": "Mars/Olympus_Mons"}
    rule("monthly", "/api/", 1, unit="month", algorithm="fixed_window")
    rule("minute", "/api/", 2, algorithm="fixed_window")
    assert [client.get("/api/items/").status_code for _ in range(3)] == [200, 200, 429]
    assert "Mars/Olympus_Mons" in caplog.text


def test_calendar_windows_are_local_midnights() -> None:
    windows = CalendarWindows("month", 1, "Europe/Berlin")
    starts = windows.starts(at("2027-03-15 12:00:00", "Europe/Berlin"))
    assert [datetime.fromtimestamp(s, windows.zone).isoformat() for s in starts] == [
        "2027-02-01T00:00:00+01:00",
        "2027-03-01T00:00:00+01:00",
        "2027-04-01T00:00:00+02:00",
        "2027-05-01T00:00:00+02:00",
    ]
    assert starts[2] - starts[1] == 31 * 24 * HOUR - HOUR
