"""Enforcement through the test client: scopes, decorators, cost, shadow and delay actions,
check()/reset(), DRF, one store call per request, and a store outage."""

from __future__ import annotations

import asyncio
import gc
import time
from functools import partial
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory

from django_throttle import acheck, check, reset
from django_throttle.models import Rule
from django_throttle.signals import request_throttled
from tests.helpers import rule, run, statuses

pytestmark = pytest.mark.django_db

MW = pytest.mark.usefixtures("throttle_middleware")


@pytest.fixture
def throttled() -> Any:
    """The request_throttled signals sent during the test, as (rule, shadow) pairs."""
    sent: list[tuple[str, bool]] = []

    def receiver(sender: Any, rule: str, shadow: bool, **kwargs: Any) -> None:
        sent.append((rule, shadow))

    request_throttled.connect(receiver)
    yield sent
    request_throttled.disconnect(receiver)


# -- scope forms ----------------------------------------------------------------------


@MW
def test_star_scope_counts_every_request(client: Any) -> None:
    rule("everything", "*", 2)
    assert client.get("/plain/").status_code == 200
    assert client.get("/api/items/").status_code == 200
    assert client.get("/users/1/").status_code == 429


@MW
def test_path_prefix_scope_counts_only_paths_under_it(client: Any) -> None:
    rule("api", "/api/", 2)
    assert statuses(client, "/plain/", 3) == [200, 200, 200]
    assert statuses(client, "/api/items/", 3) == [200, 200, 429]
    assert client.get("/plain/").status_code == 200


@MW
def test_regex_scope_matches_the_whole_path_pattern(client: Any) -> None:
    rule("user pages", r"^/users/\d+/$", 2)
    assert statuses(client, "/plain/", 3) == [200, 200, 200]
    assert client.get("/users/1/").status_code == 200
    assert client.get("/users/22/").status_code == 200
    assert client.get("/users/333/").status_code == 429


@MW
def test_url_name_scope(client: Any) -> None:
    rule("plain page", "plain", 1)
    assert statuses(client, "/plain/", 2) == [200, 429]
    # The same view under another URL name is not covered.
    assert statuses(client, "/api/items/", 2) == [200, 200]


@MW
def test_namespaced_url_name_scope(client: Any) -> None:
    rule("shop page", "shop:named", 1)
    assert statuses(client, "/shop/named/", 2) == [200, 429]
    assert statuses(client, "/plain/", 2) == [200, 200]


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "decorator-alone"])
def test_decorator_scope(client: Any, request: Any, middleware: bool) -> None:
    if middleware:
        request.getfixturevalue("throttle_middleware")
    rule("login", "login", 2)
    assert statuses(client, "/login/", 3) == [200, 200, 429]


@MW
def test_methods_filter_counts_only_the_listed_methods(client: Any) -> None:
    rule("api writes", "/api/", 1, methods="POST")
    assert statuses(client, "/api/items/", 3) == [200, 200, 200]
    assert statuses(client, "/api/items/", 2, method="post") == [200, 429]
    assert client.get("/api/items/").status_code == 200


@MW
def test_404s_are_counted_under_star(client: Any) -> None:
    rule("everything", "*", 2)
    assert statuses(client, "/missing/", 3) == [404, 404, 429]


@MW
def test_404s_are_counted_under_a_path_prefix(client: Any) -> None:
    rule("api", "/api/", 2)
    assert statuses(client, "/missing/", 3) == [404, 404, 404]
    assert statuses(client, "/api/missing/", 2) == [404, 404]
    assert client.get("/api/missing/").status_code == 429
    assert client.get("/api/items/").status_code == 429  # the same counter


# -- code defaults and admin rules ---------------------------------------------------


def test_code_default_applies_without_an_admin_rule(client: Any) -> None:
    assert statuses(client, "/search/", 4) == [200, 200, 200, 429]


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "decorator-alone"])
def test_admin_rule_replaces_the_code_default(
    client: Any, request: Any, middleware: bool, django_capture_on_commit_callbacks: Any
) -> None:
    if middleware:
        request.getfixturevalue("throttle_middleware")
    admin_rule = rule("search", "search", 5)
    assert statuses(client, "/search/", 6) == [200] * 5 + [429]
    admin_rule.enabled = False
    with django_capture_on_commit_callbacks(execute=True):
        admin_rule.save()
    # In force at once in this process (the default's counter is its own).
    assert statuses(client, "/search/", 4) == [200, 200, 200, 429]


# -- decorators ------------------------------------------------------------------------


