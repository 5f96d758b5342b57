"""Overrides for one client: its own limit on a rule, or an exemption, edited in the admin and
loaded with the rules (no query per request)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from django_throttle.models import Override
from tests.helpers import rule, window_keys

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

PARTNER, BLOCKED_OFFICE, ANYONE = "203.0.113.7", "198.51.100.9", "192.0.2.1"


def statuses_from(client: Any, address: str, times: int) -> list[int]:
    return [client.get("/api/items/", REMOTE_ADDR=address).status_code for _ in range(times)]


def test_a_client_gets_its_own_limit_or_is_exempt(
    client: Any, redis_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 2, algorithm="fixed_window")
    with django_capture_on_commit_callbacks(execute=True):
        Override.objects.create(rule=api, key=f"ip:{PARTNER}", limit=5)
        Override.objects.create(rule=api, key=f"ip:{BLOCKED_OFFICE}", exempt=True)
    assert statuses_from(client, ANYONE, 3) == [200, 200, 429]
    assert statuses_from(client, PARTNER, 6) == [200] * 5 + [429]
    assert statuses_from(client, BLOCKED_OFFICE, 10) == [200] * 10
    response = client.get("/api/items/", REMOTE_ADDR=PARTNER)
    assert response["X-RateLimit-Limit"] == "5"  # the client's own limit, in its headers
    assert len(window_keys(redis_client)) == 2  # the exempt client has no state at all


def test_overrides_cost_no_query_per_request(
    client: Any, django_assert_num_queries: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 100)
    with django_capture_on_commit_callbacks(execute=True):
        Override.objects.create(rule=api, key=f"ip:{PARTNER}", limit=500)
    client.get("/api/items/", REMOTE_ADDR=PARTNER)  # rules and overrides loaded
    with django_assert_num_queries(0):
        for _ in range(5):
            client.get("/api/items/", REMOTE_ADDR=PARTNER)


def test_a_changed_override_is_in_force_at_once(
    client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 1)
    assert statuses_from(client, PARTNER, 2) == [200, 429]
    with django_capture_on_commit_callbacks(execute=True):
        override = Override.objects.create(rule=api, key=f"ip:{PARTNER}", exempt=True)
    assert statuses_from(client, PARTNER, 3) == [200, 200, 200]
    with django_capture_on_commit_callbacks(execute=True):
        override.delete()
    assert statuses_from(client, PARTNER, 1) == [429]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"key": "ip:203.0.113.7", "limit": 5, "exempt": True}, "limit"),
        ({"key": "ip:203.0.113.7"}, "limit"),
        ({"key": "somebody", "limit": 5}, "key"),
        ({"key": "ip:not-an-address", "limit": 5}, "key"),
        ({"key": "user:42", "limit": 0}, "limit"),
    ],
)
def test_an_invalid_override_is_refused(fields: dict[str, Any], field: str) -> None:
    api = rule("api", "/api/", 1)
    with pytest.raises(ValidationError) as refused:
        Override.objects.create(rule=api, **fields)
    assert field in refused.value.message_dict


def test_an_override_broken_with_sql_is_skipped_not_its_rule(
    client: Any, admin_client: Any, caplog: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.db import connection

    api = rule("api", "/api/", 2)
    with django_capture_on_commit_callbacks(execute=True):
        bad = Override.objects.create(rule=api, key=f"ip:{PARTNER}", limit=5)
    with connection.cursor() as cursor:
        table = connection.ops.quote_name(Override._meta.db_table)
        cursor.execute(f'UPDATE {table} SET "limit" = 0 WHERE id = %s', [bad.pk])
    with django_capture_on_commit_callbacks(execute=True):
        Override.objects.create(rule=api, key="user:1", exempt=True)  # any change reloads
    assert statuses_from(client, PARTNER, 3) == [200, 200, 429]  # the rule's own limit
    assert any("override of rule 'api'" in r.getMessage() for r in caplog.records)
    listing = admin_client.get("/admin/django_throttle/rule/").content.decode()
    assert "overrides skipped" in listing
    with pytest.raises(ValidationError):
        Override.objects.filter(pk=bad.pk).update(limit=0)


def test_two_inline_rows_for_one_client_are_a_form_error(admin_client: Any) -> None:
    api = rule("api", "/api/", 1)
    data = {
        "name": "api",
        "enabled": "on",
        "scope": "/api/",
        "methods": "",
        "key_kind": "ip",
        "key_arg": "",
        "limit": "1",
        "per": "1",
        "unit": "minute",
        "algorithm": "sliding_window_counter",
        "burst": "",
        "block_seconds": "0",
        "block_growth": "1",
        "applies_to": "all",
        "exempt_networks": "",
        "action": "reject",
        "fail_mode": "default",
        "overrides-TOTAL_FORMS": "2",
        "overrides-INITIAL_FORMS": "0",
        "overrides-MIN_NUM_FORMS": "0",
        "overrides-MAX_NUM_FORMS": "1000",
        "overrides-0-key": "ip:2001:db8::1",
        "overrides-0-limit": "5",
        "overrides-1-key": "ip:2001:db8::2",
        "overrides-1-limit": "6",
        "_save": "Save",
    }
    response = admin_client.post(f"/admin/django_throttle/rule/{api.pk}/change/", data)
    assert response.status_code == 200
    assert "Two overrides are for the client ip:2001:db8::/64." in response.content.decode()
    assert not Override.objects.exists()


def test_without_redis_an_override_change_moves_the_rules_version(settings: Any) -> None:
    from django_throttle.rules.cache import DatabaseVersion

    api = rule("api", "/api/", 1)
    before = DatabaseVersion().read()
    Override.objects.create(rule=api, key="user:7", limit=3)
    assert DatabaseVersion().read() != before


def test_an_ipv6_key_is_stored_as_identities_key_it() -> None:
    api = rule("api", "/api/", 1)
    override = Override.objects.create(rule=api, key="ip:2001:db8::1234", limit=9)
    assert override.key == "ip:2001:db8::/64"


def test_overrides_are_edited_inline_on_the_rule_and_on_their_own_page(
    admin_client: Any,
) -> None:
    api = rule("api", "/api/", 1)
    page = admin_client.get(f"/admin/django_throttle/rule/{api.pk}/change/").content.decode()
    assert 'name="overrides-TOTAL_FORMS"' in page
    Override.objects.create(rule=api, key="user:42", limit=10)
    listing = admin_client.get("/admin/django_throttle/override/").content.decode()
    assert "user:42" in listing
