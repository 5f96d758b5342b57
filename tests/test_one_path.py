"""Every entry point selects and decides as the middleware does: check(), acheck(), the
decorator, the DRF throttle and reset() see the same rules (code defaults included), apply a
rule's fail mode when its key function raises, and count a request at most once per rule."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from django.test import RequestFactory

from django_throttle import acheck, check, reset
from tests.helpers import rule, run, statuses

pytestmark = pytest.mark.django_db

MW = pytest.mark.usefixtures("throttle_middleware")
BROKEN = {"tenant": "tests.keys.tenant", "broken": "tests.keys.broken"}
RATE_HEADERS = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Policy", "RateLimit")


@pytest.fixture
def broken_key_function(settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "KEY_FUNCTIONS": BROKEN}


# -- a key function that raises -----------------------------------------------------------


@pytest.mark.usefixtures("broken_key_function")
def test_check_applies_the_fail_mode_when_a_key_function_raises() -> None:
    rule("closed", "tenant-closed", 5, key_kind="custom", key_arg="broken", fail_mode="closed")
    rule("open", "tenant-open", 5, key_kind="custom", key_arg="broken", fail_mode="open")
    request = partial(RequestFactory().get, "/")
    closed = check(request(), "tenant-closed")  # raised RuntimeError before
    assert (closed.allowed, closed.unavailable, closed.rule) == (False, True, "closed")
    opened = check(request(), "tenant-open")
    assert opened.allowed and not opened.unavailable


@pytest.mark.usefixtures("broken_key_function")
def test_acheck_applies_the_fail_mode_when_a_key_function_raises() -> None:
    rule("closed", "tenant-closed", 5, key_kind="custom", key_arg="broken", fail_mode="closed")

    async def body() -> Any:
        return await acheck(RequestFactory().get("/"), "tenant-closed")

    decision = run(body)
    assert (decision.allowed, decision.unavailable) == (False, True)


# -- code defaults -------------------------------------------------------------------------


def test_check_counts_the_code_default_of_the_scope() -> None:
    # tests/views.py: @throttle("search", rate="3/m", key="ip")
    request = partial(RequestFactory().get, "/anywhere/")
    decisions = [check(request(), "search") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert (decisions[0].rule, decisions[0].limit, decisions[0].remaining) == ("search", 3, 2)
    assert reset("search", "ip:127.0.0.1") == 1
    assert check(request(), "search").allowed


def test_check_shares_the_counter_of_the_decorated_view(client: Any) -> None:
    assert statuses(client, "/search/", 2) == [200, 200]  # the decorator counts 2 of 3
    assert check(RequestFactory().get("/"), "search").remaining == 0
    assert client.get("/search/").status_code == 429


def test_an_admin_rule_replaces_the_code_default_for_check() -> None:
    rule("search admin", "search", 1)
    request = partial(RequestFactory().get, "/")
    assert [check(request(), "search").allowed for _ in range(2)] == [True, False]
    assert check(request(), "search", dry_run=True).rule == "search admin"


def test_drf_throttle_counts_the_code_default(client: Any) -> None:
    pytest.importorskip("rest_framework")
    # DefaultedAPI has throttle_scope "search", whose code default is 3/m.
    assert statuses(client, "/drf/defaulted/", 4) == [200, 200, 200, 429]


# -- counted once per rule, whatever sees the request ---------------------------------------


@MW
def test_drf_view_named_like_its_scope_is_counted_once(client: Any) -> None:
    pytest.importorskip("rest_framework")
    # The URL is named "drf-dual" and the view's throttle_scope is "drf-dual": the middleware
    # (URL name) and RuleThrottle both select the rule; it counts each request once.
    rule("dual", "drf-dual", 5, algorithm="leaky_bucket", burst=5, unit="minute")
    codes = statuses(client, "/drf/dual/", 7, HTTP_ACCEPT="application/json")
    assert codes == [200] * 5 + [429] * 2
    response = client.get("/drf/dual/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert "retry_after" in response.json()  # always the middleware's 429, never DRF's


@MW
def test_decorator_and_check_of_the_same_scope_count_once(client: Any) -> None:
    # @throttle("checked", rate="5/m") and check(request, "checked") in the view.
    bodies = [client.get("/checked/").json() for _ in range(5)]
    assert [b["remaining"] for b in bodies] == [4, 3, 2, 1, 0]
    assert all(b["allowed"] for b in bodies)
    assert client.get("/checked/").status_code == 429


def test_decorator_without_the_middleware_counts_once_with_check(client: Any) -> None:
    bodies = [client.get("/checked/").json() for _ in range(5)]
    assert [b["remaining"] for b in bodies] == [4, 3, 2, 1, 0]
    assert client.get("/checked/").status_code == 429


@MW
def test_url_name_and_check_of_the_same_scope_count_once(client: Any) -> None:
    rule("failed logins", "failed-login", 3)  # the URL is named failed-login too
    bodies = [client.get("/failed-login/").json() for _ in range(3)]
    assert [b["remaining"] for b in bodies] == [2, 1, 0]
    assert client.get("/failed-login/").status_code == 429


def test_repeated_check_on_one_request_counts_once() -> None:
    rule("once", "once", 3)
    request = RequestFactory().get("/")
    first, second = check(request, "once"), check(request, "once")
    assert (first.remaining, second.remaining) == (2, 2)
    assert check(RequestFactory().get("/"), "once").remaining == 1


# -- headers on DRF responses ---------------------------------------------------------------


@MW
def test_drf_responses_carry_the_rate_limit_headers(client: Any) -> None:
    pytest.importorskip("rest_framework")
    rule("orders api", "drf-orders", 2)
    admitted = client.get("/drf/orders/")
    assert admitted.status_code == 200
    assert all(admitted.has_header(h) for h in RATE_HEADERS)
    assert admitted["X-RateLimit-Remaining"] == "1"
    assert admitted["RateLimit"].startswith('"orders api";r=1;')
    client.get("/drf/orders/")
    refused = client.get("/drf/orders/")
    assert refused.status_code == 429
    assert "detail" in refused.json()  # DRF's own 429
    assert all(refused.has_header(h) for h in RATE_HEADERS)
    assert refused["X-RateLimit-Remaining"] == "0"
    assert int(refused["Retry-After"]) >= 1


@pytest.mark.slow
def test_throttle_status_finds_a_code_default_in_a_fresh_process(tmp_path: Any) -> None:
    # No request has loaded the URLconf in a new manage.py process; the default is found all
    # the same. Its database has no tables: the admin rules cannot be read, defaults remain.
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "django", "throttle_status", "search", "ip:192.0.2.1"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "search: 3 of 3 remaining" in result.stdout