@MW
def test_counted_once_with_middleware_and_decorator(client: Any) -> None:
    # /search/ is decorated with @throttle("search") and its URL is named "search": the rule
    # matches twice, through the URL name and the decorator, and counts once.
    rule("search", "search", 10, algorithm="token_bucket", unit="hour")
    remaining = [client.get("/search/")["X-RateLimit-Remaining"] for _ in range(3)]
    assert remaining == ["9", "8", "7"]


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "decorator-alone"])
def test_stacked_decorators_inner_limit_rejects(
    client: Any, request: Any, middleware: bool
) -> None:
    if middleware:
        request.getfixturevalue("throttle_middleware")
    assert statuses(client, "/stacked/", 3) == [200, 200, 429]


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "decorator-alone"])
def test_class_based_view_via_method_decorator(client: Any, request: Any, middleware: bool) -> None:
    if middleware:
        request.getfixturevalue("throttle_middleware")
    assert statuses(client, "/class/", 3) == [200, 200, 429]


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "decorator-alone"])
def test_async_view_through_async_client(async_client: Any, request: Any, middleware: bool) -> None:
    if middleware:
        request.getfixturevalue("throttle_middleware")

    async def body() -> list[int]:
        return [(await async_client.get("/async/")).status_code for _ in range(3)]

    assert run(body) == [200, 200, 429]


@MW
def test_async_client_with_admin_rules_user_keys_and_404s(async_client: Any) -> None:
    # Rules load from the database and user keys read the session: neither may run inside
    # the event loop.
    rule("api", "/api/", 1, key_kind="user")
    rule("everything", "*", 5)
    user = User.objects.create_user("alice")

    async def body() -> list[int]:
        codes = [(await async_client.get("/api/items/")).status_code for _ in range(2)]
        await async_client.aforce_login(user)
        codes += [(await async_client.get("/api/items/")).status_code for _ in range(2)]
        codes += [(await async_client.get("/missing/")).status_code for _ in range(3)]
        return codes

    # Anonymous: not counted by the user rule; alice: 1 admitted (her refused request
    # consumes nothing from '*'); then 404s count under '*' (5) on the way out.
    assert run(body) == [200, 200, 200, 429, 404, 404, 429]


# -- cost ------------------------------------------------------------------------------


def test_cost_takes_that_many_from_the_limit(client: Any) -> None:
    # export: 10/m, each request costs 4.
    assert statuses(client, "/export/", 3) == [200, 200, 429]


def test_callable_cost(client: Any) -> None:
    # heavy: 10/m, the cost is the n parameter.
    assert client.get("/heavy/", {"n": 6}).status_code == 200
    assert client.get("/heavy/", {"n": 5}).status_code == 429
    assert client.get("/heavy/", {"n": 4}).status_code == 200
    assert client.get("/heavy/", {"n": 1}).status_code == 429


# -- shadow rules and signals ----------------------------------------------------------


@MW
def test_log_rule_never_blocks_and_signals_shadow(client: Any, throttled: Any) -> None:
    rule("trial", "/api/", 1, action="log")
    assert statuses(client, "/api/items/", 3) == [200, 200, 200]
    assert throttled == [("trial", True), ("trial", True)]


@MW
def test_rejection_signals_not_shadow(client: Any, throttled: Any) -> None:
    rule("api", "/api/", 1)
    assert statuses(client, "/api/items/", 2) == [200, 429]
    assert throttled == [("api", False)]


# -- delay -----------------------------------------------------------------------------

INTERVAL = 0.2  # 5/second: one request per 0.2 s leaves the bucket
TOLERANCE = 0.02  # Redis TIME and time.monotonic are different clocks
SLACK = 0.5  # scheduling on a busy machine


def delay_rule() -> Rule:
    return rule(
        "smooth",
        "/api/",
        5,
        unit="second",
        algorithm="leaky_bucket",
        burst=3,
        action="delay",
    )


@MW
def test_delay_holds_each_request_until_its_turn(client: Any) -> None:
    delay_rule()
    start = time.monotonic()
    served = []  # seconds from the first request's start until each response
    for _ in range(3):
        before = time.monotonic()
        assert client.get("/api/items/").status_code == 200
        after = time.monotonic()
        served.append(after - start)
        assert after - before <= 3 * INTERVAL + SLACK  # never held past the queue
    # The first is served at once, the second one interval after it, the third two.
    assert served[1] >= INTERVAL - TOLERANCE
    assert served[2] >= 2 * INTERVAL - TOLERANCE


