"""The status endpoint: the caller's rules for a path and method, consuming nothing, in one
store call, with the identity a real request would have."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from django_throttle.models import Override, Rule
from tests.helpers import rule
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

STATUS = "/throttle/status/"
ADDRESS = "203.0.113.7"


def status(client: Any, **params: str) -> Any:
    return client.get(STATUS, params, REMOTE_ADDR=ADDRESS)


def rules_of(client: Any, **params: str) -> dict[str, dict[str, Any]]:
    response = status(client, **params)
    assert response.status_code == 200, response.content
    return {entry["name"]: entry for entry in response.json()["rules"]}


def test_it_reports_the_rules_of_a_path_and_consumes_nothing(client: Any) -> None:
    rule("api", "/api/", 3, algorithm="fixed_window")
    rule("everything", "*", 100, algorithm="fixed_window", per=1, unit="hour")
    assert client.get("/api/items/", REMOTE_ADDR=ADDRESS).status_code == 200
    before = time.time()
    first = rules_of(client, path="/api/items/")
    assert set(first) == {"api", "everything"}
    api = first["api"]
    assert (api["limit"], api["remaining"], api["policy"]) == (3, 2, '"api";q=3;w=60')
    assert before <= api["reset"] <= before + 61  # the window's end, Unix seconds
    # Asking again (and the status requests themselves, under "*") spent nothing of "api".
    assert rules_of(client, path="/api/items/")["api"]["remaining"] == 2
    assert [client.get("/api/items/", REMOTE_ADDR=ADDRESS).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    assert rules_of(client, path="/api/items/")["api"]["remaining"] == 0
    # The default path is "/": only the '*' rule covers it.
    assert set(rules_of(client)) == {"everything"}


def test_the_method_and_the_view_choose_the_rules(client: Any) -> None:
    rule("writes", "/api/", 5, methods="POST")
    rule("login-page", "login-page", 4)  # by URL name
    assert set(rules_of(client, path="/api/items/")) == set()
    assert set(rules_of(client, path="/api/items/", method="post")) == {"writes"}
    # The view's @throttle("login") scope has no rule; its URL name has one.
    assert set(rules_of(client, path="/login/")) == {"login-page"}
    # A code default of @throttle: "search" is 3/m per ip.
    search = rules_of(client, path="/search/")
    assert [(e["limit"], e["remaining"]) for e in search.values()] == [(3, 3)]


def test_a_drf_views_throttle_scope_is_listed(client: Any) -> None:
    pytest.importorskip("rest_framework")
    rule("orders", "drf-orders", 4)  # tests/drf_views.py OrdersAPI: RuleThrottle, "drf-orders"
    assert client.get("/drf/orders/", REMOTE_ADDR=ADDRESS).status_code == 200
    entries = rules_of(client, path="/drf/orders/")
    assert (entries["orders"]["limit"], entries["orders"]["remaining"]) == (4, 3)
    assert rules_of(client, path="/drf/free/") == {}  # no RuleThrottle among its classes


def test_the_identity_is_the_callers_own(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TRUSTED_PROXIES": 1}
    rule("per-ip", "/api/", 5, algorithm="fixed_window")
    proxied = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": ADDRESS}
    client.get("/api/items/", **proxied)
    client.get("/api/items/", **proxied)
    # Through the same proxy the client is ADDRESS, which has spent 2; 10.0.0.1 has not.
    seen = client.get(STATUS, {"path": "/api/items/"}, **proxied).json()["rules"]
    assert seen[0]["remaining"] == 3
    direct = client.get(STATUS, {"path": "/api/items/"}, REMOTE_ADDR="10.0.0.2").json()
    assert direct["rules"][0]["remaining"] == 5


def test_users_tiers_overrides_and_exemptions(
    client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    gold = Group.objects.create(name="gold")
    alice = User.objects.create_user("alice")
    alice.groups.add(gold)
    with django_capture_on_commit_callbacks(execute=True):
        per_user = rule("per-user", "/api/", 10, key_kind="user")
        tier = rule("gold", "/api/", 50, applies_to="groups")
        tier.groups.add(gold)
        rule("office", "/api/", 7)
        Override.objects.create(rule=per_user, key=f"user:{alice.pk}", limit=20)
        office = Rule.objects.get(name="office")
        Override.objects.create(rule=office, key=f"ip:{ADDRESS}", exempt=True)
    # Anonymous: no user rule, no tier; the address is exempt from "office".
    assert set(rules_of(client, path="/api/items/")) == set()
    client.force_login(alice)
    client.get("/api/items/", REMOTE_ADDR=ADDRESS)
    seen = rules_of(client, path="/api/items/")
    assert set(seen) == {"per-user", "gold"}
    assert (seen["per-user"]["limit"], seen["per-user"]["remaining"]) == (20, 19)
    assert seen["per-user"]["policy"] == '"per-user";q=20;w=60'  # the client's own limit
    assert seen["gold"]["remaining"] == 49


def test_one_store_call(client: Any, store_calls: Any) -> None:
    for n in range(3):
        rule(f"r{n}", "/api/", 10 + n)
    rules_of(client, path="/api/items/")  # rules loaded, connection made
    store_calls.decisions = 0
    assert len(rules_of(client, path="/api/items/")) == 3
    assert store_calls.decisions == 1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"path": "api/items/"}, "path must be a URL path"),
        ({"path": "/" + "a" * 3000}, "path must be a URL path"),
        ({"path": "/api/\x00/"}, "control characters"),
        ({"path": "/%ff/"}, "UTF-8"),
        ({"method": "BREW"}, "method must be one of GET"),
        ({"method": ""}, "method must be one of GET"),
    ],
)
def test_bad_parameters_are_a_400_that_says_why(
    client: Any, params: dict[str, str], message: str
) -> None:
    rule("api", "/api/", 3)
    response = status(client, **params)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert message in response.json()["error"]


def test_only_get_and_head(client: Any) -> None:
    assert client.post(STATUS).status_code == 405
    assert client.head(STATUS).status_code == 200


def test_a_query_string_in_the_path_reaches_a_param_key(client: Any) -> None:
    rule("per-q", "/search/", 5, key_kind="param", key_arg="q")
    client.get("/search/", {"q": "cats"})
    entries = rules_of(client, path="/search/?q=cats")
    assert entries["per-q"]["remaining"] == 4
    assert rules_of(client, path="/search/?q=dogs")["per-q"]["remaining"] == 5


def test_store_down_answers_by_the_fail_mode(
    client: Any, settings: Any, redis_server: RedisServer
) -> None:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIMEOUT": 0.5}
    rule("open", "/api/", 5, fail_mode="open")
    rule("closed", "/users/", 5, fail_mode="closed")
    rules_of(client, path="/api/items/")
    redis_server.kill()
    try:
        opened = status(client, path="/api/items/")
        closed = status(client, path="/users/1/")
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "LOCAL_FALLBACK": False}
        unknown = status(client, path="/api/items/")
    finally:
        redis_server.start()
    # Fail open: the local fallback's figures, as the request itself would be decided.
    assert opened.status_code == 200
    assert [(e["name"], e["remaining"]) for e in opened.json()["rules"]] == [("open", 5)]
    assert closed.status_code == 503
    assert closed.json()["error"] == "The rate-limit store is unavailable."
    assert int(closed["Retry-After"]) >= 1
    # Fail open without a fallback: the rule and its limit, what remains unknown.
    assert unknown.status_code == 200
    assert unknown.json()["rules"] == [
        {"name": "open", "limit": 5, "remaining": None, "reset": None, "policy": '"open";q=5;w=60'}
    ]


def test_status_responses_are_not_cached(client: Any) -> None:
    response = status(client)
    assert "no-store" in response["Cache-Control"]
