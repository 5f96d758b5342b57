"""The SaaS plan table of docs/usage.md ("Who a rule applies to"), run as written: each kind of
client is counted by its plan's rules only, with the documented limits and windows."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from django_throttle.models import Override, Rule
from django_throttle.state_keys import base36, client_tag
from tests.helpers import window_keys

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

PATH = "/api/items/"


@pytest.fixture
def plans(django_capture_on_commit_callbacks: Any) -> dict[str, Any]:
    """The table: rules per plan, exempt_staff on each, one customer's override."""
    groups = {name: Group.objects.create(name=name) for name in ("free", "pro", "enterprise")}
    table = [
        ("api-anonymous", None, "ip", 60, "hour", "sliding_window_counter"),
        ("api-free", "free", "user", 10_000, "month", "fixed_window"),
        ("api-pro-rate", "pro", "user", 100, "minute", "token_bucket"),
        ("api-pro", "pro", "user", 1_000_000, "month", "fixed_window"),
        ("api-enterprise", "enterprise", "user", 1_000, "minute", "sliding_window_counter"),
    ]
    rules = {}
    with django_capture_on_commit_callbacks(execute=True):
        for name, group, key, limit, unit, algorithm in table:
            made = Rule.objects.create(
                name=name,
                scope="/api/",
                applies_to="anonymous" if group is None else "groups",
                key_kind=key,
                limit=limit,
                unit=unit,
                algorithm=algorithm,
                exempt_staff=True,
            )
            if group is not None:
                made.groups.set([groups[group]])
            rules[name] = made
        customer = User.objects.create_user("customer", password="pw", pk=42)
        customer.groups.set([groups["enterprise"]])
        Override.objects.create(rule=rules["api-enterprise"], key="user:42", limit=5000)
    return {"groups": groups, "rules": rules}


def member(name: str, group: Group, *, staff: bool = False) -> User:
    made = User.objects.create_user(name, password="pw", is_staff=staff)
    made.groups.set([group])
    return made


def next_month_utc() -> int:
    now = datetime.now(timezone.utc)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return int(datetime(year, month, 1, tzinfo=timezone.utc).timestamp())


def count_of(redis_client: Any, rule: Rule, identity: str) -> int:
    """A calendar window's count in Redis: the integer at ``<state key>:<window start>``."""
    keys = redis_client.keys(f"thr:{base36(rule.pk)}f:{client_tag(identity)}:*")
    assert len(keys) <= 1, keys  # the month's own key only
    return sum(int(redis_client.get(k)) for k in keys)


def test_anonymous_clients_get_60_an_hour(client: Any, plans: dict[str, Any]) -> None:
    responses = [client.get(PATH) for _ in range(61)]
    assert [r.status_code for r in responses] == [200] * 60 + [429]
    assert responses[0]["RateLimit-Policy"] == '"api-anonymous";q=60;w=3600'


def test_a_free_user_has_a_monthly_quota(
    client: Any, plans: dict[str, Any], redis_client: Any
) -> None:
    user = member("freeloader", plans["groups"]["free"])
    client.force_login(user)
    responses = [client.get(PATH) for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert responses[-1]["X-RateLimit-Limit"] == "10000"
    assert responses[-1]["X-RateLimit-Remaining"] == "9997"
    assert responses[-1]["X-RateLimit-Reset"] == str(next_month_utc())
    assert count_of(redis_client, plans["rules"]["api-free"], f"user:{user.pk}") == 3


def test_a_pro_user_is_counted_by_both_pro_rules(
    client: Any, plans: dict[str, Any], redis_client: Any
) -> None:
    user = member("payer", plans["groups"]["pro"])
    client.force_login(user)
    response = client.get(PATH)
    # The rule closest to rejecting: 99 of 100 a minute, not 999,999 of a million a month.
    assert (response["X-RateLimit-Limit"], response["X-RateLimit-Remaining"]) == ("100", "99")
    assert count_of(redis_client, plans["rules"]["api-pro"], f"user:{user.pk}") == 1
    assert count_of(redis_client, plans["rules"]["api-free"], f"user:{user.pk}") == 0


def test_the_customer_with_a_contract_gets_5000_a_minute(
    client: Any, plans: dict[str, Any]
) -> None:
    client.force_login(User.objects.get(pk=42))
    assert client.get(PATH)["X-RateLimit-Limit"] == "5000"
    other = member("other-enterprise", plans["groups"]["enterprise"])
    client.force_login(other)
    assert client.get(PATH)["X-RateLimit-Limit"] == "1000"


def test_staff_are_counted_by_no_plan(
    client: Any, plans: dict[str, Any], redis_client: Any
) -> None:
    client.force_login(member("operator", plans["groups"]["free"], staff=True))
    responses = [client.get(PATH) for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert "X-RateLimit-Limit" not in responses[-1]
    # No client state at all: no state key, no window's key.
    assert redis_client.keys("thr:*}") == [] and window_keys(redis_client) == []