@MW
def test_delay_rejects_beyond_the_queue(async_client: Any) -> None:
    delay_rule()

    async def body() -> list[tuple[int, float]]:
        start = time.monotonic()

        async def timed() -> tuple[int, float]:
            response = await async_client.get("/api/items/")
            return response.status_code, time.monotonic() - start

        return list(await asyncio.gather(*(timed() for _ in range(4))))

    results = run(body)
    assert sorted(status for status, _ in results) == [200, 200, 200, 429]
    served = sorted(elapsed for status, elapsed in results if status == 200)
    # Arriving together: one served at once, the next one interval later, the third two.
    assert INTERVAL - TOLERANCE <= served[1] <= 3 * INTERVAL + SLACK
    assert 2 * INTERVAL - TOLERANCE <= served[2] <= 3 * INTERVAL + SLACK


# -- check(), reset(), acheck() ----------------------------------------------------------


def test_failed_login_view_counts_with_check(client: Any) -> None:
    rule("failed logins", "failed-login", 2)
    answers = [client.get("/failed-login/").json() for _ in range(3)]
    assert answers == [
        {"allowed": True, "remaining": 1},
        {"allowed": True, "remaining": 0},
        {"allowed": False, "remaining": 0},
    ]


def test_check_dry_run_and_reset() -> None:
    rule("login attempts", "login", 3, algorithm="token_bucket", unit="hour")
    request = partial(RequestFactory().post, "/login/")  # REMOTE_ADDR 127.0.0.1
    first = check(request(), "login")
    assert (first.allowed, first.limit, first.remaining, first.rule) == (
        True,
        3,
        2,
        "login attempts",
    )
    assert first.reset_at is not None and first.reset_at > time.time()
    for _ in range(2):
        peek = check(request(), "login", dry_run=True)
        assert (peek.allowed, peek.remaining) == (True, 2)
    assert check(request(), "login").remaining == 1
    assert check(request(), "login").remaining == 0
    refused = check(request(), "login")
    assert not refused.allowed
    assert refused.rule == "login attempts"
    assert refused.retry_after > 0
    peek = check(request(), "login", dry_run=True)
    assert (peek.allowed, peek.remaining) == (False, 0)

    assert reset("login", key="ip:127.0.0.1") == 1
    assert check(request(), "login", dry_run=True).remaining == 3
    assert check(request(), "login").allowed


def test_reset_counts_every_rule_of_the_scope() -> None:
    rule("login a", "login", 1)
    rule("login b", "login", 5, key_kind="global")
    request = partial(RequestFactory().get, "/")
    check(request(), "login")
    assert not check(request(), "login").allowed
    assert reset("login", key="ip:127.0.0.1") == 2
    assert check(request(), "login").allowed


def test_check_names_the_deciding_rule() -> None:
    rule("wide", "login", 10, algorithm="token_bucket", unit="hour")
    rule("narrow", "login", 2, algorithm="token_bucket", unit="hour")
    request = partial(RequestFactory().get, "/")
    decision = check(request(), "login")
    assert (decision.rule, decision.remaining) == ("narrow", 1)
    check(request(), "login")
    refused = check(request(), "login")
    assert (refused.allowed, refused.rule) == (False, "narrow")


def test_acheck_counts_like_check() -> None:
    rule("login attempts", "login", 2, algorithm="token_bucket", unit="hour")
    request = partial(RequestFactory().get, "/")

    async def body() -> list[tuple[bool, int | None]]:
        out = []
        for dry_run in (False, True, False, False):
            decision = await acheck(request(), "login", dry_run=dry_run)
            out.append((decision.allowed, decision.remaining))
        return out

    assert run(body) == [(True, 1), (True, 1), (True, 0), (False, 0)]


# -- Django REST framework -----------------------------------------------------------------


def test_drf_rule_throttle_answers_drfs_429_with_retry_after(client: Any) -> None:
    pytest.importorskip("rest_framework")
    rule("orders api", "drf-orders", 2)
    assert statuses(client, "/drf/orders/", 2) == [200, 200]
    response = client.get("/drf/orders/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert "detail" in response.json()  # DRF's own body


# -- one store call per request ----------------------------------------------------------


def store_calls(redis_client: Any) -> dict[str, int]:
    """Calls per command since CONFIG RESETSTAT, without this test's own INFO and CONFIG."""
    stats = redis_client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}
    return {
        name: n for name, n in calls.items() if name.partition("|")[0] not in ("info", "config")
    }


def measure(redis_server: Any, action: Any) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """What the server ran during action(): the commandstats calls, and through MONITOR each
    command's origin ("lua" for a command a script issued, else "tcp") and name."""
    marker = "end-of-measured-action"
    watcher, stats = redis_server.client(), redis_server.client()
    stats.ping()  # connected before the monitor starts
    seen = []
    with watcher.monitor() as monitor:
        stats.config_resetstat()
        action()
        calls = store_calls(stats)
        stats.echo(marker)
        while True:
            entry = monitor.next_command()
            if entry["command"] == f"ECHO {marker}":
                break
            name = entry["command"].split(" ", 1)[0].upper()
            if name not in ("CONFIG", "INFO"):
                seen.append((entry["client_type"], name))
    watcher.close()
    stats.close()
    return calls, seen


@MW
def test_one_store_round_trip_for_five_rules(
    client: Any, redis_client: Any, redis_server: Any, settings: Any
) -> None:
    # No rules-version read may fall inside the measured request.
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "RULES_REFRESH": 3600}
    rule("everything", "*", 100)
    rule("api", "/api/", 100)
    rule("orders path", r"^/api/orders/$", 100)
    rule("orders url", "api-orders", 100)
    rule("orders view", "orders", 100)  # the @throttle("orders") scope
    assert client.get("/api/orders/").status_code == 200  # warm-up: script and rules loaded
    responses = []
    calls, seen = measure(redis_server, lambda: responses.append(client.get("/api/orders/")))
    assert responses[0].status_code == 200
    assert calls["evalsha"] == 1
    # Redis counts the commands a script runs in commandstats too: every call but the
    # EVALSHA came from inside the script, none from another round trip.
    from_clients = [name for origin, name in seen if origin != "lua"]
    assert from_clients == ["EVALSHA"]
    assert sum(calls.values()) == len(seen)
    # The five rules were all counted in that call: each has its state key.
    assert len(redis_client.keys("thr:*")) == 5
    assert responses[0]["X-RateLimit-Remaining"] == "98"


# -- store outage -------------------------------------------------------------------------


@MW
def test_store_outage_never_500(client: Any, redis_server: Any, settings: Any) -> None:
    # The store is tried again at every request, so limiting resumes right after the restart.
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BREAKER_INTERVAL": 0}
    rule("api", "/api/", 2, fail_mode="open")
    rule("accounts", r"^/users/", 2, fail_mode="closed")
    assert client.get("/api/items/").status_code == 200  # rules loaded while Redis is up
    redis_server.kill()
    try:
        assert client.get("/api/items/").status_code == 200
        closed = client.get("/users/1/")
        assert closed.status_code == 503
        assert int(closed["Retry-After"]) >= 1
    finally:
        redis_server.start()
    # The restarted server is empty: limiting resumes from zero.
    assert statuses(client, "/api/items/", 3) == [200, 200, 429]
    assert statuses(client, "/users/1/", 3) == [200, 200, 429]


def test_async_views_under_wsgi_do_not_leak_redis_connections(
    client: Any, redis_client: Any
) -> None:
    # Under WSGI every request to an async view runs in a fresh event loop; the asyncio
    # Redis client of each loop must be closed with it.
    client.get("/async/")
    gc.collect()  # pools left by earlier tests close as they are collected: not this test's
    before = len(redis_client.client_list())
    for _ in range(6):
        client.get("/async/")
    gc.collect()
    assert len(redis_client.client_list()) <= before


def test_a_code_default_of_two_per_fifteen_minutes(client: Any) -> None:
    responses = [client.get("/windowed/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0]["RateLimit-Policy"] == '"windowed";q=2;w=900'
    # The default algorithm, a sliding window counter, may ask to wait into the next window.
    assert 0 < int(responses[-1]["Retry-After"]) <= 2 * 900


@MW
def test_an_admin_rule_of_three_per_fifteen_minutes(client: Any) -> None:
    rule("api", "/api/", 3, per=15, unit="minute", algorithm="sliding_window_log")
    responses = [client.get("/api/items/") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert responses[0]["RateLimit-Policy"] == '"api";q=3;w=900'
    assert 0 < int(responses[-1]["Retry-After"]) <= 900


@MW
def test_a_login_rule_blocks_for_an_hour_after_five_failures(client: Any) -> None:
    rule("login", "/login/", 5, per=15, unit="minute", block_seconds=3600, methods="POST")
    responses = [client.post("/login/", {"username": "a"}) for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    assert 3590 < int(responses[-1]["Retry-After"]) <= 3600
